"""FileStorage throughput and latency, with a plain fsynced-file-per-job baseline.

    python benches/bench_file.py [--jobs 5000] [--rounds 1] [--base REV]

Writes benches/results/file.md. With ``--base``, the sequential enqueue, the concurrent
enqueue and the processing loop also run on that git revision's ``python/`` (exported), each
run of either side in a fresh process, interleaved: a before/after section in the same run,
with the system calls, flushes and Python calls per job of each side (``strace -c``, cProfile). Every figure is measured in this run on this machine, in
a temporary directory on the same file system as the repository (not tmpfs); with several
rounds, the baseline and each measure are interleaved and the medians (min–max) kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

import _harness as h
from trioqueue._core import encode_envelope
from trioqueue.storage import FileStorage, NewJob, Settlement, SettleKind


_LAST: list[float] = []  # the per-call times (seconds) of the last sequential measure


def _keep(samples: list[float]) -> None:
    _LAST[:] = samples


def job(job_id: str) -> NewJob:
    env = encode_envelope(job_id, b'{"x":1}', int(time.time() * 1000), 0, 3, 3_600_000)
    return NewJob(job_id, env, 3, 3600.0)


def baseline(directory: Path, n: int) -> float:
    """One fsynced file per job: temp file, fsync, rename, fsync of the directory."""
    directory.mkdir(parents=True)
    dfd = os.open(directory, os.O_RDONLY)
    data = job("baseline").envelope
    t = time.perf_counter()
    for i in range(n):
        tmp = directory / f".tmp{i}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, directory / f"job{i}")
        os.fsync(dfd)
    el = time.perf_counter() - t
    os.close(dfd)
    return n / el


async def bench_sequential(d: Path, n: int, fsync: bool = True) -> float:
    async with FileStorage(d, fsync=fsync) as st:
        jobs = [job(f"s{i}") for i in range(n)]
        samples = []
        pc = time.perf_counter
        t = pc()
        for j in jobs:
            t0 = pc()
            await st.enqueue("q", [j])
            samples.append(pc() - t0)
        el = pc() - t
        _keep(samples)
        return n / el


def bench_sequential_lanes_flushed(d: Path, n: int) -> float:
    """The sequential enqueue as the code before 348e9c9 flushed it: jobs/ and the
    directories of the markers too (3 flushes of the disk's cache per enqueue, not 2)."""
    from trioqueue.storage.file import _enqueue

    def named_dirs(q, jobs):  # type: ignore[no-untyped-def]
        dirs = {q.jobs_fd, *(q.lane_fds[j.priority] for j in jobs)}
        if any(j.run_at is not None for j in jobs):
            dirs.add(q.delayed_fd)
        return dirs

    now = _enqueue._named_dirs
    _enqueue._named_dirs = named_dirs
    try:
        return trio.run(bench_sequential, d, n)
    finally:
        _enqueue._named_dirs = now


async def bench_concurrent(d: Path, n: int, tasks: int = 50) -> float:
    async with FileStorage(d) as st:
        per = n // tasks

        async def producer(k: int) -> None:
            for i in range(per):
                await st.enqueue("q", [job(f"c{k}-{i}")])

        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(tasks):
                nursery.start_soon(producer, k)
        return per * tasks / (time.perf_counter() - t)


async def bench_batched(d: Path, n: int, batch: int = 1000) -> float:
    async with FileStorage(d) as st:
        jobs = [job(f"b{i}") for i in range(n)]
        t = time.perf_counter()
        for s in range(0, n, batch):
            await st.enqueue("q", jobs[s : s + batch])
        return n / (time.perf_counter() - t)


async def bench_processing(d: Path, n: int, batch: int = 100) -> float:
    async with FileStorage(d) as st:
        for s in range(0, n, 1000):
            await st.enqueue("q", [job(f"p{i}") for i in range(s, min(n, s + 1000))])
        t = time.perf_counter()
        done = 0
        while done < n:
            claims = await st.dequeue("q", "w", batch, 0, 60)
            ok = await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=3600, token=c.token) for c in claims])
            done += sum(ok)
        return n / (time.perf_counter() - t)


