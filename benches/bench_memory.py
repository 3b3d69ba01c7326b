"""End-to-end MemoryStorage benchmark: one process, noop handler.

Run: ``python benches/bench_memory.py`` — writes ``benches/results/memory.md``.

Figures: enqueue throughput (``enqueue`` one by one, and ``enqueue_many``), processing
throughput at concurrency 100, and ``enqueue_and_wait`` latency p50/p99 at concurrency 1
and 50. Baseline from the same run: a bare Trio memory channel moving the same number of
items producer -> 100 consumer tasks, the floor of any Trio queue in one process.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from trioqueue import Job, MemoryStorage, Queue

RESULTS = Path(__file__).parent / "results" / "memory.md"


async def noop(job: Job[Any]) -> None:
    return None


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(math.ceil(p / 100 * len(values))) - 1)]


async def bench_enqueue(n: int) -> tuple[float, float]:
    async with Queue(MemoryStorage(), name="bench") as q:
        t0 = time.perf_counter()
        for i in range(n):
            await q.enqueue(f"one-{i}", {"i": i})
        single = n / (time.perf_counter() - t0)
        payloads = [(f"many-{i}", {"i": i}) for i in range(n)]
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            await q.enqueue_many(payloads[start : start + 1000])
        many = n / (time.perf_counter() - t0)
    return single, many


async def bench_processing(n: int, concurrency: int) -> float:
    storage = MemoryStorage()
    done = trio.Event()
    count = 0

    async def handler(job: Job[Any]) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    async with Queue(storage, name="bench") as producer:
        for start in range(0, n, 1000):
            await producer.enqueue_many([(f"p-{i}", i) for i in range(start, min(n, start + 1000))])
        t0 = time.perf_counter()
        async with Queue(storage, name="bench", handler=handler, concurrency=concurrency, reaper=False):
            await done.wait()
            elapsed = time.perf_counter() - t0
    return n / elapsed


async def bench_wait(n: int, concurrency: int) -> tuple[float, float, float]:
    latencies: list[float] = []
    async with Queue(MemoryStorage(), name="bench", handler=noop, concurrency=max(concurrency, 1)) as q:
        next_id = iter(range(10**9))

        async def client(count: int) -> None:
            for _ in range(count):
                t = time.perf_counter()
                await q.enqueue_and_wait(f"w-{next(next_id)}", None)
                latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(client, n // concurrency)
        rate = len(latencies) / (time.perf_counter() - t0)
    return pct(latencies, 50) * 1e3, pct(latencies, 99) * 1e3, rate


async def bench_channel_baseline(n: int, consumers: int) -> float:
    send, receive = trio.open_memory_channel[int](math.inf)
    done = trio.Event()
    count = 0

    async def consumer() -> None:
        nonlocal count
        async for _ in receive:
            count += 1
            if count == n:
                done.set()

    async with trio.open_nursery() as nursery:
        for _ in range(consumers):
            nursery.start_soon(consumer)
        t0 = time.perf_counter()
        for i in range(n):
            send.send_nowait(i)
        await done.wait()
        rate = n / (time.perf_counter() - t0)
        nursery.cancel_scope.cancel()
    return rate


async def main(scale: float) -> None:
    n = int(50_000 * scale)
    rows: list[tuple[str, str, str]] = []

    base = max([await bench_channel_baseline(n, 100) for _ in range(3)])
    single, many = 0.0, 0.0
    for _ in range(3):
        s, m = await bench_enqueue(n)
        single, many = max(single, s), max(many, m)
    proc = max([await bench_processing(n, 100) for _ in range(3)])
    p50_1, p99_1, rate_1 = await bench_wait(max(2000, n // 25), 1)
    p50_50, p99_50, rate_50 = await bench_wait(max(5000, n // 5), 50)

    rows.append(("baseline: trio memory channel, 1 producer -> 100 consumer tasks", f"{base:,.0f} items/s", "1.00"))
    rows.append(("enqueue, one call per job", f"{single:,.0f} jobs/s", f"{single / base:.2f}"))
    rows.append(("enqueue_many, 1000 per call (target >= 100k)", f"{many:,.0f} jobs/s", f"{many / base:.2f}"))
    rows.append(("processing, concurrency 100, noop (target >= 50k)", f"{proc:,.0f} jobs/s", f"{proc / base:.2f}"))
    rows.append(("enqueue_and_wait, concurrency 1: p50 / p99", f"{p50_1:.3f} / {p99_1:.3f} ms", f"{rate_1:,.0f} req/s"))
    rows.append(("enqueue_and_wait, concurrency 50: p50 / p99", f"{p50_50:.3f} / {p99_50:.3f} ms", f"{rate_50:,.0f} req/s"))
    lines = [
        "# MemoryStorage end to end",
        "",
        f"One process, noop handler, {n:,} jobs per figure (best of 3 for throughput). "
        f"Python {sys.version.split()[0]}, trio {trio.__version__}. Ratio column: against the "
        "baseline measured in the same run.",
        "",
        "| measure | figure | ratio to baseline |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the job counts")
    trio.run(main, parser.parse_args().scale)
