"""Benchmark the Rust core (``trioqueue._core``) against its plain-Python twins.

Run: ``python benches/bench_core.py`` (after building the extension, e.g. with
``maturin develop --release``). Prints a table and writes it to
``benches/results/core.md``. Every figure is the best of several runs
(``--repeat``), as the machine is noisy; ratio = rust ops/s / python ops/s
(> 1 means Rust is faster).
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from trioqueue import _core

RESULTS = Path(__file__).resolve().parent / "results" / "core.md"


# ------------------------------------------------------------------ timing


def best_ops(run: Callable[[], int], repeat: int) -> float:
    """Best ops/s over ``repeat`` runs; ``run`` returns its operation count."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = run()
        dt = time.perf_counter() - t0
        best = max(best, n / dt)
    return best


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, str, float]] = []

    def add(self, group: str, case: str, rust: float, twin: str, python: float) -> None:
        self.rows.append((group, case, rust, twin, python))
        print(
            f"{group:9} {case:44} rust {fmt(rust):>9}/s  {twin:32} {fmt(python):>9}/s  "
            f"ratio {rust / python:6.2f}x",
            flush=True,
        )

    def markdown(self, header: str) -> str:
        lines = [
            header,
            "",
            "| area | case | rust ops/s | python twin | python ops/s | ratio rust/python |",
            "| --- | --- | ---: | --- | ---: | ---: |",
        ]
        for group, case, rust, twin, python in self.rows:
            lines.append(
                f"| {group} | {case} | {fmt(rust)} | {twin} | {fmt(python)} | "
                f"**{rust / python:.2f}x** |"
            )
        return "\n".join(lines) + "\n"


def fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


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