async def bench_latency(d: Path, n: int) -> tuple[float, float]:
    """Enqueue into an idle queue while a consumer is blocked in dequeue; time to claim."""
    async with FileStorage(d) as st:
        lat: list[float] = []
        for i in range(n):
            started = trio.Event()
            result: list[float] = []

            async def consumer() -> None:
                started.set()
                claims = await st.dequeue("q", "w", 1, 10.0, 60)
                result.append(time.perf_counter())
                await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=60, token=c.token) for c in claims])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consumer)
                await started.wait()
                await trio.sleep(0.002)  # let the consumer block in its inotify wait
                t0 = time.perf_counter()
                await st.enqueue("q", [job(f"l{i}")])
            lat.append(result[0] - t0)
        lat.sort()
        return statistics.median(lat) * 1000, lat[int(len(lat) * 0.99) - 1] * 1000


# -- the disk's floor: what one durable write costs here, without the queue ----------------

_REC = b"x" * 200  # about one job's record


def floor_new_file(directory: Path, n: int) -> float:
    """(a) A new small file, fdatasync, then an fsync of its directory: what a write that
    makes a new file (a segment, with its names as links) costs on this disk."""
    directory.mkdir(parents=True)
    dfd = os.open(directory, os.O_RDONLY)
    samples = []
    pc = time.perf_counter
    t = pc()
    for i in range(n):
        t0 = pc()
        fd = os.open(directory / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, _REC)
        os.fdatasync(fd)
        os.close(fd)
        os.fsync(dfd)
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    os.close(dfd)
    return n / el


def floor_link(directory: Path, n: int) -> float:
    """(a') A hard link to an existing file, then an fsync of the directory: a marker alone."""
    directory.mkdir(parents=True)
    src = directory / "src"
    src.write_bytes(_REC)
    dfd = os.open(directory, os.O_RDONLY)
    os.fsync(dfd)
    samples = []
    pc = time.perf_counter
    t = pc()
    for i in range(n):
        t0 = pc()
        os.link(src, directory / f"l{i}")
        os.fsync(dfd)
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    os.close(dfd)
    return n / el


def floor_append(directory: Path, n: int) -> float:
    """(b) A record written into a preallocated, already written log file, then
    fdatasync: no metadata to commit, the least a durable write costs on this disk."""
    directory.mkdir(parents=True)
    fd = os.open(directory / "log", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"\0" * (n * 256 + 4096), 0)
    os.fsync(fd)
    samples = []
    pc = time.perf_counter
    t = pc()
    for i in range(n):
        t0 = pc()
        os.pwrite(fd, _REC, i * 256)
        os.fdatasync(fd)
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    os.close(fd)
    return n / el


async def floor_log_flusher(directory: Path, n: int) -> float:
    """(b) as an awaited call: each record handed to one dedicated flusher thread (a queue,
    no thread pool), written into the preallocated log and fdatasynced there, the caller
    woken through the Trio token. The least an awaited, durable enqueue can cost here
    without blocking the event loop: no engine's sequential enqueue beats it."""
    import queue
    import threading

    directory.mkdir(parents=True)
    fd = os.open(directory / "log", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"\0" * (n * 256 + 4096), 0)
    os.fsync(fd)
    token = trio.lowlevel.current_trio_token()
    inbox: queue.SimpleQueue[tuple[int, trio.Event] | None] = queue.SimpleQueue()

    def flusher() -> None:
        while (item := inbox.get()) is not None:
            i, ev = item
            os.pwrite(fd, _REC, i * 256)
            os.fdatasync(fd)
            token.run_sync_soon(ev.set)

    th = threading.Thread(target=flusher, daemon=True)
    th.start()
    samples = []
    pc = time.perf_counter
    t = pc()
    for i in range(n):
        t0 = pc()
        ev = trio.Event()
        inbox.put((i, ev))
        await ev.wait()
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    inbox.put(None)
    th.join()
    os.close(fd)
    return n / el


