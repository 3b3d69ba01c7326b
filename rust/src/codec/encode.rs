//! Envelope encoding: LEB128 varints and the writer of format version 1.

use std::fmt;

use super::{Envelope, ENVELOPE_VERSION, MAX_VARINT_LEN, TAG_CORRELATION_ID, TAG_OPTIONS};

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
pub(super) struct SliceWriter<'b> {
    pub(super) buf: &'b mut [u8],
    pub(super) pos: usize,
}

impl SliceWriter<'_> {
    #[inline]
    pub(super) fn put(&mut self, bytes: &[u8]) -> Result<(), BufferTooSmall> {
        let end = self.pos.checked_add(bytes.len()).ok_or(BufferTooSmall)?;
        let dst = self.buf.get_mut(self.pos..end).ok_or(BufferTooSmall)?;
        dst.copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    #[inline]
    pub(super) fn put_varint(&mut self, v: u64) -> Result<(), BufferTooSmall> {
        let mut tmp = [0u8; MAX_VARINT_LEN];
        let n = write_varint(&mut tmp, v);
        self.put(tmp.get(..n).ok_or(BufferTooSmall)?)
    }
}

/// Writes the LEB128 encoding of `v` to `out`, returning its length.
#[inline]
pub(super) fn write_varint(out: &mut [u8; MAX_VARINT_LEN], mut v: u64) -> usize {
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
