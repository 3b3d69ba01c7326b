"""Part of benches/bench_core.py: the Rust encodings against their plain-Python twins.

The job envelope (encode, decode, peek the id, bump the attempts), job state strings
(parse, format) and the Redis event messages (``decode_events``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from trioqueue import _core

from core_timing import Table, ops_per_s


# ---------------------------------------------------------------- envelope

PAYLOAD = json.dumps(
    {"task": "send_welcome_email", "user_id": 1234567, "email": "alice@example.com", "locale": "en-GB"},
    separators=(",", ":"),
).encode()
FIELDS = ("01J9Z3K4M5N6P7Q8R9S0T1U2V3", PAYLOAD, 1_732_000_000_123, 1, 5, 86_400_000, "req-7f3a9c", None)


def py_encode_envelope(
    id: str,
    payload: bytes,
    created_at_ms: int,
    attempts: int,
    max_attempts: int,
    result_ttl_ms: int,
    correlation_id: str | None = None,
    options: bytes | None = None,
) -> bytes:
    return json.dumps(
        {
            "v": 1,
            "id": id,
            "payload": base64.b64encode(payload).decode("ascii"),
            "created_at_ms": created_at_ms,
            "attempts": attempts,
            "max_attempts": max_attempts,
            "result_ttl_ms": result_ttl_ms,
            "correlation_id": correlation_id,
            "options": None if options is None else base64.b64encode(options).decode("ascii"),
        }
    ).encode()


def py_decode_envelope(data: bytes) -> tuple[str, bytes, int, int, int, int, str | None, bytes | None]:
    d = json.loads(data)
    return (
        d["id"],
        base64.b64decode(d["payload"]),
        d["created_at_ms"],
        d["attempts"],
        d["max_attempts"],
        d["result_ttl_ms"],
        d["correlation_id"],
        None if d["options"] is None else base64.b64decode(d["options"]),
    )


def py_envelope_with_attempts(data: bytes, attempts: int) -> bytes:
    d = json.loads(data)
    d["attempts"] = attempts
    return json.dumps(d).encode()


def bench_envelope(t: Table, rounds: int, n: int) -> None:
    rs_data = _core.encode_envelope(*FIELDS)
    py_data = py_encode_envelope(*FIELDS)
    assert _core.decode_envelope(rs_data) == py_decode_envelope(py_data) == FIELDS
    rng = range(n)

    def enc(f: Callable[..., bytes]) -> Callable[[], int]:
        a, b, c, d, e, g, h, _ = FIELDS

        def run() -> int:
            for _ in rng:
                f(a, b, c, d, e, g, h)
            return n

        return run

    def one_arg(f: Callable[..., object], data: bytes, *extra: object) -> Callable[[], int]:
        def run() -> int:
            for _ in rng:
                f(data, *extra)
            return n

        return run

    t.add("envelope", "encode", ops_per_s(enc(_core.encode_envelope), rounds), "json+base64 dumps", ops_per_s(enc(py_encode_envelope), rounds))
    t.add("envelope", "decode", ops_per_s(one_arg(_core.decode_envelope, rs_data), rounds), "json+base64 loads", ops_per_s(one_arg(py_decode_envelope, py_data), rounds))
    t.add(
        "envelope",
        "envelope_id (peek id)",
        ops_per_s(one_arg(_core.envelope_id, rs_data), rounds),
        'json.loads(data)["id"]',
        ops_per_s(one_arg(lambda d: json.loads(d)["id"], py_data), rounds),
    )
    t.add(
        "envelope",
        "envelope_with_attempts",
        ops_per_s(one_arg(_core.envelope_with_attempts, rs_data, 2), rounds),
        "json loads+dumps",
        ops_per_s(one_arg(py_envelope_with_attempts, py_data, 2), rounds),
    )
    print(f"          (envelope sizes: rust {len(rs_data)} bytes, json {len(py_data)} bytes)")


# ------------------------------------------------------------------- state

STATES = [
    "queued:1732000000123",
    "processing:1732000000123:worker-host-1:4242",
    "failing:1732000000123:3",
    "completed:1732000000123",
    "failed:1732000000123",
]
_NO_EXTRA = frozenset(("queued", "completed", "failed"))


def py_parse_state(s: str) -> tuple[str, int, str | int | None]:
    parts = s.split(":", 2)
    kind = parts[0]
    if kind in _NO_EXTRA:
        if len(parts) != 2:
            raise ValueError(f"invalid job state {s!r}")
        return kind, int(parts[1]), None
    if len(parts) != 3:
        raise ValueError(f"invalid job state {s!r}")
    if kind == "processing":
        if not parts[2]:
            raise ValueError(f"invalid job state {s!r}")
        return kind, int(parts[1]), parts[2]
    if kind == "failing":
        return kind, int(parts[1]), int(parts[2])
    raise ValueError(f"invalid job state {s!r}")


def py_format_state(kind: str, ms: int, extra: str | int | None = None) -> str:
    if type(ms) is not int or ms < 0:
        raise ValueError("bad ms")
    if kind in _NO_EXTRA:
        if extra is not None:
            raise ValueError("no extra expected")
        return f"{kind}:{ms}"
    if kind == "processing":
        if type(extra) is not str or not extra:
            raise ValueError("worker id needed")
        return f"{kind}:{ms}:{extra}"
    if kind == "failing":
        if type(extra) is not int or extra < 0:
            raise ValueError("attempts needed")
        return f"{kind}:{ms}:{extra}"
    raise ValueError(f"unknown kind {kind!r}")


def bench_state(t: Table, rounds: int, n: int) -> None:
    parsed = [py_parse_state(s) for s in STATES]
    assert [_core.parse_state(s) for s in STATES] == parsed
    assert [_core.format_state(*p) for p in parsed] == [py_format_state(*p) for p in parsed] == STATES
    loops = range(n // len(STATES))
    count = len(loops) * len(STATES)

    def parse(f: Callable[[str], object]) -> Callable[[], int]:
        s0, s1, s2, s3, s4 = STATES

        def run() -> int:
            for _ in loops:
                f(s0)
                f(s1)
                f(s2)
                f(s3)
                f(s4)
            return count

        return run

    def format_(f: Callable[..., str]) -> Callable[[], int]:
        p0, p1, p2, p3, p4 = parsed

        def run() -> int:
            for _ in loops:
                f(*p0)
                f(*p1)
                f(*p2)
                f(*p3)
                f(*p4)
            return count

        return run

    t.add("state", "parse_state (mix of 5 kinds)", ops_per_s(parse(_core.parse_state), rounds), "str.split + int()", ops_per_s(parse(py_parse_state), rounds))
    t.add("state", "format_state (mix of 5 kinds)", ops_per_s(format_(_core.format_state), rounds), "f-string + checks", ops_per_s(format_(py_format_state), rounds))


# ------------------------------------------------------------------ events


def py_decode_events(payload: bytes) -> list[tuple[str, str, str | None, bytes | None, bytes | None, str | None]]:
    """The plain-Python twin: the Redis backend's decoder before the Rust one."""
    out = []
    fields: list[bytes | None] = []
    i, n = 0, len(payload)
    while i < n:
        if payload[i] == 0x2D:  # '-'
            fields.append(None)
            i += 1
        else:
            c = payload.index(b":", i)
            size = int(payload[i:c])
            fields.append(payload[c + 1 : c + 1 + size])
            i = c + 1 + size
        if len(fields) == 6:
            kind, job_id, worker, result, error, token = fields
            out.append(
                (
                    (kind or b"").decode(),
                    (job_id or b"").decode(),
                    worker.decode() if worker is not None else None,
                    result,
                    error,
                    token.decode() if token is not None else None,
                )
            )
            fields = []
    return out


def _event_message(count: int) -> bytes:
    parts = []
    for i in range(count):
        kind, worker, result = ("completed", b"host:1234:abcd", b'{"ok":true,"n":%d}' % i) if i % 2 else ("enqueued", None, None)
        for f in (kind.encode(), f"job-{i:06}".encode(), worker, result, None, b"%012x-%x" % (i, i)):
            parts.append(b"-" if f is None else str(len(f)).encode() + b":" + f)
    return b"".join(parts)


def bench_events(t: Table, rounds: int, n: int) -> None:
    for size in (1, 100):
        msg = _event_message(size)
        assert _core.decode_events(msg) == py_decode_events(msg)
        loops = range(max(1, n // size))

        def run(f: Callable[[bytes], object]) -> Callable[[], int]:
            def go() -> int:
                for _ in loops:
                    f(msg)
                return len(loops) * size

            return go

        t.add(
            "events",
            f"decode_events, {size} event(s) per message",
            ops_per_s(run(_core.decode_events), rounds),
            "index/slice/int/decode loop",
            ops_per_s(run(py_decode_events), rounds),
        )