async def floor_hop(n: int) -> float:
    """A no-op sent to a worker thread and awaited (``trio.to_thread.run_sync``): what an
    awaited call whose flush runs off the event loop pays besides the flush."""
    samples = []
    pc = time.perf_counter
    t = pc()
    for _ in range(n):
        t0 = pc()
        await trio.to_thread.run_sync(int)
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    return n / el


# -- SQLite (WAL) as the engine: a minimal queue table, measured beside FileStorage ----------
#
# One table; a claim is an UPDATE ... RETURNING of the first ready rows, a settlement an
# UPDATE per job in one transaction. synchronous=FULL fsyncs the WAL at every commit
# (durable); NORMAL fsyncs it only at checkpoints (survives a process crash, but the last
# commits can be lost to a power cut). Statements run in the calling thread, except where
# stated (a thread hop per call, as an async engine would do).

_SCHEMA = """
create table jobs(id text primary key, q text not null, st int not null, seq integer not null,
                  env blob not null, worker text, token text, result blob);
create index ready on jobs(q, st, seq);
"""


def sqlite_open(path: Path, sync: str) -> sqlite3.Connection:
    path.mkdir(parents=True)
    db = sqlite3.connect(path / "q.db", isolation_level=None, check_same_thread=False)
    db.execute("pragma journal_mode=WAL")
    db.execute(f"pragma synchronous={sync}")
    db.executescript(_SCHEMA)
    return db


_INSERT = "insert into jobs(id, q, st, seq, env) values (?, 'q', 0, ?, ?)"


def sqlite_seq(d: Path, n: int, sync: str) -> float:
    db = sqlite_open(d, sync)
    jobs = [job(f"s{i}") for i in range(n)]
    samples = []
    pc = time.perf_counter
    t = pc()
    for i, j in enumerate(jobs):
        t0 = pc()
        db.execute(_INSERT, (j.id, i, j.envelope))  # autocommit: one transaction each
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    db.close()
    return n / el


async def sqlite_seq_hop(d: Path, n: int) -> float:
    db = sqlite_open(d, "FULL")
    jobs = [job(f"s{i}") for i in range(n)]
    samples = []
    pc = time.perf_counter
    t = pc()
    for i, j in enumerate(jobs):
        t0 = pc()
        await trio.to_thread.run_sync(db.execute, _INSERT, (j.id, i, j.envelope))
        samples.append(pc() - t0)
    el = pc() - t
    _keep(samples)
    db.close()
    return n / el


async def sqlite_concurrent(d: Path, n: int, tasks: int = 50) -> float:
    """50 tasks each awaiting one enqueue at a time; the inserts that arrive while a commit
    runs (in a worker thread) form the next transaction (group commit)."""
    db = sqlite_open(d, "FULL")
    pending: list[tuple[str, int, bytes]] = []
    state = {"running": False, "seq": 0}
    idle = [trio.Event()]

    def flush(rows: list[tuple[str, int, bytes]]) -> None:
        db.execute("begin")
        db.executemany(_INSERT, rows)
        db.execute("commit")

    async def enqueue(j: NewJob) -> None:
        state["seq"] += 1
        row = (j.id, state["seq"], j.envelope)
        pending.append(row)
        while True:
            if row not in pending:
                return  # a flush (now done) took it
            if state["running"]:
                await idle[0].wait()
                continue
            state["running"] = True
            idle[0] = trio.Event()
            rows = pending[:]
            pending.clear()
            try:
                await trio.to_thread.run_sync(flush, rows)
            finally:
                state["running"] = False
                idle[0].set()
            return

    per = n // tasks

    async def producer(k: int) -> None:
        for i in range(per):
            await enqueue(job(f"c{k}-{i}"))

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(producer, k)
    el = time.perf_counter() - t
    db.close()
    return per * tasks / el


