//! Envelope decoding: a bounds-checked reader that validates every field.

use super::{CodecError, Envelope, ENVELOPE_VERSION, TAG_CORRELATION_ID, TAG_OPTIONS};

/// Bounds-checked cursor over input bytes.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    #[inline]
    fn byte(&mut self, field: &'static str) -> Result<u8, CodecError> {
        let b = *self.data.get(self.pos).ok_or(CodecError::Truncated {
            field,
            offset: self.pos,
        })?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn varint(&mut self, field: &'static str) -> Result<u64, CodecError> {
        let start = self.pos;
        // Fast path: single byte.
        let first = self.byte(field)?;
        if first & 0x80 == 0 {
            return Ok(u64::from(first));
        }
        let mut value = u64::from(first & 0x7f);
        let mut shift = 7u32;
        loop {
            let b = self.byte(field)?;
            let group = u64::from(b & 0x7f);
            if shift == 63 && group > 1 {
                return Err(CodecError::Overflow {
                    field,
                    offset: start,
                });
            }
            value |= group << shift;
            if b & 0x80 == 0 {
                if b == 0 {
                    return Err(CodecError::Overlong {
                        field,
                        offset: start,
                    });
                }
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(CodecError::Overflow {
                    field,
                    offset: start,
                });
            }
        }
    }

    #[inline]
    fn varint_u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        let start = self.pos;
        let v = self.varint(field)?;
        u32::try_from(v).map_err(|_| CodecError::Overflow {
            field,
            offset: start,
        })
    }

    #[inline]
    fn bytes(&mut self, len: u64, field: &'static str) -> Result<&'a [u8], CodecError> {
        let start = self.pos;
        let truncated = CodecError::Truncated {
            field,
            offset: start,
        };
        let len = usize::try_from(len).map_err(|_| truncated.clone())?;
        let end = start.checked_add(len).ok_or_else(|| truncated.clone())?;
        let out = self.data.get(start..end).ok_or(truncated)?;
        self.pos = end;
        Ok(out)
    }

    #[inline]
    fn len_prefixed(&mut self, field: &'static str) -> Result<&'a [u8], CodecError> {
        let len = self.varint(field)?;
        self.bytes(len, field)
    }

    #[inline]
    fn utf8(&mut self, field: &'static str) -> Result<&'a str, CodecError> {
        let start = self.pos;
        let raw = self.len_prefixed(field)?;
        std::str::from_utf8(raw).map_err(|_| CodecError::InvalidUtf8 {
            field,
            offset: start,
        })
    }
}

/// Checks the version byte and returns a reader positioned after it.
#[inline]
fn open(data: &[u8]) -> Result<Reader<'_>, CodecError> {
    let version = *data.first().ok_or(CodecError::Empty)?;
    match version {
        0 => Err(CodecError::InvalidVersion(0)),
        ENVELOPE_VERSION => Ok(Reader { data, pos: 1 }),
        v => Err(CodecError::FutureVersion(v)),
    }
}

/// Decodes an envelope, borrowing the id, payload and correlation id from `data`.
pub fn decode(data: &[u8]) -> Result<Envelope<'_>, CodecError> {
    Ok(decode_spans(data)?.0)
}

/// Byte range of the attempts varint inside an envelope.
type Span = (usize, usize);

pub(super) fn decode_spans(data: &[u8]) -> Result<(Envelope<'_>, Span), CodecError> {
    let mut r = open(data)?;
    let created_at_ms = r.varint("created_at_ms")?;
    let attempts_start = r.pos;
    let attempts = r.varint_u32("attempts")?;
    let attempts_end = r.pos;
    let max_attempts = r.varint_u32("max_attempts")?;
    let result_ttl_ms = r.varint("result_ttl_ms")?;
    let id = r.utf8("id")?;
    let payload = r.len_prefixed("payload")?;
    let mut correlation_id = None;
    let mut options = None;
    while !r.at_end() {
        let tag_offset = r.pos;
        let tag = r.byte("field tag")?;
        match tag {
            0 => return Err(CodecError::ReservedTag { offset: tag_offset }),
            TAG_CORRELATION_ID => {
                let value = r.utf8("correlation_id")?;
                if correlation_id.replace(value).is_some() {
                    return Err(CodecError::DuplicateField {
                        field: "correlation_id",
                        offset: tag_offset,
                    });
                }
            }
            TAG_OPTIONS => {
                let value = r.len_prefixed("options")?;
                if options.replace(value).is_some() {
                    return Err(CodecError::DuplicateField {
                        field: "options",
                        offset: tag_offset,
                    });
                }
            }
            _ => {
                // Unknown optional field from a newer release: skip it.
                r.len_prefixed("optional field")?;
            }
        }
    }
    let env = Envelope {
        id,
        payload,
        created_at_ms,
        attempts,
        max_attempts,
        result_ttl_ms,
        correlation_id,
        options,
    };
    Ok((env, (attempts_start, attempts_end)))
}

/// Returns the id of an envelope (the whole envelope is still validated, but
/// nothing is copied).
pub fn envelope_id(data: &[u8]) -> Result<&str, CodecError> {
    Ok(decode(data)?.id)
}
