//! The event-stream wire format published by the Redis backend's Lua scripts.
//!
//! One message carries any number of events; each event is six fields (kind, job id,
//! worker id, result, error, incarnation token) and each field is either `-` (absent) or
//! `<decimal length>:<bytes>`. Decoding never panics: malformed input is an
//! [`EventsError`] naming the offset.

use std::fmt;

/// The fields of one event; `None` where the field was `-`.
pub type Fields<'a> = [Option<&'a [u8]>; 6];

/// Malformed event-stream message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsError {
    pub offset: usize,
    pub reason: &'static str,
}

impl fmt::Display for EventsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed event message at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for EventsError {}

fn field(data: &[u8], pos: &mut usize) -> Result<Option<(usize, usize)>, EventsError> {
    let start = *pos;
    let err = |reason| EventsError {
        offset: start,
        reason,
    };
    match data.get(start) {
        None => Err(err("truncated event")),
        Some(b'-') => {
            *pos = start + 1;
            Ok(None)
        }
        Some(_) => {
            let mut len: usize = 0;
            let mut i = start;
            loop {
                match data.get(i) {
                    Some(b':') if i > start => break,
                    Some(&d) if d.is_ascii_digit() && i - start < 19 => {
                        len = len * 10 + usize::from(d - b'0');
                        i += 1;
                    }
                    Some(_) => return Err(err("expected '-' or '<length>:'")),
                    None => return Err(err("truncated length")),
                }
            }
            let begin = i + 1;
            let end = begin
                .checked_add(len)
                .ok_or_else(|| err("length overflows"))?;
            if end > data.len() {
                return Err(err("field runs past the end"));
            }
            *pos = end;
            Ok(Some((begin, end)))
        }
    }
}

/// Splits a message into events.
pub fn decode(data: &[u8]) -> Result<Vec<Fields<'_>>, EventsError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let mut ev: Fields<'_> = [None; 6];
        for slot in ev.iter_mut() {
            *slot = field(data, &mut pos)?.and_then(|(b, e)| data.get(b..e));
        }
        out.push(ev);
    }
    Ok(out)
}

/// Encodes events in the same format (the scripts' `ns()`), for tests and other writers.
pub fn encode(events: &[Fields<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for ev in events {
        for f in ev {
            match f {
                None => out.push(b'-'),
                Some(bytes) => {
                    out.extend_from_slice(bytes.len().to_string().as_bytes());
                    out.push(b':');
                    out.extend_from_slice(bytes);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let evs: Vec<Fields<'_>> = vec![
            [
                Some(b"completed"),
                Some(b"job:1"),
                Some(b"w:1"),
                Some(b"{\"a\":1}"),
                None,
                Some(b"tok-1"),
            ],
            [Some(b"enqueued"), Some(b""), None, None, None, None],
            [
                Some(b"failed"),
                Some(b"x"),
                None,
                None,
                Some(b"12:-:\x00\xff"),
                Some(b"t"),
            ],
        ];
        let wire = encode(&evs);
        assert_eq!(decode(&wire).unwrap(), evs);
        assert!(decode(b"").unwrap().is_empty());
    }

    #[test]
    fn malformed_never_panics() {
        for bad in [
            &b"-"[..],
            b"------x",
            b"5:ab",
            b"3ab-",
            b":------",
            b"99999999999999999999:x-----",
            b"18446744073709551615:x-----",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        let wire = encode(&[[
            Some(b"kind"),
            Some(b"id"),
            None,
            Some(b"result"),
            None,
            Some(b"t"),
        ]]);
        for cut in 1..wire.len() {
            assert!(
                decode(wire.get(..cut).unwrap()).is_err(),
                "truncated at {cut}"
            );
        }
        // deterministic garbage
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            for _ in 0..(x % 40) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(b"-:0123456789ab"[(x % 14) as usize]);
            }
            let _ = decode(&buf);
        }
    }
}