def sqlite_batched(d: Path, n: int, batch: int = 1000) -> float:
    db = sqlite_open(d, "FULL")
    jobs = [job(f"b{i}") for i in range(n)]
    t = time.perf_counter()
    for s in range(0, n, batch):
        db.execute("begin")
        db.executemany(_INSERT, [(j.id, s + i, j.envelope) for i, j in enumerate(jobs[s : s + batch])])
        db.execute("commit")
    el = time.perf_counter() - t
    db.close()
    return n / el


def sqlite_processing(d: Path, n: int, batch: int = 100) -> float:
    db = sqlite_open(d, "FULL")
    db.execute("begin")
    db.executemany(_INSERT, [(f"p{i}", i, job(f"p{i}").envelope) for i in range(n)])
    db.execute("commit")
    t = time.perf_counter()
    done = 0
    k = 0
    while done < n:
        k += 1
        tok = f"t{k}"
        claims = db.execute(
            "update jobs set st = 1, worker = 'w', token = ? where id in "
            "(select id from jobs where q = 'q' and st = 0 order by seq limit ?) returning id, env",
            (tok, batch),
        ).fetchall()  # one statement: its own transaction
        db.execute("begin")
        cur = db.executemany(
            "update jobs set st = 2, result = ? where id = ? and token = ? and st = 1", [(b"1", c[0], tok) for c in claims]
        )
        db.execute("commit")
        done += cur.rowcount
    el = time.perf_counter() - t
    db.close()
    return n / el


# -- before/after: a workload run in a fresh process, by the tree on its PYTHONPATH ---------

_CHILD = {
    "seq": lambda d, n: trio.run(bench_sequential, d, n),
    "conc": lambda d, n: trio.run(bench_concurrent, d, n),
    "proc": lambda d, n: trio.run(bench_processing, d, n * 2),
}


def child(key: str, d: Path, n: int, profile: bool) -> None:
    """Run one workload and print its rate, the p50 of a call (sequential) and, with
    ``profile``, the Python calls per processed job."""
    out: dict[str, float] = {}
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        out["rate"] = _CHILD[key](d, n)
        pr.disable()
        out["calls"] = pstats.Stats(pr).total_calls / (n * 2)  # type: ignore[attr-defined]
    else:
        out["rate"] = _CHILD[key](d, n)
    if _LAST:
        out["p50"] = statistics.median(_LAST) * 1e6
    print(json.dumps(out))


