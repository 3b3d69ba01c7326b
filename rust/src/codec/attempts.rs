//! Rewriting the attempts count of an encoded envelope without re-encoding it.

use super::decode::decode_spans;
use super::encode::{write_varint, SliceWriter};
use super::{BufferTooSmall, CodecError, MAX_VARINT_LEN};

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
