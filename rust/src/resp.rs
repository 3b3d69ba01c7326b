//! RESP2, the Redis wire protocol, free of I/O (as h11 is for HTTP): commands are
//! encoded into a caller's buffer, replies are parsed incrementally from whatever bytes
//! arrived so far.
//!
//! Parsing never panics: input that is not RESP2 is a [`RespError`] naming the offset,
//! and the reader refuses replies nested deeper than [`MAX_DEPTH`] or bulk strings and
//! arrays longer than [`MAX_LEN`] (the server's own `proto-max-bulk-len` default).

use std::fmt;

/// Deepest array nesting accepted (a Lua script's reply is a few levels deep).
pub const MAX_DEPTH: usize = 64;
/// Longest bulk string or array accepted (512 MiB, Redis's default `proto-max-bulk-len`).
pub const MAX_LEN: i64 = 512 * 1024 * 1024;

/// One reply. `Bulk(None)` and `Array(None)` are RESP2's nulls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

/// Bytes that are not a RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RespError {
    pub offset: usize,
    pub reason: &'static str,
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed RESP reply at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for RespError {}

/// Appends the RESP encoding of one command (an array of bulk strings) to `out`.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    push_array_header(args.len(), out);
    for arg in args {
        push_bulk(arg.as_ref(), out);
    }
}

/// Appends the header of an array of `len` items (`*<len>\r\n`) to `out`.
pub fn push_array_header(len: usize, out: &mut Vec<u8>) {
    let mut itoa = itoa_buf();
    out.push(b'*');
    out.extend_from_slice(fmt_usize(&mut itoa, len));
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk string (`$<len>\r\n<arg>\r\n`) to `out`.
pub fn push_bulk(arg: &[u8], out: &mut Vec<u8>) {
    let mut itoa = itoa_buf();
    out.push(b'$');
    out.extend_from_slice(fmt_usize(&mut itoa, arg.len()));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

fn itoa_buf() -> [u8; 20] {
    [0u8; 20]
}

/// Formats `n` in decimal into `buf`, returning the digits.
fn fmt_usize(buf: &mut [u8; 20], mut n: usize) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(slot) = buf.get_mut(i) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    buf.get(i..).unwrap_or(&[])
}

/// An incremental reply parser: [`Reader::feed`] bytes as they arrive, take complete
/// replies with [`Reader::next_reply`].
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
    pos: usize,
    /// Offset of `buf[0]` in the whole stream (for error messages).
    consumed: usize,
}

/// A parse attempt that ran out of bytes.
struct Incomplete;

enum Step {
    Done(Value, usize),
    Incomplete,
}

impl Reader {
    pub fn new() -> Self {
        Reader::default()
    }

