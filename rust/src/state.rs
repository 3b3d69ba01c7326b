//! Job state strings (no Python dependency).
//!
//! ```text
//! queued:<ms>
//! processing:<ms>:<worker_id>      worker_id: non-empty, may contain ':'
//! failing:<ms>:<attempts>
//! delayed:<ms>:<due_ms>           enqueued to run at <due_ms>
//! completed:<ms>
//! failed:<ms>
//! cancelled:<ms>
//! ```
//!
//! `<ms>` and `<due_ms>` are u64 and `<attempts>` a u32, both written as plain ASCII
//! decimal digits.

use std::fmt;

/// The seven kinds of state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Queued,
    Processing,
    Failing,
    Completed,
    Failed,
    Cancelled,
    Delayed,
}

impl Kind {
    /// The kind's name as used in state strings.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Queued => "queued",
            Kind::Processing => "processing",
            Kind::Failing => "failing",
            Kind::Completed => "completed",
            Kind::Failed => "failed",
            Kind::Cancelled => "cancelled",
            Kind::Delayed => "delayed",
        }
    }

    /// Looks a kind up by name.
    pub fn from_name(name: &str) -> Option<Kind> {
        Some(match name {
            "queued" => Kind::Queued,
            "processing" => Kind::Processing,
            "failing" => Kind::Failing,
            "completed" => Kind::Completed,
            "failed" => Kind::Failed,
            "cancelled" => Kind::Cancelled,
            "delayed" => Kind::Delayed,
            _ => return None,
        })
    }
}

/// A parsed state, borrowing the worker id from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State<'a> {
    Queued { ms: u64 },
    Processing { ms: u64, worker_id: &'a str },
    Failing { ms: u64, attempts: u32 },
    Completed { ms: u64 },
    Failed { ms: u64 },
    Cancelled { ms: u64 },
    Delayed { ms: u64, due_ms: u64 },
}

impl State<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            State::Queued { .. } => Kind::Queued,
            State::Processing { .. } => Kind::Processing,
            State::Failing { .. } => Kind::Failing,
            State::Completed { .. } => Kind::Completed,
            State::Failed { .. } => Kind::Failed,
            State::Cancelled { .. } => Kind::Cancelled,
            State::Delayed { .. } => Kind::Delayed,
        }
    }

    pub fn ms(&self) -> u64 {
        match *self {
            State::Queued { ms }
            | State::Processing { ms, .. }
            | State::Failing { ms, .. }
            | State::Completed { ms }
            | State::Failed { ms }
            | State::Cancelled { ms }
            | State::Delayed { ms, .. } => ms,
        }
    }
}

