"""Round-trip and robustness tests of the Rust extension ``trioqueue._core``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioqueue import _core

U64 = st.integers(min_value=0, max_value=2**64 - 1)
U32 = st.integers(min_value=0, max_value=2**32 - 1)
# Python str may hold lone surrogates, which are not valid UTF-8 text.
TEXT = st.text(st.characters(exclude_categories=["Cs"]))
ENVELOPES = st.tuples(TEXT, st.binary(), U64, U32, U32, U64, st.none() | TEXT, st.none() | st.binary(max_size=40))


def test_version() -> None:
    assert _core.ENVELOPE_VERSION == 1
    assert issubclass(_core.CodecError, ValueError)
    assert issubclass(_core.StateError, ValueError)


# --------------------------------------------------------------------- envelope


@given(ENVELOPES)
def test_envelope_round_trip(fields: tuple) -> None:
    data = _core.encode_envelope(*fields)
    assert isinstance(data, bytes)
    assert data[0] == 1
    assert _core.decode_envelope(data) == fields
    assert _core.envelope_id(data) == fields[0]


@given(ENVELOPES, U32)
def test_envelope_with_attempts(fields: tuple, attempts: int) -> None:
    data = _core.encode_envelope(*fields)
    out = _core.envelope_with_attempts(data, attempts)
    expected = (*fields[:3], attempts, *fields[4:])
    assert _core.decode_envelope(out) == expected
    assert _core.envelope_with_attempts(out, fields[3]) == data


def test_envelope_default_correlation_id() -> None:
    data = _core.encode_envelope("id", b"p", 1, 2, 3, 4)
    assert _core.decode_envelope(data) == ("id", b"p", 1, 2, 3, 4, None, None)


@given(ENVELOPES)
def test_truncated_envelope_raises(fields: tuple) -> None:
    data = _core.encode_envelope(*fields)
    # Cut exactly before an optional field: still valid, without the fields cut off.
    valid = {_core.encode_envelope(*fields[:6]): (*fields[:6], None, None)}
    valid[_core.encode_envelope(*fields[:7])] = (*fields[:7], None)
    for cut in range(len(data)):
        prefix = data[:cut]
        if prefix in valid:
            assert _core.decode_envelope(prefix) == valid[prefix]
            continue
        with pytest.raises(_core.CodecError):
            _core.decode_envelope(prefix)
        with pytest.raises(_core.CodecError):
            _core.envelope_id(prefix)


@settings(max_examples=500)
@given(st.binary(max_size=80))
def test_garbage_never_crashes(data: bytes) -> None:
    try:
        fields = _core.decode_envelope(data)
    except _core.CodecError as exc:
        assert str(exc)
        with pytest.raises(_core.CodecError):
            _core.envelope_id(data)
        with pytest.raises(_core.CodecError):
            _core.envelope_with_attempts(data, 1)
    else:
        assert _core.decode_envelope(_core.encode_envelope(*fields)) == fields


@given(ENVELOPES, st.data())
def test_flipped_byte_never_crashes(fields: tuple, data: st.DataObject) -> None:
    raw = bytearray(_core.encode_envelope(*fields))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    try:
        _core.decode_envelope(bytes(raw))
    except _core.CodecError:
        pass


def test_future_version_message() -> None:
    data = bytearray(_core.encode_envelope("id", b"", 0, 0, 0, 0))
    data[0] = 7
    with pytest.raises(_core.CodecError, match=r"version 7 is newer .*\(max 1\); upgrade trioqueue"):
        _core.decode_envelope(bytes(data))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\x01",
        b"\x01\x80\x00\x00\x00\x00\x00\x00",  # overlong varint
        b"\x01" + b"\xff" * 10 + b"\x01",  # varint overflow
        b"\x01\x00\x80\x80\x80\x80\x10\x00\x00\x00\x00",  # attempts > u32
        b"\x01\x00\x00\x00\x00\x01\xff\x00",  # id not UTF-8
        b"\x01\x00\x00\x00\x00\x00\x05ab",  # payload length past the end
        b"\x01\x00\x00\x00\x00\x00\x00\x07\x05ab",  # TLV past the end
        b"\x01\x00\x00\x00\x00\x00\x00\x09",  # TLV tag without length
        b"\x01\x00\x00\x00\x00\x00\x00\x00\x00",  # reserved tag 0
        b"\x01\x00\x00\x00\x00\x00\x00\x01\x01a\x01\x01b",  # duplicate correlation id
        b"\x01\x00\x00\x00\x00\x00\x00\x02\x00\x02\x01a",  # duplicate options
    ],
)
def test_corrupt_envelopes(data: bytes) -> None:
    with pytest.raises(_core.CodecError):
        _core.decode_envelope(data)


def test_unknown_tlv_fields_are_skipped_and_kept() -> None:
    data = _core.encode_envelope("id", b"x", 1, 2, 3, 4) + b"\x09\x02ab" + b"\x01\x01c"
    assert _core.decode_envelope(data) == ("id", b"x", 1, 2, 3, 4, "c", None)
    assert _core.envelope_with_attempts(data, 9).endswith(b"\x09\x02ab\x01\x01c")


@pytest.mark.parametrize(
    ("index", "value", "exc"),
    [
        (2, -1, ValueError),
        (2, 2**64, OverflowError),
        (3, -1, ValueError),
        (3, 2**32, OverflowError),
        (4, 2**32, OverflowError),
        (5, 2**70, OverflowError),
        (5, "1", TypeError),
        (5, 1.0, TypeError),
    ],
)
def test_encode_validates_ints(index: int, value: object, exc: type[Exception]) -> None:
    args: list[object] = ["id", b"", 0, 0, 0, 0]
    args[index] = value
    with pytest.raises(exc):
        _core.encode_envelope(*args)  # type: ignore[arg-type]


def test_encode_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        _core.encode_envelope("id", "payload", 0, 0, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _core.encode_envelope(b"id", b"", 0, 0, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _core.envelope_with_attempts(_core.encode_envelope("i", b"", 0, 0, 0, 0), -1)


# ------------------------------------------------------------------------ state

MS = U64
WORKER = TEXT.filter(bool)


@given(
    st.one_of(
        st.tuples(st.sampled_from(["queued", "completed", "failed"]), MS, st.none()),
        st.tuples(st.just("processing"), MS, WORKER),
        st.tuples(st.just("failing"), MS, U32),
    )
)
def test_state_round_trip(parts: tuple) -> None:
    s = _core.format_state(*parts)
    assert s == ":".join(str(p) for p in parts if p is not None)
    assert _core.parse_state(s) == parts


@given(MS, st.lists(TEXT, min_size=2, max_size=5).map(":".join).filter(bool))
def test_worker_id_with_colons(ms: int, worker: str) -> None:
    s = f"processing:{ms}:{worker}"
    assert _core.parse_state(s) == ("processing", ms, worker)
    assert _core.format_state("processing", ms, worker) == s


def test_state_kind_is_interned() -> None:
    a = _core.parse_state("queued:1")[0]
    b = _core.parse_state("queued:2")[0]
    assert a is b


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "queued",
        "queued:",
        "queued:-1",
        "queued: 1",
        "queued:1:2",
        "queued:18446744073709551616",
        "QUEUED:1",
        "running:1",
        "processing:1",
        "processing:1:",
        "processing::w",
        "failing:1",
        "failing:1:x",
        "failing:1:4294967296",
        "completed:1.0",
    ],
)
def test_parse_state_rejects(bad: str) -> None:
    with pytest.raises(_core.StateError) as info:
        _core.parse_state(bad)
    assert repr(bad)[1:-1] in str(info.value)


@given(st.text(max_size=30))
def test_parse_state_never_crashes(s: str) -> None:
    try:
        kind, ms, extra = _core.parse_state(s)
    except (_core.StateError, UnicodeEncodeError):
        pass
    else:
        assert _core.parse_state(_core.format_state(kind, ms, extra)) == (kind, ms, extra)


@pytest.mark.parametrize(
    "args",
    [
        ("processing", 1),
        ("processing", 1, ""),
        ("processing", 1, 5),
        ("failing", 1),
        ("failing", 1, "2"),
        ("failing", 1, -1),
        ("failing", 1, True),
        ("failing", 1, 2**32),
        ("queued", 1, "w"),
        ("completed", 1, 0),
        ("nope", 1),
        ("queued", -1),
        ("queued", 2**64),
    ],
)
def test_format_state_validates(args: tuple) -> None:
    with pytest.raises(_core.StateError):
        _core.format_state(*args)


# ------------------------------------------------------------------------ queue


def test_queue_fifo_and_identity() -> None:
    q = _core.MpmcQueue()
    assert len(q) == 0
    assert q.pop() is None
    assert q.pop_many(5) == []
    items = [bytes([i]) * 3 for i in range(10)]
    q.push(items[0])
    q.push_many(items[1:4])
    q.push_many(tuple(items[4:6]))
    q.push_many(iter(items[6:]))
    assert len(q) == 10
    assert q.pop() is items[0]
    got = q.pop_many(3)
    assert got == items[1:4]
    assert all(a is b for a, b in zip(got, items[1:4]))
    rest = q.pop_many(100)
    assert all(a is b for a, b in zip(rest, items[4:], strict=True))
    assert len(q) == 0
    assert q.pop_many(0) == []


@given(st.lists(st.binary(), max_size=50), st.integers(1, 60))
def test_queue_matches_deque(items: list[bytes], n: int) -> None:
    q = _core.MpmcQueue()
    q.push_many(items)
    out: list[bytes] = []
    while batch := q.pop_many(n):
        out.extend(batch)
    assert len(out) == len(items)
    assert all(a is b for a, b in zip(out, items))


def test_queue_rejects_non_bytes() -> None:
    q = _core.MpmcQueue()
    with pytest.raises(TypeError):
        q.push("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        q.push(bytearray(b"x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        q.push_many([b"a", 1])  # type: ignore[list-item]
    assert len(q) == 0  # all or nothing
    with pytest.raises(TypeError):
        q.push_many(b"abc")
    with pytest.raises(TypeError):
        q.push_many(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        q.pop_many(-1)


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(), st.binary()), max_size=50), st.integers(1, 60))
def test_object_queue_matches_deque(items: list[object], n: int) -> None:
    """ObjectQueue: FIFO of the very objects pushed, any type, from any iterable."""
    q: _core.ObjectQueue[object] = _core.ObjectQueue()
    half = len(items) // 2
    q.push_many(items[:half])
    q.push_many(iter(items[half:]))
    assert len(q) == len(items)
    out: list[object] = []
    while batch := q.pop_many(n):
        out.extend(batch)
    assert len(out) == len(items) and all(a is b for a, b in zip(out, items))
    assert len(q) == 0 and q.pop_many(0) == []


def test_object_queue_rejects_what_is_not_a_batch() -> None:
    q: _core.ObjectQueue[object] = _core.ObjectQueue()

    def broken() -> Iterator[object]:
        yield 1
        raise RuntimeError("iterating failed")

    with pytest.raises(RuntimeError):
        q.push_many(broken())
    assert len(q) == 0  # all or nothing
    with pytest.raises(TypeError):
        q.push_many(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        q.pop_many(-1)
    q.push_many((1, 2))
    assert q.pop_many(5) == [1, 2]


def test_queue_threads_nothing_lost_or_duplicated() -> None:
    producers, consumers, per_producer = 4, 4, 5_000
    total = producers * per_producer
    q = _core.MpmcQueue()
    items = [f"{p}-{i}".encode() for p in range(producers) for i in range(per_producer)]
    got: list[list[bytes]] = [[] for _ in range(consumers)]
    taken = [0]
    lock = threading.Lock()

    def produce(p: int) -> None:
        mine = items[p * per_producer : (p + 1) * per_producer]
        for i in range(0, len(mine), 50):
            if i % 100 == 0:
                q.push_many(mine[i : i + 50])
            else:
                for it in mine[i : i + 50]:
                    q.push(it)

    def consume(c: int) -> None:
        while True:
            with lock:
                if taken[0] >= total:
                    return
            batch = q.pop_many(7) if c % 2 else ([x] if (x := q.pop()) is not None else [])
            if batch:
                got[c].extend(batch)
                with lock:
                    taken[0] += len(batch)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    flat = [x for part in got for x in part]
    assert len(flat) == total
    assert len({id(x) for x in flat}) == total
    assert {id(x) for x in flat} == {id(x) for x in items}
    # Each consumer sees each producer's items in order.
    index = {id(x): i for i, x in enumerate(items)}
    for part in got:
        for p in range(producers):
            seq = [index[id(x)] for x in part if index[id(x)] // per_producer == p]
            assert seq == sorted(seq)
    assert len(q) == 0


# -- event-stream messages ---------------------------------------------------------


def _py_encode_events(events: list[tuple[str, str, str | None, bytes | None, bytes | None, str | None]]) -> bytes:
    """The Lua scripts' ``ns()`` encoding, written independently in Python."""
    out = bytearray()
    for ev in events:
        for f in ev:
            if f is None:
                out += b"-"
            else:
                b = f.encode() if isinstance(f, str) else f
                out += str(len(b)).encode() + b":" + b
    return bytes(out)