    /// Appends bytes received from the server.
    pub fn feed(&mut self, data: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.consumed += self.pos;
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 && self.pos * 2 > self.buf.len() {
            self.consumed += self.pos;
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes fed but not yet returned as a reply.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next complete reply, `Ok(None)` if more bytes are needed. After an error the
    /// stream is out of sync: the connection must be dropped.
    pub fn next_reply(&mut self) -> Result<Option<Value>, RespError> {
        let data = self.buf.get(self.pos..).unwrap_or(&[]);
        match parse(data, 0).map_err(|e| RespError {
            offset: e.offset + self.consumed + self.pos,
            reason: e.reason,
        })? {
            Step::Done(value, used) => {
                self.pos += used;
                Ok(Some(value))
            }
            Step::Incomplete => Ok(None),
        }
    }
}

/// The line starting at `data[0]` without its CRLF, and the length including it.
fn line(data: &[u8]) -> Result<Option<(&[u8], usize)>, RespError> {
    for (i, pair) in data.windows(2).enumerate() {
        if pair == b"\r\n" {
            return Ok(data.get(..i).map(|l| (l, i + 2)));
        }
    }
    Ok(None)
}

fn parse_int(text: &[u8], offset: usize) -> Result<i64, RespError> {
    let err = RespError {
        offset,
        reason: "bad integer",
    };
    let s = std::str::from_utf8(text).map_err(|_| err.clone())?;
    s.parse::<i64>().map_err(|_| err)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn parse(data: &[u8], depth: usize) -> Result<Step, RespError> {
    match parse_at(data, 0, depth) {
        Ok((v, used)) => Ok(Step::Done(v, used)),
        Err(Ok(Incomplete)) => Ok(Step::Incomplete),
        Err(Err(e)) => Err(e),
    }
}

type Parsed = Result<(Value, usize), Result<Incomplete, RespError>>;

/// Parses one value at `data[start..]`, returning it and the offset just past it.
fn parse_at(data: &[u8], start: usize, depth: usize) -> Parsed {
    let rest = data.get(start..).unwrap_or(&[]);
    let Some(&kind) = rest.first() else {
        return Err(Ok(Incomplete));
    };
    let (body, line_len) = match line(rest.get(1..).unwrap_or(&[])) {
        Ok(Some(l)) => l,
        Ok(None) => return Err(Ok(Incomplete)),
        Err(e) => return Err(Err(e)),
    };
    let after_line = start + 1 + line_len;
    match kind {
        b'+' => Ok((Value::Simple(text(body)), after_line)),
        b'-' => Ok((Value::Error(text(body)), after_line)),
        b':' => {
            let n = parse_int(body, start + 1).map_err(Err)?;
            Ok((Value::Int(n), after_line))
        }
        b'$' => {
            let n = parse_int(body, start + 1).map_err(Err)?;
            if n == -1 {
                return Ok((Value::Bulk(None), after_line));
            }
            let len = checked_len(n, start + 1).map_err(Err)?;
            let end = after_line.checked_add(len).ok_or(Ok(Incomplete))?;
            let Some(bytes) = data.get(after_line..end) else {
                return Err(Ok(Incomplete));
            };
            match data.get(end..end + 2) {
                None => return Err(Ok(Incomplete)),
                Some(b"\r\n") => {}
                Some(_) => {
                    return Err(Err(RespError {
                        offset: end,
                        reason: "bulk string not followed by CRLF",
                    }))
                }
            }
            // `end + 2` is in range: `data.get(end..end + 2)` matched two bytes
            Ok((Value::Bulk(Some(bytes.to_vec())), end + 2))
        }
        b'*' => {
            let n = parse_int(body, start + 1).map_err(Err)?;
            if n == -1 {
                return Ok((Value::Array(None), after_line));
            }
            let len = checked_len(n, start + 1).map_err(Err)?;
            if depth >= MAX_DEPTH {
                return Err(Err(RespError {
                    offset: start,
                    reason: "arrays nested too deep",
                }));
            }
            // never trust the announced length for the allocation: each element takes
            // at least 3 bytes, so more than the bytes at hand cannot be complete yet
            let available = data.len().saturating_sub(after_line) / 3;
            let mut items = Vec::with_capacity(len.min(available));
            let mut pos = after_line;
            for _ in 0..len {
                let (v, next) = parse_at(data, pos, depth + 1)?;
                items.push(v);
                pos = next;
            }
            Ok((Value::Array(Some(items)), pos))
        }
        _ => Err(Err(RespError {
            offset: start,
            reason: "unknown reply type",
        })),
    }
}

fn checked_len(n: i64, offset: usize) -> Result<usize, RespError> {
    if !(0..=MAX_LEN).contains(&n) {
        return Err(RespError {
            offset,
            reason: "length out of range",
        });
    }
    usize::try_from(n).map_err(|_| RespError {
        offset,
        reason: "length out of range",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(reader: &mut Reader) -> Vec<Value> {
        let mut out = vec![];
        while let Some(v) = reader.next_reply().unwrap() {
            out.push(v);
        }
        out
    }

    const SAMPLE: &[u8] = b"+OK\r\n-ERR bad thing\r\n:42\r\n:-7\r\n$5\r\nhe\r\no\r\n$-1\r\n*-1\r\n*0\r\n*3\r\n:1\r\n*2\r\n$1\r\nx\r\n$-1\r\n+PONG\r\n";

    fn expected() -> Vec<Value> {
        vec![
            Value::Simple("OK".into()),
            Value::Error("ERR bad thing".into()),
            Value::Int(42),
            Value::Int(-7),
            Value::Bulk(Some(b"he\r\no".to_vec())),
            Value::Bulk(None),
            Value::Array(None),
            Value::Array(Some(vec![])),
            Value::Array(Some(vec![
                Value::Int(1),
                Value::Array(Some(vec![
                    Value::Bulk(Some(b"x".to_vec())),
                    Value::Bulk(None),
                ])),
                Value::Simple("PONG".into()),
            ])),
        ]
    }

    #[test]
    fn parses_every_reply_type() {
        let mut r = Reader::new();
        r.feed(SAMPLE);
        assert_eq!(all(&mut r), expected());
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn split_at_every_byte_gives_the_same_replies() {
        for cut in 0..=SAMPLE.len() {
            let mut r = Reader::new();
            let (a, b) = SAMPLE.split_at(cut);
            r.feed(a);
            let mut got = all(&mut r);
            r.feed(b);
            got.extend(all(&mut r));
            assert_eq!(got, expected(), "cut at {cut}");
        }
    }

    #[test]
    fn byte_at_a_time_gives_the_same_replies() {
        let mut r = Reader::new();
        let mut got = vec![];
        for b in SAMPLE {
            r.feed(std::slice::from_ref(b));
            got.extend(all(&mut r));
        }
        assert_eq!(got, expected());
    }

    #[test]
    fn malformed_input_is_an_error_never_a_panic() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$-2\r\n",
            b"*-5\r\n",
            b"$3\r\nabcXY",
            b"$99999999999999999999\r\n",
            b"*600000000\r\n",
        ] {
            let mut r = Reader::new();
            r.feed(bad);
            assert!(r.next_reply().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut data = b"*1\r\n".repeat(MAX_DEPTH + 1);
        data.extend_from_slice(b":1\r\n");
        let mut r = Reader::new();
        r.feed(&data);
        let e = r.next_reply().unwrap_err();
        assert_eq!(e.reason, "arrays nested too deep");
    }

    #[test]
    fn huge_announced_array_does_not_allocate_it() {
        let mut r = Reader::new();
        r.feed(b"*500000000\r\n:1\r\n");
        assert_eq!(r.next_reply().unwrap(), None);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut data = vec![];
            let n = (state % 24) as usize;
            for _ in 0..n {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                data.push(b"+-:$*\r\n0123456789-ab"[(state % 20) as usize]);
            }
            let mut r = Reader::new();
            r.feed(&data);
            let _ = r.next_reply();
        }
    }

    #[test]
    fn error_offsets_count_from_the_start_of_the_stream() {
        let mut r = Reader::new();
        r.feed(b"+OK\r\n");
        assert_eq!(r.next_reply().unwrap(), Some(Value::Simple("OK".into())));
        r.feed(b"?\r\n");
        assert_eq!(r.next_reply().unwrap_err().offset, 5);
    }

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        let mut out = vec![];
        encode_command(&[&b"SET"[..], b"k", b"", b"0123456789"], &mut out);
        assert_eq!(
            out,
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$10\r\n0123456789\r\n"
        );
        let mut r = Reader::new();
        r.feed(&out);
        // a command is itself a valid RESP array
        assert!(matches!(r.next_reply().unwrap(), Some(Value::Array(Some(v))) if v.len() == 4));
    }
}