/// Why a state string could not be parsed or a state could not be formatted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The string is not a valid state; `reason` says why.
    Invalid { input: String, reason: &'static str },
    /// The kind name is unknown.
    UnknownKind(String),
    /// Fields given to [`format_parts`] do not fit the kind.
    BadFields(String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Invalid { input, reason } => {
                write!(f, "invalid job state {input:?}: {reason}")
            }
            StateError::UnknownKind(kind) => write!(
                f,
                "unknown job state kind {kind:?} (expected one of queued, processing, \
                 failing, completed, failed, cancelled, delayed)"
            ),
            StateError::BadFields(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for StateError {}

/// Parses a non-empty run of ASCII digits into a u64 (no sign, no spaces).
#[inline]
fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for b in s.bytes() {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

/// Parses a state string.
pub fn parse(s: &str) -> Result<State<'_>, StateError> {
    let invalid = |reason: &'static str| StateError::Invalid {
        input: s.to_owned(),
        reason,
    };
    let (kind, rest) = s
        .split_once(':')
        .ok_or_else(|| invalid("expected '<kind>:<ms>...'"))?;
    let kind = Kind::from_name(kind).ok_or_else(|| invalid("unknown kind"))?;
    let bad_ms = "timestamp must be a non-negative integer of ASCII digits that fits in 64 bits";
    match kind {
        Kind::Queued | Kind::Completed | Kind::Failed | Kind::Cancelled => {
            let ms = parse_u64(rest).ok_or_else(|| invalid(bad_ms))?;
            Ok(match kind {
                Kind::Queued => State::Queued { ms },
                Kind::Completed => State::Completed { ms },
                Kind::Cancelled => State::Cancelled { ms },
                _ => State::Failed { ms },
            })
        }
        Kind::Processing => {
            let (ms, worker_id) = rest
                .split_once(':')
                .ok_or_else(|| invalid("expected 'processing:<ms>:<worker_id>'"))?;
            let ms = parse_u64(ms).ok_or_else(|| invalid(bad_ms))?;
            if worker_id.is_empty() {
                return Err(invalid("worker id must not be empty"));
            }
            Ok(State::Processing { ms, worker_id })
        }
        Kind::Failing => {
            let (ms, attempts) = rest
                .split_once(':')
                .ok_or_else(|| invalid("expected 'failing:<ms>:<attempts>'"))?;
            let ms = parse_u64(ms).ok_or_else(|| invalid(bad_ms))?;
            let attempts = parse_u64(attempts)
                .and_then(|a| u32::try_from(a).ok())
                .ok_or_else(|| {
                    invalid("attempts must be a non-negative integer of ASCII digits that fits in 32 bits")
                })?;
            Ok(State::Failing { ms, attempts })
        }
        Kind::Delayed => {
            let (ms, due) = rest
                .split_once(':')
                .ok_or_else(|| invalid("expected 'delayed:<ms>:<due_ms>'"))?;
            let ms = parse_u64(ms).ok_or_else(|| invalid(bad_ms))?;
            let due_ms = parse_u64(due).ok_or_else(|| invalid(bad_ms))?;
            Ok(State::Delayed { ms, due_ms })
        }
    }
}

/// Decimal digits of a u64, formatted without allocating.
#[derive(Clone, Copy)]
pub struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    #[inline]
    pub fn new(mut v: u64) -> Self {
        // Two digits per division, as in `itoa`.
        const PAIRS: &[u8; 200] = b"\
            0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let mut buf = [b'0'; 20];
        let mut start = buf.len();
        while v >= 10 && start >= 2 {
            let pair = (v % 100) as usize * 2;
            v /= 100;
            start -= 2;
            if let (Some(dst), Some(src)) =
                (buf.get_mut(start..start + 2), PAIRS.get(pair..pair + 2))
            {
                dst.copy_from_slice(src);
            }
        }
        if v > 0 || start == buf.len() {
            // One digit left (or the value was 0).
            start -= 1;
            if let Some(slot) = buf.get_mut(start) {
                *slot = b'0' + (v % 10) as u8;
            }
        }
        // (A pair is only taken while v >= 10, so the leading pair never
        // starts with '0'.)
        Digits { buf, start }
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

/// A state ready to be written as text without allocating: `kind:ms[:extra]`.
pub struct StateText<'a> {
    kind: &'static str,
    ms: Digits,
    extra: &'a [u8],
    extra_digits: Option<Digits>,
}

impl<'a> StateText<'a> {
    #[inline]
    pub fn new(state: &State<'a>) -> Self {
        let (extra, extra_digits) = match *state {
            State::Processing { worker_id, .. } => (worker_id.as_bytes(), None),
            State::Failing { attempts, .. } => (&[][..], Some(Digits::new(u64::from(attempts)))),
            State::Delayed { due_ms, .. } => (&[][..], Some(Digits::new(due_ms))),
            _ => (&[][..], None),
        };
        StateText {
            kind: state.kind().as_str(),
            ms: Digits::new(state.ms()),
            extra,
            extra_digits,
        }
    }

    #[inline]
    fn extra_bytes(&self) -> Option<&[u8]> {
        match &self.extra_digits {
            Some(d) => Some(d.as_bytes()),
            None if !self.extra.is_empty() => Some(self.extra),
            None => None,
        }
    }

    /// Length of the text in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.kind.len()
            + 1
            + self.ms.as_bytes().len()
            + self.extra_bytes().map_or(0, |e| 1 + e.len())
    }

    /// Always false; provided for clippy.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the text to the front of `out`; returns the written prefix as
    /// a `str`, or `None` if `out` is too small.
    #[inline]
    pub fn write_into<'b>(&self, out: &'b mut [u8]) -> Option<&'b str> {
        let mut pos = 0;
        let mut put = |bytes: &[u8]| -> Option<()> {
            let end = pos + bytes.len();
            out.get_mut(pos..end)?.copy_from_slice(bytes);
            pos = end;
            Some(())
        };
        put(self.kind.as_bytes())?;
        put(b":")?;
        put(self.ms.as_bytes())?;
        if let Some(extra) = self.extra_bytes() {
            put(b":")?;
            put(extra)?;
        }
        // Every piece is ASCII or a whole &str, so this always succeeds.
        std::str::from_utf8(out.get(..pos)?).ok()
    }

    /// The text as a new `String`.
    pub fn to_text(&self) -> String {
        let mut buf = vec![0u8; self.len()];
        let n = self.write_into(&mut buf).map_or(0, str::len);
        buf.truncate(n);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Formats a state.
pub fn format(state: &State<'_>) -> String {
    StateText::new(state).to_text()
}

/// The third field of a state, as given to [`format_parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra<'a> {
    None,
    Str(&'a str),
    Int(u64),
}

/// Builds and validates a state from loose parts (used by the Python layer).
pub fn from_parts<'a>(kind: &str, ms: u64, extra: Extra<'a>) -> Result<State<'a>, StateError> {
    let k = Kind::from_name(kind).ok_or_else(|| StateError::UnknownKind(kind.to_owned()))?;
    match (k, extra) {
        (Kind::Queued, Extra::None) => Ok(State::Queued { ms }),
        (Kind::Completed, Extra::None) => Ok(State::Completed { ms }),
        (Kind::Failed, Extra::None) => Ok(State::Failed { ms }),
        (Kind::Cancelled, Extra::None) => Ok(State::Cancelled { ms }),
        (Kind::Processing, Extra::Str(w)) if !w.is_empty() => {
            Ok(State::Processing { ms, worker_id: w })
        }
        (Kind::Processing, _) => Err(StateError::BadFields(
            "a 'processing' state needs a non-empty str worker id".to_owned(),
        )),
        (Kind::Failing, Extra::Int(a)) => match u32::try_from(a) {
            Ok(attempts) => Ok(State::Failing { ms, attempts }),
            Err(_) => Err(StateError::BadFields(format!(
                "a 'failing' state's attempts must fit in 32 bits, got {a}"
            ))),
        },
        (Kind::Failing, _) => Err(StateError::BadFields(
            "a 'failing' state needs an int attempts count".to_owned(),
        )),
        (Kind::Delayed, Extra::Int(due_ms)) => Ok(State::Delayed { ms, due_ms }),
        (Kind::Delayed, _) => Err(StateError::BadFields(
            "a 'delayed' state needs an int due time (ms)".to_owned(),
        )),
        (k, _) => Err(StateError::BadFields(format!(
            "a '{}' state takes no extra field (pass None)",
            k.as_str()
        ))),
    }
}