event_tuples = st.tuples(
    st.sampled_from(["enqueued", "completed", "failed", "failing", "requeued", "cancelled", "stalled", "fenced"]),
    st.text(max_size=50),
    st.none() | st.text(max_size=20),
    st.none() | st.binary(max_size=200),
    st.none() | st.binary(max_size=200),
    st.none() | st.text(max_size=30),
)


@given(st.lists(event_tuples, max_size=20))
def test_decode_events_round_trip(events: list) -> None:
    assert _core.decode_events(_py_encode_events(events)) == events


@given(st.binary(max_size=200))
def test_decode_events_garbage_raises_cleanly(data: bytes) -> None:
    try:
        out = _core.decode_events(data)
    except _core.EventsError as exc:
        assert "event" in str(exc)
    else:
        assert all(len(ev) == 6 for ev in out)


def test_decode_events_truncated() -> None:
    wire = _py_encode_events([("completed", "job", "w", b"result", None, "tok")])
    for cut in range(1, len(wire)):
        with pytest.raises(_core.EventsError):
            _core.decode_events(wire[:cut])


# -- RESP2 (the Redis protocol) ------------------------------------------------------


def test_resp_reader_returns_each_reply_including_errors_as_values() -> None:
    r = _core.RespReader()
    r.feed(b"+OK\r\n-ERR no such key\r\n:7\r\n$3\r\nab")
    got = r.pop_all()
    assert got[:1] == ["OK"] and got[2:] == [7]
    assert isinstance(got[1], _core.ReplyError) and str(got[1]) == "ERR no such key"
    assert r.buffered() == len(b"$3\r\nab")
    r.feed(bytearray(b"c\r\n*2\r\n$-1\r\n*1\r\n:1\r\n"))
    assert r.pop_all() == [b"abc", [None, [1]]]