def bench_envelope(t: Table, repeat: int, n: int) -> None:
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

    t.add("envelope", "encode", best_ops(enc(_core.encode_envelope), repeat), "json+base64 dumps", best_ops(enc(py_encode_envelope), repeat))
    t.add("envelope", "decode", best_ops(one_arg(_core.decode_envelope, rs_data), repeat), "json+base64 loads", best_ops(one_arg(py_decode_envelope, py_data), repeat))
    t.add(
        "envelope",
        "envelope_id (peek id)",
        best_ops(one_arg(_core.envelope_id, rs_data), repeat),
        'json.loads(data)["id"]',
        best_ops(one_arg(lambda d: json.loads(d)["id"], py_data), repeat),
    )
    t.add(
        "envelope",
        "envelope_with_attempts",
        best_ops(one_arg(_core.envelope_with_attempts, rs_data, 2), repeat),
        "json loads+dumps",
        best_ops(one_arg(py_envelope_with_attempts, py_data, 2), repeat),
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


def bench_state(t: Table, repeat: int, n: int) -> None:
    parsed = [py_parse_state(s) for s in STATES]
    assert [_core.parse_state(s) for s in STATES] == parsed
    assert [_core.format_state(*p) for p in parsed] == [py_format_state(*p) for p in parsed] == STATES
    rounds = range(n // len(STATES))
    count = len(rounds) * len(STATES)

    def parse(f: Callable[[str], object]) -> Callable[[], int]:
        s0, s1, s2, s3, s4 = STATES

        def run() -> int:
            for _ in rounds:
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
            for _ in rounds:
                f(*p0)
                f(*p1)
                f(*p2)
                f(*p3)
                f(*p4)
            return count

        return run

    t.add("state", "parse_state (mix of 5 kinds)", best_ops(parse(_core.parse_state), repeat), "str.split + int()", best_ops(parse(py_parse_state), repeat))
    t.add("state", "format_state (mix of 5 kinds)", best_ops(format_(_core.format_state), repeat), "f-string + checks", best_ops(format_(py_format_state), repeat))


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


def bench_events(t: Table, repeat: int, n: int) -> None:
    for size in (1, 100):
        msg = _event_message(size)
        assert _core.decode_events(msg) == py_decode_events(msg)
        rounds = range(max(1, n // size))

        def run(f: Callable[[bytes], object]) -> Callable[[], int]:
            def go() -> int:
                for _ in rounds:
                    f(msg)
                return len(rounds) * size

            return go

        t.add(
            "events",
            f"decode_events, {size} event(s) per message",
            best_ops(run(_core.decode_events), repeat),
            "index/slice/int/decode loop",
            best_ops(run(py_decode_events), repeat),
        )


# ------------------------------------------------------------------- queue


def bench_queue_single(t: Table, repeat: int, n: int) -> None:
    items = [b"job-%d" % i for i in range(n)]
    rng = range(n)

    def rust_each() -> int:
        q = _core.MpmcQueue()
        push, pop = q.push, q.pop
        for x in items:
            push(x)
        for _ in rng:
            pop()
        return n

    def deque_each() -> int:
        q: collections.deque[bytes] = collections.deque()
        push, pop = q.append, q.popleft
        for x in items:
            push(x)
        for _ in rng:
            pop()
        return n

    def queue_each() -> int:
        q: queue.Queue[bytes] = queue.Queue()
        push, pop = q.put_nowait, q.get_nowait
        for x in items:
            push(x)
        for _ in rng:
            pop()
        return n

    def trio_each() -> int:
        async def main() -> None:
            send, recv = trio.open_memory_channel(float("inf"))
            push, pop = send.send_nowait, recv.receive_nowait
            for x in items:
                push(x)
            for _ in rng:
                pop()

        trio.run(main)
        return n

    rust = best_ops(rust_each, repeat)
    t.add("queue", "push+pop per item (1 thread)", rust, "collections.deque", best_ops(deque_each, repeat))
    t.add("queue", "push+pop per item (1 thread)", rust, "queue.Queue *_nowait", best_ops(queue_each, repeat))
    t.add("queue", "push+pop per item (1 thread)", rust, "trio memory channel *_nowait", best_ops(trio_each, repeat))

    batch = 100
    batches = [items[i : i + batch] for i in range(0, n, batch)]
    nb = range(len(batches))
    inner = range(batch)

    def batch_then_drain(make: Callable[[], Any], batches: list[list[Any]]) -> Callable[[], int]:
        """Push every batch with push_many, then pop them all, batch by batch."""

        def go() -> int:
            q = make()
            push_many, pop_many = q.push_many, q.pop_many
            for b in batches:
                push_many(b)
            for _ in nb:
                pop_many(batch)
            return n

        return go

    def deque_then_drain(batches: list[list[Any]]) -> Callable[[], int]:
        """The deque twin of :func:`batch_then_drain`."""

        def go() -> int:
            q: collections.deque[Any] = collections.deque()
            extend, pop = q.extend, q.popleft
            for b in batches:
                extend(b)
            for _ in nb:
                [pop() for _ in inner]
            return n

        return go

    rust_batch = batch_then_drain(_core.MpmcQueue, batches)
    deque_batch = deque_then_drain(batches)

    def rust_batch_interleaved() -> int:
        q = _core.MpmcQueue()
        push_many, pop_many = q.push_many, q.pop_many
        for b in batches:
            push_many(b)
            pop_many(batch)
        return n

    def deque_batch_interleaved() -> int:
        q: collections.deque[bytes] = collections.deque()
        extend, pop = q.extend, q.popleft
        for b in batches:
            extend(b)
            [pop() for _ in inner]
        return n

    t.add("queue", "push_many+pop_many, batch 100 (1 thread)", best_ops(rust_batch, repeat), "deque.extend + popleft loop", best_ops(deque_batch, repeat))
    t.add(
        "queue",
        "push_many then pop_many, batch 100, hot",
        best_ops(rust_batch_interleaved, repeat),
        "deque.extend + popleft loop, hot",
        best_ops(deque_batch_interleaved, repeat),
    )

    # ObjectQueue: the same batch calls for any objects (MemoryStorage's lanes of records).
    records = [object() for _ in range(n)]
    record_batches = [records[i : i + batch] for i in range(0, n, batch)]

    objects_rust_batch = batch_then_drain(_core.ObjectQueue, record_batches)
    objects_deque_batch = deque_then_drain(record_batches)

    t.add(
        "queue",
        "ObjectQueue push_many+pop_many, batch 100 (1 thread)",
        best_ops(objects_rust_batch, repeat),
        "deque.extend + popleft loop",
        best_ops(objects_deque_batch, repeat),
    )


def run_threads(producer: Callable[[int], None], consumer: Callable[[], None]) -> float:
    threads = [threading.Thread(target=producer, args=(p,)) for p in range(2)]
    threads += [threading.Thread(target=consumer) for _ in range(2)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t0


def bench_queue_threads(t: Table, repeat: int, n: int) -> None:
    """2 producer threads + 2 consumer threads moving ``n`` items in total."""
    half = n // 2
    total = half * 2
    parts = [[b"p%d-%d" % (p, i) for i in range(half)] for p in range(2)]
    sleep = time.sleep

    def measure(make: Callable[[], tuple[Callable[[int], None], Callable[[], None], Callable[[], int]]]) -> float:
        best = 0.0
        for _ in range(repeat):
            producer, consumer, check = make()
            dt = run_threads(producer, consumer)
            assert check() == total, "items lost or duplicated"
            best = max(best, total / dt)
        return best

    def polling(push_one: Callable[[bytes], None], pop_one: Callable[[], bytes | None]) -> tuple:
        """Consumers poll; on empty they publish their count and yield the GIL."""
        done = [0]
        lock = threading.Lock()

        def producer(p: int) -> None:
            for x in parts[p]:
                push_one(x)

        def consumer() -> None:
            got = 0
            while True:
                if pop_one() is None:
                    with lock:
                        done[0] += got
                        got = 0
                        if done[0] >= total:
                            return
                    sleep(0)
                    continue
                got += 1

        return producer, consumer, lambda: done[0]

    def rust_make() -> tuple:
        q = _core.MpmcQueue()
        return polling(q.push, q.pop)

    def deque_lock_make() -> tuple:
        q: collections.deque[bytes] = collections.deque()
        lock = threading.Lock()

        def push_one(x: bytes) -> None:
            with lock:
                q.append(x)

        def pop_one() -> bytes | None:
            with lock:
                return q.popleft() if q else None

        return polling(push_one, pop_one)

    def queue_measure() -> float:
        # queue.Queue consumers block in get(); stop them with sentinels once
        # producers are done (the sentinel put is inside the timed region).
        best = 0.0
        for _ in range(repeat):
            q: queue.Queue[bytes | None] = queue.Queue()
            done = [0]
            lock = threading.Lock()

            def producer(p: int, q: queue.Queue[bytes | None] = q) -> None:
                put = q.put
                for x in parts[p]:
                    put(x)

            def consumer(q: queue.Queue[bytes | None] = q, done: list[int] = done, lock: threading.Lock = lock) -> None:
                get = q.get
                got = 0
                while get() is not None:
                    got += 1
                with lock:
                    done[0] += got

            prods = [threading.Thread(target=producer, args=(p,)) for p in range(2)]
            cons = [threading.Thread(target=consumer) for _ in range(2)]
            t0 = time.perf_counter()
            for th in prods + cons:
                th.start()
            for th in prods:
                th.join()
            q.put(None)
            q.put(None)
            for th in cons:
                th.join()
            dt = time.perf_counter() - t0
            assert done[0] == total
            best = max(best, total / dt)
        return best

    def rust_batch_make() -> tuple:
        q = _core.MpmcQueue()
        done = [0]
        lock = threading.Lock()
        chunks = [[p[i : i + 100] for i in range(0, len(p), 100)] for p in parts]

        def producer(p: int) -> None:
            push_many = q.push_many
            for c in chunks[p]:
                push_many(c)

        def consumer() -> None:
            pop_many = q.pop_many
            got = 0
            while True:
                b = pop_many(100)
                if not b:
                    with lock:
                        done[0] += got
                        got = 0
                        if done[0] >= total:
                            return
                    sleep(0)
                    continue
                got += len(b)

        return producer, consumer, lambda: done[0]

    rust = measure(rust_make)
    t.add("queue-mt", f"2 producers + 2 consumers, {fmt(total)} items", rust, "queue.Queue put/get", queue_measure())
    t.add("queue-mt", f"2 producers + 2 consumers, {fmt(total)} items", rust, "deque + threading.Lock", measure(deque_lock_make))
    t.add(
        "queue-mt",
        "same, rust push_many/pop_many batch 100",
        measure(rust_batch_make),
        "deque + threading.Lock (per item)",
        measure(deque_lock_make),
    )


# -------------------------------------------------------------------- resp


def py_encode_command(args: list[bytes | str]) -> bytes:
    """The plain-Python twin of ``_core.encode_command`` (as redis-py packs a command)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class PyRespReader:
    """The plain-Python twin of ``_core.RespReader`` (RESP2, incremental)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data

    def _parse(self, pos: int) -> tuple[object, int] | None:
        buf = self.buf
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        kind, body = buf[pos : pos + 1], buf[pos + 1 : end]
        nxt = end + 2
        if kind == b"+":
            return body.decode(), nxt
        if kind == b":":
            return int(body), nxt
        if kind == b"$":
            n = int(body)
            if n < 0:
                return None, nxt
            if len(buf) < nxt + n + 2:
                return None
            return buf[nxt : nxt + n], nxt + n + 2
        if kind == b"*":
            n = int(body)
            if n < 0:
                return None, nxt
            items = []
            for _ in range(n):
                got = self._parse(nxt)
                if got is None:
                    return None
                items.append(got[0])
                nxt = got[1]
            return items, nxt
        if kind == b"-":
            return Exception(body.decode()), nxt
        raise ValueError("not RESP")

    def pop_all(self) -> list[object]:
        out = []
        pos = 0
        while pos < len(self.buf):
            got = self._parse(pos)
            if got is None:
                break
            out.append(got[0])
            pos = got[1]
        self.buf = self.buf[pos:]
        return out


def _claim_reply(jobs: int) -> bytes:
    """A claim script's reply: an array of (id, envelope, token, attempts) per job."""
    items = []
    for i in range(jobs):
        for f in (b"job-%06d" % i, b"\x01" + b"x" * 63, b"%012x-%x" % (i, i)):
            items.append(b"$%d\r\n%s\r\n" % (len(f), f))
        items.append(b":%d\r\n" % (i % 3))
    return b"*%d\r\n" % (jobs * 4) + b"".join(items)


def bench_resp(t: Table, repeat: int, n: int) -> None:
    keys = [f"{{trioqueue:q}}:k{i}" for i in range(28)]
    args = ["EVALSHA", "a" * 40, "28", *keys, "job-1", "\x01" + "x" * 63, "tok", "3", "60000"]
    assert _core.encode_command(args) == py_encode_command(args)
    rounds = range(max(1, n // 4))

    def enc(f: Callable[[list], bytes]) -> Callable[[], int]:
        def go() -> int:
            for _ in rounds:
                f(args)
            return len(rounds)

        return go

    t.add("resp", "encode_command, a 36-argument EVALSHA", best_ops(enc(_core.encode_command), repeat),
          "bytes formatting + join", best_ops(enc(py_encode_command), repeat))
    for label, data in (("an integer reply", b":1\r\n"), ("a 100-job claim reply", _claim_reply(100))):
        r, p = _core.RespReader(), PyRespReader()
        r.feed(data)
        p.feed(data)
        assert r.pop_all() == p.pop_all()
        per = max(1, n // (4 * max(1, len(data) // 64)))

        def dec(make: Callable[[], object]) -> Callable[[], int]:
            def go() -> int:
                reader = make()
                for _ in range(per):
                    reader.feed(data)  # type: ignore[attr-defined]
                    reader.pop_all()  # type: ignore[attr-defined]
                return per

            return go

        t.add("resp", f"RespReader feed + pop_all, {label}", best_ops(dec(_core.RespReader), repeat),
              "find/slice/int recursive parser", best_ops(dec(PyRespReader), repeat))


# -------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement (best is kept)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the item counts")
    args = ap.parse_args()
    n = int(100_000 * args.scale)

    header = (
        "# trioqueue core benchmark: Rust (`trioqueue._core`) vs plain Python\n\n"
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores, "
        f"best of {args.repeat} runs, {time.strftime('%Y-%m-%d')}. "
        "ratio = rust ops/s / python ops/s (> 1: Rust faster). Envelope payload: "
        f"{len(PAYLOAD)}-byte JSON. Generated by `python benches/bench_core.py`."
    )
    t = Table()
    bench_envelope(t, args.repeat, n)
    bench_state(t, args.repeat, n)
    bench_events(t, args.repeat, n)
    bench_resp(t, args.repeat, n)
    bench_queue_single(t, args.repeat, n)
    bench_queue_threads(t, max(3, args.repeat // 2 + 1), n)
    md = t.markdown(header)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(md)
    print()
    print(md)
    print(f"written to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
