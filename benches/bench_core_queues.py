"""Part of benches/bench_core.py: the Rust queues against Python's.

``MpmcQueue`` and ``ObjectQueue`` against ``collections.deque``, ``queue.Queue`` and a
Trio memory channel: on one thread (item by item, and in batches of 100), and with 2
producer and 2 consumer threads.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

from trioqueue import _core

from _harness import Spread
from core_timing import Table, fmt, ops_per_s


def bench_queue_single(t: Table, rounds: int, n: int) -> None:
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

    rust = ops_per_s(rust_each, rounds)
    t.add("queue", "push+pop per item (1 thread)", rust, "collections.deque", ops_per_s(deque_each, rounds))
    t.add("queue", "push+pop per item (1 thread)", rust, "queue.Queue *_nowait", ops_per_s(queue_each, rounds))
    t.add("queue", "push+pop per item (1 thread)", rust, "trio memory channel *_nowait", ops_per_s(trio_each, rounds))

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

    t.add("queue", "push_many+pop_many, batch 100 (1 thread)", ops_per_s(rust_batch, rounds), "deque.extend + popleft loop", ops_per_s(deque_batch, rounds))
    t.add(
        "queue",
        "push_many then pop_many, batch 100, hot",
        ops_per_s(rust_batch_interleaved, rounds),
        "deque.extend + popleft loop, hot",
        ops_per_s(deque_batch_interleaved, rounds),
    )

    # ObjectQueue: the same batch calls for any objects (MemoryStorage's lanes of records).
    records = [object() for _ in range(n)]
    record_batches = [records[i : i + batch] for i in range(0, n, batch)]

    objects_rust_batch = batch_then_drain(_core.ObjectQueue, record_batches)
    objects_deque_batch = deque_then_drain(record_batches)

    t.add(
        "queue",
        "ObjectQueue push_many+pop_many, batch 100 (1 thread)",
        ops_per_s(objects_rust_batch, rounds),
        "deque.extend + popleft loop",
        ops_per_s(objects_deque_batch, rounds),
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


def bench_queue_threads(t: Table, rounds: int, n: int) -> None:
    """2 producer threads + 2 consumer threads moving ``n`` items in total."""
    half = n // 2
    total = half * 2
    parts = [[b"p%d-%d" % (p, i) for i in range(half)] for p in range(2)]
    sleep = time.sleep

    def measure(make: Callable[[], tuple[Callable[[int], None], Callable[[], None], Callable[[], int]]]) -> Spread:
        rates = []
        for _ in range(rounds):
            producer, consumer, check = make()
            dt = run_threads(producer, consumer)
            assert check() == total, "items lost or duplicated"
            rates.append(total / dt)
        return Spread.of(rates)

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

    def queue_measure() -> Spread:
        # queue.Queue consumers block in get(); stop them with sentinels once
        # producers are done (the sentinel put is inside the timed region).
        rates = []
        for _ in range(rounds):
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
            rates.append(total / dt)
        return Spread.of(rates)

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
