"""Queue end to end in one process on each storage: the workloads of ``trioqueue bench``
(producer and worker in this process, noop handler) against a baseline from the same run.

Figures: enqueue throughput (A-seq: ``enqueue`` one by one; A-100: concurrent ``enqueue``
from 100 tasks; A-batch: ``enqueue_many``), processing throughput at concurrency 100 (B),
and ``enqueue_and_wait`` latency p50/p99 at concurrency 1 and 50 (C-1, C-50). Baseline,
interleaved with them round by round: a bare Trio memory channel moving the same number of
items producer -> 100 consumer tasks (the floor of any Trio queue in one process), one
task's awaited ``send`` (the floor of an awaited call) and a request/reply round trip
through a server task (the floor of ``enqueue_and_wait``); for
Redis also the server's own LPUSH/RPOP rate measured by ``valkey-benchmark`` /
``redis-benchmark`` against the same server (the ceiling).

    python benches/bench_queue.py [--storages memory,file,redis] [--jobs 50000] [--rounds 3]

writes ``benches/results/in-process.md`` (a section per storage; FileStorage runs a tenth
of ``--jobs``).
"""

from __future__ import annotations

import math
import subprocess
import time
from typing import Any

import trio

import _harness as h
from trioqueue.cli._bench import run_bench

WORKLOADS = ("A-seq", "A-100", "A-batch", "B", "C-1", "C-50")
TARGETS = {  # from the issues: (enqueue_many, processing) jobs/s
    "memory": ("target >= 100k", "target >= 50k"),
    "redis": ("target >= 40k", "target >= 20k"),
    "file": ("target >= 5k", "target >= 5k"),
}
TITLES = {
    "A-seq": "enqueue, one call per job, sequential",
    "A-100": "enqueue, one call per job, 100 concurrent tasks",
    "A-batch": "enqueue_many, 1000 per call",
    "B": "processing, concurrency 100, noop",
}


async def channel_baseline(n: int, consumers: int = 100) -> float:
    """Items/s through a bare Trio memory channel, one producer to ``consumers`` tasks."""
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


async def channel_awaited_send(n: int) -> float:
    """Items/s of one task's awaited ``send`` into a Trio memory channel (nobody waiting to
    receive): the floor of an awaited call that is a schedule point every time."""
    send, receive = trio.open_memory_channel[int](math.inf)
    t0 = time.perf_counter()
    for i in range(n):
        await send.send(i)
    rate = n / (time.perf_counter() - t0)
    send.close()
    receive.close()
    return rate


async def channel_round_trip(n: int) -> float:
    """p50 seconds of a request answered through two Trio memory channels by a server task
    (send the request, await the reply): the floor of a request/response within one run."""
    requests, serve = trio.open_memory_channel[int](math.inf)
    answer, replies = trio.open_memory_channel[int](math.inf)
    latencies: list[float] = []

    async def server() -> None:
        async for item in serve:
            answer.send_nowait(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        for i in range(n):
            t = time.perf_counter()
            await requests.send(i)
            await replies.receive()
            latencies.append(time.perf_counter() - t)
        nursery.cancel_scope.cancel()
    latencies.sort()
    return latencies[len(latencies) // 2]


def redis_ceiling(url: str, n: int) -> str:
    """The server's own LPUSH/RPOP rate (redis-benchmark, 50 clients, no pipelining)."""
    from redis_server import benchmark_binary

    binary = benchmark_binary()
    if binary is None:
        return "n/a (no valkey-benchmark/redis-benchmark)"
    port = url.rsplit(":", 1)[1].split("/")[0]
    out = subprocess.run([binary, "-p", port, "-n", str(n), "-c", "50", "-t", "lpush,rpop", "-q"],
                         capture_output=True, text=True, timeout=120).stdout
    return "; ".join(line.strip().split("\r")[-1] for line in out.splitlines() if "requests per second" in line)


async def measure(target: h.Target, n: int, rounds: int) -> tuple[h.Spread, dict[str, dict[str, h.Spread]]]:
    """The baseline's rate and the workloads' figures, interleaved round by round."""
    base: list[float] = []
    sends: list[float] = []
    trips: list[float] = []
    docs: list[dict[str, Any]] = []
    for _, side in h.interleaved(rounds, ["baseline", "queue"]):
        if side == "baseline":
            base.append(await channel_baseline(n))
            sends.append(await channel_awaited_send(n))
            trips.append(await channel_round_trip(max(100, n // 20)) * 1000)
        else:
            results = await run_bench(target.make(), WORKLOADS, jobs=n)
            docs.append({"results": [vars(r) for r in results]})
    m = h.by_workload(docs)
    m["channel"] = {"send": h.Spread.of(sends), "trip": h.Spread.of(trips)}
    return h.Spread.of(base), m


def section(target: h.Target, n: int, base: h.Spread, m: dict[str, dict[str, h.Spread]], ceiling: str) -> list[str]:
    t_many, t_proc = TARGETS.get(target.name, ("", ""))
    targets = {"A-batch": t_many, "B": t_proc}
    send, trip = m["channel"]["send"], m["channel"]["trip"]
    rows = [["baseline: trio memory channel, 1 producer -> 100 consumer tasks", base.fmt(",.0f", " items/s"), "1.00"],
            ["baseline: trio memory channel, awaited send, one task", send.fmt(",.0f", " items/s"),
             f"{send / base:.3f}"],
            ["baseline: trio memory channel round trip (request, server task, reply): p50", trip.fmt(".3f", " ms"), ""]]
    for w, title in TITLES.items():
        label = f"{title} ({targets[w]})" if targets.get(w) else title
        extra = f"; {m[w]['rate'] / send:.3f} x the awaited send" if w in ("A-seq", "A-100") else ""
        rows.append([f"{w}: {label}", m[w]["rate"].fmt(",.0f", " jobs/s"), f"{m[w]['rate'] / base:.3f}{extra}"])
    for w, callers in (("C-1", 1), ("C-50", 50)):
        ratio = f"; p50 {m[w]['p50_ms'] / trip:.2f} x the round trip" if callers == 1 else ""
        rows.append([f"{w}: enqueue_and_wait, concurrency {callers}: p50 / p99",
                     f"{m[w]['p50_ms'].fmt('.3f')} / {m[w]['p99_ms'].median:.3f} ms",
                     f"{m[w]['rate'].median:,.0f} req/s{ratio}"])
    if ceiling:
        rows.append(["ceiling: the server's own LPUSH/RPOP (redis-benchmark, 50 clients)", ceiling, ""])
    return [f"## {target.name}", "", f"{target.note}; {n:,} jobs per throughput figure.", "",
            *h.table(["measure", "figure", "ratio to baseline"], rows, "lll"), ""]


def main() -> None:
    args = h.parser(__doc__, out="in-process.md", rounds=3, jobs=50_000, storages=("memory", "file", "redis")).parse_args()
    lines = [
        f"One process, noop handler; median (min–max) of {args.rounds} rounds, the baseline interleaved with the "
        f"workloads of `trioqueue bench` (trio {trio.__version__}). Ratio column: against the baseline measured "
        "in the same run (the machine is noisy; compare ratios).",
        "",
    ]
    for target in h.each_storage(args.storages):
        n = max(200, args.jobs // 10) if target.name == "file" else args.jobs
        base, m = trio.run(measure, target, n, args.rounds)
        ceiling = redis_ceiling(target.url, max(n, 100_000)) if target.name == "redis" else ""
        lines += section(target, n, base, m, ceiling)
    h.write(args, "Queue end to end in one process", lines)


if __name__ == "__main__":
    main()
