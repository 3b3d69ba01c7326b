//! Binary job envelope codec (no Python dependency).
//!
//! Layout of format version 1:
//!
//! ```text
//! u8      version (= 1)
//! varint  created_at_ms      (u64)
//! varint  attempts           (u32)
//! varint  max_attempts       (u32)
//! varint  result_ttl_ms      (u64)
//! varint  id length, then the id bytes (UTF-8)
//! varint  payload length, then the payload bytes
//! then zero or more optional TLV fields until the end of the data:
//!   u8 tag, varint length, `length` bytes of value
//!   tag 1 = correlation_id (UTF-8); tag 2 = options (opaque bytes: per-job
//!   settings the Python layer serializes); tag 0 is reserved (invalid);
//!   any other tag is skipped so that later releases can add fields
//!   (priority, run-at, ...) without bumping the format version.
//! ```
//!
//! Varints are unsigned LEB128 and must be minimal (no redundant trailing
//! zero groups) so every envelope has exactly one encoding.
//!
//! Decoding never panics: every read is bounds-checked and every failure is
//! reported as a [`CodecError`].

use std::fmt;

/// Highest envelope format version this build understands (and the one it writes).
pub const ENVELOPE_VERSION: u8 = 1;

/// TLV tag of the optional correlation id.
pub const TAG_CORRELATION_ID: u8 = 1;

/// TLV tag of the optional per-job options (opaque bytes).
pub const TAG_OPTIONS: u8 = 2;

/// Longest LEB128 encoding of a u64.
const MAX_VARINT_LEN: usize = 10;

/// Why an envelope could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The input was empty.
    Empty,
    /// The version byte is 0 (never written by any release).
    InvalidVersion(u8),
    /// The envelope was written by a newer trioqueue.
    FutureVersion(u8),
    /// The data ended in the middle of `field`.
    Truncated { field: &'static str, offset: usize },
    /// A varint used more than 10 bytes or does not fit its field.
    Overflow { field: &'static str, offset: usize },
    /// A varint was not minimally encoded.
    Overlong { field: &'static str, offset: usize },
    /// A text field was not valid UTF-8.
    InvalidUtf8 { field: &'static str, offset: usize },
    /// A TLV field used the reserved tag 0.
    ReservedTag { offset: usize },
    /// A known TLV field appeared twice.
    DuplicateField { field: &'static str, offset: usize },
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Empty => write!(f, "empty envelope"),
            CodecError::InvalidVersion(v) => {
                write!(f, "invalid envelope format version {v}")
            }
            CodecError::FutureVersion(v) => write!(
                f,
                "envelope format version {v} is newer than this trioqueue understands \
                 (max {ENVELOPE_VERSION}); upgrade trioqueue"
            ),
            CodecError::Truncated { field, offset } => {
                write!(
                    f,
                    "truncated envelope: data ends inside {field} (at byte {offset})"
                )
            }
            CodecError::Overflow { field, offset } => {
                write!(
                    f,
                    "corrupt envelope: {field} at byte {offset} is out of range"
                )
            }
            CodecError::Overlong { field, offset } => write!(
                f,
                "corrupt envelope: {field} at byte {offset} is an overlong varint"
            ),
            CodecError::InvalidUtf8 { field, offset } => {
                write!(
                    f,
                    "corrupt envelope: {field} at byte {offset} is not valid UTF-8"
                )
            }
            CodecError::ReservedTag { offset } => {
                write!(f, "corrupt envelope: reserved field tag 0 at byte {offset}")
            }
            CodecError::DuplicateField { field, offset } => {
                write!(
                    f,
                    "corrupt envelope: duplicate {field} field at byte {offset}"
                )
            }
        }
    }
}

impl std::error::Error for CodecError {}

/// A decoded (or to-be-encoded) envelope borrowing its text and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub id: &'a str,
    pub payload: &'a [u8],
    pub created_at_ms: u64,
    pub attempts: u32,
    pub max_attempts: u32,
    pub result_ttl_ms: u64,
    pub correlation_id: Option<&'a str>,
    pub options: Option<&'a [u8]>,
}

/// Number of bytes of the LEB128 encoding of `v`.
#[inline]
pub fn varint_len(v: u64) -> usize {
    // 1 byte per started group of 7 bits, at least one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Exact length of the encoding of `env`.
pub fn encoded_len(env: &Envelope<'_>) -> usize {
    let mut n = 1
        + varint_len(env.created_at_ms)
        + varint_len(u64::from(env.attempts))
        + varint_len(u64::from(env.max_attempts))
        + varint_len(env.result_ttl_ms)
        + varint_len(env.id.len() as u64)
        + env.id.len()
        + varint_len(env.payload.len() as u64)
        + env.payload.len();
    if let Some(cid) = env.correlation_id {
        n += 1 + varint_len(cid.len() as u64) + cid.len();
    }
    if let Some(opts) = env.options {
        n += 1 + varint_len(opts.len() as u64) + opts.len();
    }
    n
}

/// Error returned by [`encode_into`] when the output slice is too small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferTooSmall;

impl fmt::Display for BufferTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "output buffer too small for envelope")
    }
}