/// Formats a state from loose parts, validating them.
pub fn format_parts(kind: &str, ms: u64, extra: Extra<'_>) -> Result<String, StateError> {
    Ok(format(&from_parts(kind, ms, extra)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let cases = [
            State::Queued { ms: 0 },
            State::Queued { ms: u64::MAX },
            State::Processing {
                ms: 17,
                worker_id: "w1",
            },
            State::Processing {
                ms: 17,
                worker_id: "host:1234:abc",
            },
            State::Processing {
                ms: 17,
                worker_id: ":",
            },
            State::Processing {
                ms: 17,
                worker_id: "ü::x:",
            },
            State::Failing {
                ms: 99,
                attempts: 3,
            },
            State::Failing {
                ms: 99,
                attempts: u32::MAX,
            },
            State::Completed { ms: 5 },
            State::Failed { ms: 6 },
            State::Cancelled { ms: 7 },
            State::Delayed { ms: 8, due_ms: 0 },
            State::Delayed {
                ms: 8,
                due_ms: u64::MAX,
            },
        ];
        for st in cases {
            let s = format(&st);
            assert_eq!(parse(&s), Ok(st), "{s}");
        }
        assert_eq!(
            format(&State::Processing {
                ms: 1,
                worker_id: "a:b"
            }),
            "processing:1:a:b"
        );
    }

    #[test]
    fn digits() {
        for v in [
            0u64,
            1,
            7,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            1_732_000_000_123,
            u64::MAX - 1,
            u64::MAX,
        ]
        .into_iter()
        .chain((0..100_000).map(|i| i * 7919))
        {
            assert_eq!(Digits::new(v).as_bytes(), v.to_string().as_bytes());
        }
        let st = State::Processing {
            ms: 12,
            worker_id: "w:1",
        };
        let text = StateText::new(&st);
        let mut small = [0u8; 8];
        assert_eq!(text.write_into(&mut small), None);
        let mut big = [0u8; 64];
        assert_eq!(text.write_into(&mut big), Some("processing:12:w:1"));
        assert_eq!(text.len(), "processing:12:w:1".len());
    }

    #[test]
    fn parse_examples() {
        assert_eq!(parse("queued:123"), Ok(State::Queued { ms: 123 }));
        assert_eq!(
            parse("processing:5:w:x"),
            Ok(State::Processing {
                ms: 5,
                worker_id: "w:x"
            })
        );
        assert_eq!(
            parse("failing:5:2"),
            Ok(State::Failing { ms: 5, attempts: 2 })
        );
    }

    #[test]
    fn parse_rejects() {
        for bad in [
            "",
            "queued",
            "queued:",
            "queued:-1",
            "queued:+1",
            "queued: 1",
            "queued:1:",
            "queued:1:x",
            "queued:18446744073709551616",
            "Queued:1",
            "bogus:1",
            "processing:1",
            "processing:1:",
            "processing::w",
            "processing:x:w",
            "failing:1",
            "failing:1:",
            "failing:1:x",
            "failing:1:2:3",
            "failing:1:4294967296",
            "completed:1.5",
            "failed:١",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn from_parts_validates() {
        assert_eq!(
            format_parts("queued", 1, Extra::None).as_deref(),
            Ok("queued:1")
        );
        assert_eq!(
            format_parts("processing", 1, Extra::Str("a:b")).as_deref(),
            Ok("processing:1:a:b")
        );
        assert_eq!(
            format_parts("failing", 1, Extra::Int(2)).as_deref(),
            Ok("failing:1:2")
        );
        assert!(format_parts("processing", 1, Extra::Str("")).is_err());
        assert!(format_parts("processing", 1, Extra::None).is_err());
        assert!(format_parts("processing", 1, Extra::Int(1)).is_err());
        assert!(format_parts("failing", 1, Extra::Str("1")).is_err());
        assert!(format_parts("failing", 1, Extra::Int(1 << 32)).is_err());
        assert!(format_parts("queued", 1, Extra::Int(1)).is_err());
        assert!(format_parts("completed", 1, Extra::Str("x")).is_err());
        assert!(matches!(
            format_parts("nope", 1, Extra::None),
            Err(StateError::UnknownKind(_))
        ));
    }
}
