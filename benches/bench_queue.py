"""End-to-end Queue benchmark on each storage: one process, noop handler.

Run: ``python benches/bench_queue.py [--storage memory file redis] [--scale 1.0]``;
writes ``benches/results/queue-<storage>.md`` for each.

Figures: enqueue throughput (``enqueue`` one by one, concurrent ``enqueue`` from 100 tasks,
and ``enqueue_many``), processing throughput at concurrency 100, and ``enqueue_and_wait``
latency p50/p99 at concurrency 1 and 50. Baseline from the same run: a bare Trio memory
channel moving the same number of items producer -> 100 consumer tasks (the floor of any
Trio queue in one process); for Redis also the server's own LPUSH/RPOP rate measured by
``valkey-benchmark``/``redis-benchmark`` against the same server (the ceiling).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import trio

from trioqueue import Job, MemoryStorage, Queue, Storage

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGETS = {  # from the issues: (enqueue_many, processing) jobs/s
    "memory": ("target >= 100k", "target >= 50k"),
    "redis": ("target >= 40k", "target >= 20k"),
    "file": ("target >= 5k", "target >= 5k"),
}


async def noop(job: Job[Any]) -> None:
    return None


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(math.ceil(p / 100 * len(values))) - 1)]


async def bench_enqueue(storage: Storage, n: int, tag: str) -> tuple[float, float, float]:
    async with Queue(storage, name=f"bench-enq-{tag}") as q:
        t0 = time.perf_counter()
        for i in range(n // 4):
            await q.enqueue(f"one-{i}", {"i": i})
        single = (n // 4) / (time.perf_counter() - t0)

        async def task(k: int, count: int) -> None:
            for i in range(count):
                await q.enqueue(f"conc-{k}-{i}", {"i": i})

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(100):
                nursery.start_soon(task, k, n // 100)
        concurrent = (n // 100 * 100) / (time.perf_counter() - t0)
        payloads = [(f"many-{i}", {"i": i}) for i in range(n)]
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            await q.enqueue_many(payloads[start : start + 1000])
        many = n / (time.perf_counter() - t0)
    return single, concurrent, many


async def bench_processing(storage: Storage, n: int, concurrency: int, tag: str) -> float:
    done = trio.Event()
    count = 0

    async def handler(job: Job[Any]) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    async with Queue(storage, name=f"bench-proc-{tag}") as producer:
        for start in range(0, n, 1000):
            await producer.enqueue_many([(f"p-{i}", i) for i in range(start, min(n, start + 1000))])
        t0 = time.perf_counter()
        async with Queue(
            storage, name=f"bench-proc-{tag}", handler=handler, concurrency=concurrency, reaper=False
        ):
            await done.wait()
            elapsed = time.perf_counter() - t0
    return n / elapsed


async def bench_wait(storage: Storage, n: int, concurrency: int, tag: str) -> tuple[float, float, float]:
    latencies: list[float] = []
    async with Queue(storage, name=f"bench-wait-{tag}", handler=noop, concurrency=max(concurrency, 1)) as q:
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


def _redis_ceiling(server: Any, n: int) -> str:
    """The server's own LPUSH/RPOP rate (redis-benchmark, 50 clients, no pipelining)."""
    import subprocess

    from redis_server import benchmark_binary

    binary = benchmark_binary()
    if binary is None:
        return "n/a (no valkey-benchmark/redis-benchmark)"
    out = subprocess.run(
        [binary, "-p", str(server.port), "-n", str(n), "-c", "50", "-t", "lpush,rpop", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return "; ".join(line.strip().split("\r")[-1] for line in out.splitlines() if "requests per second" in line)


async def run_storage(kind: str, scale: float) -> None:
    n = int((50_000 if kind != "file" else 5_000) * scale)
    server = tmp = None
    ceiling = ""
    import tempfile

    if kind == "redis":
        sys.path.insert(0, str(HERE.parent / "tests"))
        from redis_server import RedisServer

        server = RedisServer().start()
        ceiling = _redis_ceiling(server, max(n, 100_000))
    if kind == "file":
        tmp = tempfile.TemporaryDirectory(prefix="trioqueue-bench-")

    def make() -> Storage:
        if kind == "memory":
            return MemoryStorage()
        if kind == "file":
            from trioqueue.storage.file import FileStorage

            return FileStorage(tmp.name)  # type: ignore[union-attr]
        from trioqueue.storage.redis import RedisStorage

        return RedisStorage(server.url, prefix=f"bench-{time.monotonic_ns()}")  # type: ignore[union-attr]

    try:
        base = max([await bench_channel_baseline(n, 100) for _ in range(3)])
        single = concurrent = many = proc = 0.0
        for r in range(3 if kind != "file" else 1):
            s, c, m = await bench_enqueue(make(), n, f"{r}")
            single, concurrent, many = max(single, s), max(concurrent, c), max(many, m)
            proc = max(proc, await bench_processing(make(), n, 100, f"{r}"))
        p50_1, p99_1, rate_1 = await bench_wait(make(), max(1000, n // 25), 1, "c1")
        p50_50, p99_50, rate_50 = await bench_wait(make(), max(2500, n // 5), 50, "c50")
    finally:
        if server is not None:
            server.close()
        if tmp is not None:
            tmp.cleanup()

    t_many, t_proc = TARGETS[kind]
    rows = [
        ("baseline: trio memory channel, 1 producer -> 100 consumer tasks", f"{base:,.0f} items/s", "1.00"),
        ("enqueue, one call per job, sequential", f"{single:,.0f} jobs/s", f"{single / base:.3f}"),
        ("enqueue, one call per job, 100 concurrent tasks", f"{concurrent:,.0f} jobs/s", f"{concurrent / base:.3f}"),
        (f"enqueue_many, 1000 per call ({t_many})", f"{many:,.0f} jobs/s", f"{many / base:.3f}"),
        (f"processing, concurrency 100, noop ({t_proc})", f"{proc:,.0f} jobs/s", f"{proc / base:.3f}"),
        ("enqueue_and_wait, concurrency 1: p50 / p99", f"{p50_1:.3f} / {p99_1:.3f} ms", f"{rate_1:,.0f} req/s"),
        ("enqueue_and_wait, concurrency 50: p50 / p99", f"{p50_50:.3f} / {p99_50:.3f} ms", f"{rate_50:,.0f} req/s"),
    ]
    if ceiling:
        rows.append(("ceiling: the server's own LPUSH/RPOP (redis-benchmark, 50 clients)", ceiling, ""))
    lines = [
        f"# Queue end to end on {kind} storage",
        "",
        f"One process, noop handler, {n:,} jobs per throughput figure (best of "
        f"{3 if kind != 'file' else 1}). Python {sys.version.split()[0]}, trio {trio.__version__}, "
        f"{time.strftime('%Y-%m-%d')}. Ratio column: against the baseline measured in the same run "
        "(the machine is noisy; compare ratios).",
        "",
        "| measure | figure | ratio to baseline |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"queue-{kind}.md").write_text("\n".join(lines))
    print("\n".join(lines))


async def main(storages: list[str], scale: float) -> None:
    for kind in storages:
        await run_storage(kind, scale)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage", nargs="+", choices=["memory", "file", "redis"], default=["memory", "file", "redis"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the job counts")
    args = parser.parse_args()
    trio.run(main, args.storage, args.scale)