impl std::error::Error for BufferTooSmall {}

/// Bounds-checked cursor over an output slice.
struct SliceWriter<'b> {
    buf: &'b mut [u8],
    pos: usize,
}

impl SliceWriter<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<(), BufferTooSmall> {
        let end = self.pos.checked_add(bytes.len()).ok_or(BufferTooSmall)?;
        let dst = self.buf.get_mut(self.pos..end).ok_or(BufferTooSmall)?;
        dst.copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    #[inline]
    fn put_varint(&mut self, v: u64) -> Result<(), BufferTooSmall> {
        let mut tmp = [0u8; MAX_VARINT_LEN];
        let n = write_varint(&mut tmp, v);
        self.put(tmp.get(..n).ok_or(BufferTooSmall)?)
    }
}

/// Writes the LEB128 encoding of `v` to `out`, returning its length.
#[inline]
fn write_varint(out: &mut [u8; MAX_VARINT_LEN], mut v: u64) -> usize {
    let mut n = 0;
    for slot in out.iter_mut() {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        n += 1;
        if v == 0 {
            *slot = byte;
            break;
        }
        *slot = byte | 0x80;
    }
    n
}

/// Encodes `env` into the front of `out` and returns the number of bytes
/// written ([`encoded_len`] of them).
pub fn encode_into(env: &Envelope<'_>, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
    let mut w = SliceWriter { buf: out, pos: 0 };
    w.put(&[ENVELOPE_VERSION])?;
    w.put_varint(env.created_at_ms)?;
    w.put_varint(u64::from(env.attempts))?;
    w.put_varint(u64::from(env.max_attempts))?;
    w.put_varint(env.result_ttl_ms)?;
    w.put_varint(env.id.len() as u64)?;
    w.put(env.id.as_bytes())?;
    w.put_varint(env.payload.len() as u64)?;
    w.put(env.payload)?;
    if let Some(cid) = env.correlation_id {
        w.put(&[TAG_CORRELATION_ID])?;
        w.put_varint(cid.len() as u64)?;
        w.put(cid.as_bytes())?;
    }
    if let Some(opts) = env.options {
        w.put(&[TAG_OPTIONS])?;
        w.put_varint(opts.len() as u64)?;
        w.put(opts)?;
    }
    Ok(w.pos)
}

/// Encodes `env` into a new vector.
pub fn encode(env: &Envelope<'_>) -> Vec<u8> {
    let mut out = vec![0u8; encoded_len(env)];
    // encoded_len is exact, so this cannot fail; fall back to an empty
    // vector rather than panicking if it ever did.
    match encode_into(env, &mut out) {
        Ok(n) => {
            out.truncate(n);
            out
        }
        Err(BufferTooSmall) => Vec::new(),
    }
}

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