def test_resp_reader_rejects_bytes_that_are_not_resp() -> None:
    r = _core.RespReader()
    r.feed(b"HTTP/1.1 400 Bad Request\r\n")
    with pytest.raises(_core.RespProtocolError, match="byte 0"):
        r.pop_all()
    with pytest.raises(TypeError, match="bytes or bytearray"):
        r.feed("text")  # type: ignore[arg-type]


def test_encode_command_takes_bytes_str_and_int_and_names_anything_else() -> None:
    assert _core.encode_command(("SET", b"k"), [1]) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"
    with pytest.raises(TypeError, match="bytes, str or int, got float"):
        _core.encode_command(["SET", 1.5])
    with pytest.raises(TypeError, match="bytes, str or int, got bool"):
        _core.encode_command(["SET", True])
    with pytest.raises(TypeError, match="single bytes/str"):
        _core.encode_command("SET")


def test_error_data_round_trips_and_never_raises() -> None:
    import math

    from trioqueue import JobError, error_data
    from trioqueue._model._serde import decode_error, encode_error

    class Weird(Exception):
        def to_dict(self) -> object:
            return ["not", "a", "dict"]

    class NaN(Exception):
        error_fields = ("x",)
        x = math.nan

    assert error_data(ValueError("v")) is None
    assert error_data(Weird()) == {"repr": "['not', 'a', 'dict']"}
    assert error_data(NaN()) == {"x": "nan"}  # JSON has no NaN: its repr
    err = JobError("E", "m", "tb", {"a": [1, "b"], "n": None})
    assert decode_error(encode_error(err)) == err
    assert decode_error(encode_error(JobError("E", "m"))).data is None
    # data set by hand that JSON cannot store: kept as reprs, never a crash
    assert decode_error(encode_error(JobError("E", "m", "", {"s": {1}}))).data == {"s": "{1}"}
    assert decode_error(b'{"type":"E","message":"m","data":[1]}').data is None
