"""FileStorage throughput and latency, with a plain fsynced-file-per-job baseline.

    python benches/bench_file.py [--jobs 5000] [--rounds 1]

Writes benches/results/file.md. Every figure is measured in this run on this machine, in
a temporary directory on the same file system as the repository (not tmpfs); with several
rounds, the baseline and each measure are interleaved and the medians (min–max) kept.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

import _harness as h
from trioqueue._core import encode_envelope
from trioqueue.storage import FileStorage, NewJob, Settlement, SettleKind


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
        t = time.perf_counter()
        for j in jobs:
            await st.enqueue("q", [j])
        return n / (time.perf_counter() - t)


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


def main() -> None:
    args = h.parser(__doc__, out="file.md", rounds=1, jobs=5000).parse_args()
    n = args.jobs
    sides: dict[str, tuple[str, Callable[[Path], float]]] = {
        "base": ("baseline: plain loop, one fsynced file per job", lambda d: baseline(d, n)),
        "seq": ("enqueue, 1 job per call, sequential", lambda d: trio.run(bench_sequential, d, n)),
        "conc": ("enqueue, 1 job per call, 50 concurrent tasks (group commit)", lambda d: trio.run(bench_concurrent, d, n)),
        "batch": ("enqueue, batches of 1000", lambda d: trio.run(bench_batched, d, n * 4)),
        "proc": ("processing: dequeue 100 + settle (complete), sequential", lambda d: trio.run(bench_processing, d, n * 2)),
        "nofsync": ("enqueue, 1 job per call, sequential, fsync=False",
                    lambda d: trio.run(bench_sequential, d, n, False)),
    }
    rates: dict[str, list[float]] = {k: [] for k in sides}
    work = Path(tempfile.mkdtemp(prefix="bench-file-", dir=h.HERE))
    try:
        for r, key in h.interleaved(args.rounds, list(sides)):
            rates[key].append(sides[key][1](work / f"{key}{r}"))
        p50, p99 = trio.run(bench_latency, work / "lat", max(20, n // 16))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = h.spreads(rates)
    lines = [
        f"File system of the repository (fsync on unless stated); {args.rounds} round(s), interleaved, medians "
        f"(min–max). n = {n} jobs per enqueue run ({n * 4} batched, {n * 2} processed).",
        "",
        *h.table(["what", "jobs/s", "ratio to baseline"],
                 [[title, m[k].fmt(), f"{m[k] / m['base']:.2f}"] for k, (title, _) in sides.items()], "lrr"),
        "",
        "Dequeue latency on an idle queue (a consumer blocked in `dequeue`, woken by inotify; "
        "from just before `enqueue` to the claim's return; the marker is visible before the enqueue's group-commit fsync ends):",
        "",
        f"- p50: {p50:.2f} ms",
        f"- p99: {p99:.2f} ms",
    ]
    h.write(args, "FileStorage benchmark", lines)


if __name__ == "__main__":
    main()
