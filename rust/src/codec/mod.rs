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
//!
//! The code is split by concern: this file holds the format constants and the
//! shared types, `encode` writes envelopes, `decode` reads and validates them
//! and `attempts` rewrites the attempts count of an encoded envelope in place.

use std::fmt;

mod attempts;
mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use attempts::{with_attempts, WithAttempts};
pub use decode::{decode, envelope_id};
pub use encode::{encode, encode_into, encoded_len, varint_len, BufferTooSmall};

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
