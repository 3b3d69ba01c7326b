//! Unit tests of the envelope codec.

use super::encode::write_varint;
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