def _run_child(tree: Path, key: str, d: Path, n: int, *, profile: bool = False, strace: Path | None = None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{h.HERE}")
    cmd = [sys.executable, __file__, "--child", key, "--dir", str(d), "--jobs", str(n), *(["--profile"] if profile else [])]
    if strace is not None:
        cmd = ["strace", "-f", "-c", "-o", str(strace), *cmd]
    res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


_SYSCALLS = ("link", "rename", "unlink", "unlinkat", "newfstatat", "openat", "fdatasync", "fsync")


def _strace_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def before_after(base: str, rounds: int, n: int, work: Path) -> list[str]:
    """The base revision against this tree, interleaved, each run in a fresh process."""
    titles = {"seq": "enqueue, 1 job per call, sequential", "conc": "enqueue, 1 job per call, 50 concurrent tasks",
              "proc": "processing: dequeue 100 + settle (complete), sequential"}
    with h.checkout(base) as old:
        trees = {"before": old / "python", "after": h.ROOT / "python"}
        rates: dict[str, list[float]] = {}
        p50s: dict[str, list[float]] = {}
        sides = [(k, t) for k in titles for t in trees]
        for r, (key, side) in h.interleaved(rounds, sides):
            got = _run_child(trees[side], key, work / f"ab-{key}-{side}-{r}", n)
            rates.setdefault(f"{key}@{side}", []).append(got["rate"])
            if "p50" in got:
                p50s.setdefault(f"{key}@{side}", []).append(got["p50"])
        counts: dict[str, dict[str, float]] = {}
        small = 50  # a short run's counts (process start, imports, the enqueue) are taken off
        for side, tree in trees.items():
            got = []
            for k in (n, small):
                trace = work / f"strace-{side}-{k}.txt"
                _run_child(tree, "proc", work / f"st-{side}-{k}", k, strace=trace)
                got.append(_strace_counts(trace))
            c = {k: got[0].get(k, 0) - got[1].get(k, 0) for k in got[0]}
            jobs = (n - small) * 2
            prof = _run_child(tree, "proc", work / f"pr-{side}", n, profile=True)
            counts[side] = {**{k: max(c.get(k, 0), 0) / jobs for k in _SYSCALLS}, "calls": prof["calls"],
                            "flushes": (c.get("fdatasync", 0) + c.get("fsync", 0)) / (jobs / 100)}
    m = h.spreads(rates)
    lat = h.spreads(p50s)
    rows = []
    for key, title in titles.items():
        b, a = m[f"{key}@before"], m[f"{key}@after"]
        rows.append([title, b.fmt(), a.fmt(), f"{a.median / b.median:.2f}"])
    for key in ("seq",):
        b, a = lat[f"{key}@before"], lat[f"{key}@after"]
        rows.append([titles[key] + ": p50 of a call, µs", b.fmt(",.0f"), a.fmt(",.0f"), f"{a.median / b.median:.2f}"])
    per_job = [[k, f"{counts['before'][k]:.2f}", f"{counts['after'][k]:.2f}"] for k in (*_SYSCALLS, "flushes", "calls")]
    return [
        "",
        f"## Before / after ({time.strftime('%Y-%m-%d')}): `{base}` against this tree, same run",
        "",
        f"{rounds} round(s), interleaved, each run a fresh process; medians (min–max); n = {n} "
        f"({n * 2} processed).",
        "",
        *h.table(["what", f"before ({base}), jobs/s", "after, jobs/s", "after / before"], rows, "lrrr"),
        "",
        f"Per processed job of the processing loop (claim 100 + settle 100), each side once: system calls "
        f"(`strace -f -c`; a run of {n * 2} jobs less a run of 100, so the process start and imports, "
        "fixed costs are taken off; the batched enqueue's 2 links a job stay in), flushes (`fdatasync` + `fsync`) per 100 jobs, Python calls "
        "(cProfile, the whole run incl. its enqueue). These do not move with the load.",
        "",
        *h.table(["per job", "before", "after"], per_job, "lrr"),
    ]


def main() -> None:
    p = h.parser(__doc__, out="file.md", rounds=1, jobs=5000)
    p.add_argument("--base", help="a git revision to compare this tree with (before/after section)")
    p.add_argument("--child", choices=sorted(_CHILD), help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    n = args.jobs
    if args.child:
        child(args.child, args.dir, n, args.profile)
        return
    sides: dict[str, tuple[str, Callable[[Path], float]]] = {
        "base": ("baseline: plain loop, one fsynced file per job", lambda d: baseline(d, n)),
        "seq": ("enqueue, 1 job per call, sequential", lambda d: trio.run(bench_sequential, d, n)),
        "seq_old": ("enqueue, sequential, markers' directories flushed too (the code before)",
                    lambda d: bench_sequential_lanes_flushed(d, n)),
        "conc": ("enqueue, 1 job per call, 50 concurrent tasks (group commit)", lambda d: trio.run(bench_concurrent, d, n)),
        "batch": ("enqueue, batches of 1000", lambda d: trio.run(bench_batched, d, n * 4)),
        "proc": ("processing: dequeue 100 + settle (complete), sequential", lambda d: trio.run(bench_processing, d, n * 2)),
        "nofsync": ("enqueue, 1 job per call, sequential, fsync=False",
                    lambda d: trio.run(bench_sequential, d, n, False)),
        "f_new": ("floor (a): new small file + fdatasync + directory fsync", lambda d: floor_new_file(d, n)),
        "f_link": ("floor (a'): hard link + directory fsync (a marker)", lambda d: floor_link(d, n)),
        "f_app": ("floor (b): write into a preallocated log + fdatasync", lambda d: floor_append(d, n)),
        "f_flusher": ("floor (b), awaited: the log written and fdatasynced by a dedicated flusher thread",
                      lambda d: trio.run(floor_log_flusher, d, n)),
        "f_hop": ("floor: an awaited no-op in a worker thread (trio.to_thread)", lambda d: trio.run(floor_hop, n)),
        "sq_seq": ("SQLite WAL, synchronous=FULL: insert, 1 per transaction, sequential", lambda d: sqlite_seq(d, n, "FULL")),
        "sq_hop": ("SQLite WAL, FULL: the same, each awaited in a worker thread", lambda d: trio.run(sqlite_seq_hop, d, n)),
        "sq_norm": ("SQLite WAL, synchronous=NORMAL (not power-loss durable): insert, sequential",
                    lambda d: sqlite_seq(d, n, "NORMAL")),
        "sq_conc": ("SQLite WAL, FULL: 50 concurrent tasks (group commit)", lambda d: trio.run(sqlite_concurrent, d, n)),
        "sq_batch": ("SQLite WAL, FULL: batches of 1000", lambda d: sqlite_batched(d, n * 4)),
        "sq_proc": ("SQLite WAL, FULL: claim 100 (UPDATE ... RETURNING) + settle 100", lambda d: sqlite_processing(d, n * 2)),
    }
    rates: dict[str, list[float]] = {k: [] for k in sides}
    p50s: dict[str, list[float]] = {}  # per sequential side: each round's median time per call
    work = Path(tempfile.mkdtemp(prefix="bench-file-", dir=h.HERE))
    try:
        for r, key in h.interleaved(args.rounds, list(sides)):
            _LAST.clear()
            rates[key].append(sides[key][1](work / f"{key}{r}"))
            if _LAST:
                p50s.setdefault(key, []).append(statistics.median(_LAST) * 1e6)
        p50, p99 = trio.run(bench_latency, work / "lat", max(20, n // 16))
        ab = before_after(args.base, args.rounds, n, work) if args.base else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = h.spreads(rates)
    lat = h.spreads(p50s)
    lines = [
        f"File system of the repository (fsync on unless stated); {args.rounds} round(s), interleaved, medians "
        f"(min–max). n = {n} jobs per enqueue run ({n * 4} batched, {n * 2} processed).",
        "",
        *h.table(["what", "jobs/s", "ratio to baseline"],
                 [[title, m[k].fmt(), f"{m[k] / m['base']:.2f}"] for k, (title, _) in sides.items()], "lrr"),
        "",
        "One call at a time, each timed: the median time of a call (µs; the median over the rounds "
        "of each round's median, min–max), less swayed by the other programs' bursts on the shared disk than the rates above.",
        "",
        *h.table(["one call at a time", "p50 µs", "calls/s at that p50"],
                 [[sides[k][0], lat[k].fmt(",.0f"), f"{1e6 / lat[k].median:,.0f}"] for k in sides if k in lat], "lrr"),
        "",
        "Dequeue latency on an idle queue (a consumer blocked in `dequeue`, woken by inotify; "
        "from just before `enqueue` to the claim's return; the marker is visible before the enqueue's group-commit fsync ends):",
        "",
        f"- p50: {p50:.2f} ms",
        f"- p99: {p99:.2f} ms",
        *ab,
    ]
    h.write(args, "FileStorage benchmark", lines)


if __name__ == "__main__":
    main()