fn decode_spans(data: &[u8]) -> Result<(Envelope<'_>, Span), CodecError> {
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

/// Pieces of an envelope with its attempts replaced: `prefix`, the new
/// attempts varint (`varint[..varint_len]`) and `suffix`, to be concatenated.
/// Unknown optional fields are kept verbatim.
pub struct WithAttempts<'a> {
    pub prefix: &'a [u8],
    pub varint: [u8; MAX_VARINT_LEN],
    pub varint_len: usize,
    pub suffix: &'a [u8],
}

impl WithAttempts<'_> {
    /// Total encoded length.
    pub fn len(&self) -> usize {
        self.prefix.len() + self.varint_len + self.suffix.len()
    }

    /// Always false (an envelope is never empty); provided for clippy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the envelope to the front of `out`, returning the length written.
    pub fn write_into(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let mut w = SliceWriter { buf: out, pos: 0 };
        w.put(self.prefix)?;
        w.put(self.varint.get(..self.varint_len).ok_or(BufferTooSmall)?)?;
        w.put(self.suffix)?;
        Ok(w.pos)
    }

    /// Concatenates the pieces into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(self.prefix);
        out.extend(self.varint.iter().take(self.varint_len));
        out.extend_from_slice(self.suffix);
        out
    }
}

/// Validates `data` and prepares a copy with `attempts` replaced.
pub fn with_attempts(data: &[u8], attempts: u32) -> Result<WithAttempts<'_>, CodecError> {
    let (_, (start, end)) = decode_spans(data)?;
    let truncated = CodecError::Truncated {
        field: "attempts",
        offset: start,
    };
    let prefix = data.get(..start).ok_or_else(|| truncated.clone())?;
    let suffix = data.get(end..).ok_or(truncated)?;
    let mut varint = [0u8; MAX_VARINT_LEN];
    let varint_len = write_varint(&mut varint, u64::from(attempts));
    Ok(WithAttempts {
        prefix,
        varint,
        varint_len,
        suffix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope<'static> {
        Envelope {
            id: "job-7f3a",
            payload: br#"{"task":"send_email","to":"a@example.com"}"#,
            created_at_ms: 1_732_000_000_123,
            attempts: 2,
            max_attempts: 5,
            result_ttl_ms: 86_400_000,
            correlation_id: Some("corr-1"),
            options: None,
        }
    }

    /// Small deterministic PRNG (xorshift64*), so no extra dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[test]
    fn varint_len_matches_encoding() {
        for v in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = [0u8; MAX_VARINT_LEN];
            assert_eq!(write_varint(&mut buf, v), varint_len(v), "{v}");
        }
        assert_eq!(varint_len(u64::MAX), 10);
    }

    #[test]
    fn round_trip() {
        let env = sample();
        let bytes = encode(&env);
        assert_eq!(bytes.len(), encoded_len(&env));
        assert_eq!(bytes.first(), Some(&1));
        assert_eq!(decode(&bytes), Ok(env));
        assert_eq!(envelope_id(&bytes), Ok("job-7f3a"));
    }

    #[test]
    fn round_trip_extremes() {
        let payload = vec![0xffu8; 300];
        for cid in [None, Some(""), Some("ü:ñ")] {
            for (a, b) in [(0u64, 0u32), (u64::MAX, u32::MAX), (127, 128)] {
                let env = Envelope {
                    id: "",
                    payload: &payload,
                    created_at_ms: a,
                    attempts: b,
                    max_attempts: b,
                    result_ttl_ms: a,
                    correlation_id: cid,
                    options: cid.map(str::as_bytes),
                };
                assert_eq!(decode(&encode(&env)), Ok(env));
            }
        }
    }

    #[test]
    fn random_round_trip() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2_000 {
            let id: String = (0..rng.next() % 20)
                .map(|_| char::from_u32((rng.next() % 0x3000) as u32).unwrap_or('x'))
                .collect();
            let payload: Vec<u8> = (0..rng.next() % 200).map(|_| rng.next() as u8).collect();
            let cid = format!("c{}", rng.next());
            let env = Envelope {
                id: &id,
                payload: &payload,
                created_at_ms: rng.next() >> (rng.next() % 64),
                attempts: (rng.next() >> 32) as u32,
                max_attempts: rng.next() as u32,
                result_ttl_ms: rng.next(),
                correlation_id: (rng.next() % 2 == 0).then_some(cid.as_str()),
                options: (rng.next() % 2 == 0).then_some(&payload[..]),
            };
            assert_eq!(decode(&encode(&env)), Ok(env));
        }
    }

    #[test]
    fn truncation_at_every_offset_fails() {
        for env in [
            sample(),
            Envelope {
                correlation_id: None,
                ..sample()
            },
        ] {
            let bytes = encode(&env);
            for cut in 0..bytes.len() {
                let prefix = bytes.get(..cut).unwrap_or_default();
                // Cutting right before the optional TLV yields a valid
                // envelope without the correlation id; every other cut fails.
                match decode(prefix) {
                    Ok(got) => {
                        assert!(env.correlation_id.is_some());
                        assert_eq!(
                            got,
                            Envelope {
                                correlation_id: None,
                                ..env
                            }
                        );
                    }
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut rng = Rng(42);
        let valid = encode(&sample());
        for i in 0..20_000 {
            let data: Vec<u8> = if i % 2 == 0 {
                (0..rng.next() % 64).map(|_| rng.next() as u8).collect()
            } else {
                // Flip a few bytes of a valid envelope.
                let mut d = valid.clone();
                for _ in 0..=(rng.next() % 3) {
                    let idx = (rng.next() as usize) % d.len();
                    if let Some(b) = d.get_mut(idx) {
                        *b = rng.next() as u8;
                    }
                }
                d
            };
            if let Ok(env) = decode(&data) {
                // Anything accepted re-encodes to something that decodes equal.
                assert_eq!(decode(&encode(&env)), Ok(env));
            }
            let _ = envelope_id(&data);
            let _ = with_attempts(&data, 3);
        }
    }

    #[test]
    fn empty_and_versions() {
        assert_eq!(decode(b""), Err(CodecError::Empty));
        assert_eq!(decode(&[0]), Err(CodecError::InvalidVersion(0)));
        let mut bytes = encode(&sample());
        if let Some(v) = bytes.first_mut() {
            *v = 2;
        }
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, CodecError::FutureVersion(2));
        assert_eq!(
            err.to_string(),
            "envelope format version 2 is newer than this trioqueue understands (max 1); \
             upgrade trioqueue"
        );
    }

    #[test]
    fn overlong_and_overflowing_varints() {
        // created_at_ms = 0 encoded in two bytes.
        assert!(matches!(
            decode(&[1, 0x80, 0x00]),
            Err(CodecError::Overlong {
                field: "created_at_ms",
                ..
            })
        ));
        // 11-byte varint.
        let mut d = vec![1u8];
        d.extend([0xff; 10]);
        d.push(0x01);
        assert!(matches!(decode(&d), Err(CodecError::Overflow { .. })));
        // 10th byte carrying more than 1 bit.
        let mut d = vec![1u8];
        d.extend([0xff; 9]);
        d.push(0x02);
        assert!(matches!(decode(&d), Err(CodecError::Overflow { .. })));
        // attempts > u32::MAX.
        let d = [1u8, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0];
        assert!(matches!(
            decode(&d),
            Err(CodecError::Overflow {
                field: "attempts",
                ..
            })
        ));
        // u64::MAX itself is fine.
        let env = Envelope {
            created_at_ms: u64::MAX,
            ..sample()
        };
        assert_eq!(decode(&encode(&env)), Ok(env));
    }

    #[test]
    fn invalid_utf8() {
        let env = Envelope {
            id: "ab",
            correlation_id: Some("cd"),
            ..sample()
        };
        let bytes = encode(&env);
        let id_pos = bytes.windows(2).position(|w| w == b"ab").unwrap_or(0);
        let mut bad = bytes.clone();
        if let Some(b) = bad.get_mut(id_pos) {
            *b = 0xff;
        }
        assert!(matches!(
            decode(&bad),
            Err(CodecError::InvalidUtf8 { field: "id", .. })
        ));
        let cid_pos = bytes.len() - 2;
        let mut bad = bytes;
        if let Some(b) = bad.get_mut(cid_pos) {
            *b = 0xc3;
        }
        assert!(matches!(
            decode(&bad),
            Err(CodecError::InvalidUtf8 {
                field: "correlation_id",
                ..
            })
        ));
    }

    #[test]
    fn tlv_fields() {
        let env = Envelope {
            correlation_id: None,
            ..sample()
        };
        let base = encode(&env);
        // Unknown tags are skipped, before and after the correlation id.
        let mut d = base.clone();
        d.extend([7, 3, b'x', b'y', b'z', 1, 2, b'h', b'i', 200, 0]);
        assert_eq!(
            decode(&d),
            Ok(Envelope {
                correlation_id: Some("hi"),
                ..env
            })
        );
        // TLV length running past the end.
        let mut d = base.clone();
        d.extend([7, 5, b'x']);
        assert!(matches!(decode(&d), Err(CodecError::Truncated { .. })));
        // Tag without a length.
        let mut d = base.clone();
        d.push(9);
        assert!(matches!(decode(&d), Err(CodecError::Truncated { .. })));
        // Reserved tag.
        let mut d = base.clone();
        d.extend([0, 0]);
        assert!(matches!(decode(&d), Err(CodecError::ReservedTag { .. })));
        // Duplicate correlation id.
        let mut d = base.clone();
        d.extend([1, 1, b'a', 1, 1, b'b']);
        assert!(matches!(decode(&d), Err(CodecError::DuplicateField { .. })));
        // Options: opaque bytes, once.
        let mut d = base.clone();
        d.extend([2, 3, 0xff, 0, b'{']);
        assert_eq!(
            decode(&d),
            Ok(Envelope {
                options: Some(&[0xff, 0, b'{'][..]),
                ..env
            })
        );
        let mut d = base;
        d.extend([2, 0, 2, 0]);
        assert!(matches!(
            decode(&d),
            Err(CodecError::DuplicateField {
                field: "options",
                ..
            })
        ));
    }

    #[test]
    fn with_attempts_replaces_only_attempts() {
        let mut bytes = encode(&sample());
        bytes.extend([9, 2, 0xaa, 0xbb]); // unknown field must survive
        for attempts in [0u32, 1, 127, 128, 300, u32::MAX] {
            let w = with_attempts(&bytes, attempts).unwrap_or_else(|e| panic!("{e}"));
            let out = w.to_vec();
            let mut buf = vec![0u8; w.len()];
            assert_eq!(w.write_into(&mut buf), Ok(out.len()));
            assert_eq!(buf, out);
            assert!(out.ends_with(&[9, 2, 0xaa, 0xbb]));
            assert_eq!(
                decode(&out),
                Ok(Envelope {
                    attempts,
                    ..sample()
                })
            );
        }
        assert!(with_attempts(b"", 1).is_err());
        assert!(w_err(&[2, 0]));
    }

    fn w_err(d: &[u8]) -> bool {
        matches!(with_attempts(d, 1), Err(CodecError::FutureVersion(2)))
    }

    #[test]
    fn encode_into_small_buffer_errors() {
        let env = sample();
        let mut buf = vec![0u8; encoded_len(&env) - 1];
        assert_eq!(encode_into(&env, &mut buf), Err(BufferTooSmall));
    }
}
