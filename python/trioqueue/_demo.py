"""``trioqueue demo``: a realistic workload with a live progress bar and a closing summary.

Thousands of jobs go through one Queue at a chosen concurrency: handlers take a few
milliseconds, some fail an attempt and are retried, a few fail for good, and a share of the
jobs are request/response calls (``enqueue_and_wait``) whose latency is measured.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import trio

from ._errors import JobFailedError
from ._models import Job, QueueEvent
from ._queue import Queue
from .storage import MemoryStorage, Storage


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


class _Progress:
    """A one-line progress bar on stderr (plain periodic lines when not a terminal)."""

    def __init__(self, total: int, stream: Any = sys.stderr) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()

    def draw(self, done: int, failed: int, retries: int, final: bool = False) -> None:
        elapsed = time.perf_counter() - self.started
        frac = done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done / elapsed if elapsed > 0 else 0.0
        line = (
            f"[{bar}] {done:>6}/{self.total} {frac:6.1%}  {rate:8.0f} jobs/s  "
            f"retries {retries:<5} failed {failed:<4}"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


async def run_demo(
    *,
    jobs: int = 5000,
    concurrency: int = 50,
    request_share: float = 0.1,
    fail_rate: float = 0.05,
    fatal_rate: float = 0.01,
    storage: Storage | None = None,
    seed: int = 1,
    out: Any = sys.stdout,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the workload and return the summary figures (also printed to ``out``)."""
    rng = random.Random(seed)
    storage = storage or MemoryStorage()
    plan = []  # (id, payload, is_request)
    for i in range(jobs):
        roll = rng.random()
        kind = "fatal" if roll < fatal_rate else "flaky" if roll < fatal_rate + fail_rate else "ok"
        plan.append((f"demo-{i}", {"n": i, "kind": kind, "work_ms": rng.uniform(0.2, 3.0)}, rng.random() < request_share))

    async def handler(job: Job[dict[str, Any]]) -> dict[str, Any]:
        await trio.sleep(job.payload["work_ms"] / 1000)
        if job.payload["kind"] == "fatal":
            raise ValueError(f"job {job.id}: invalid input (fails every attempt)")
        if job.payload["kind"] == "flaky" and job.attempts == 1:
            raise ConnectionError(f"job {job.id}: transient error on attempt 1")
        return {"n": job.payload["n"], "square": job.payload["n"] ** 2}

    counts: Counter[str] = Counter()
    finished = trio.Event()
    bar = _Progress(jobs) if progress else None

    def count(ev: QueueEvent) -> None:
        counts[ev.name] += 1
        if counts["completed"] + counts["failed"] >= jobs:
            finished.set()

    latencies: list[float] = []
    request_failures = 0
    start = time.perf_counter()
    async with AsyncExitStack() as stack:
        queue: Queue[dict[str, Any], Any] = Queue(storage, name="demo", handler=handler, concurrency=concurrency, max_attempts=3, retry_delay=0.05)
        for name in ("completed", "failed", "failing"):
            queue.on(name, count)
        await stack.enter_async_context(queue)

        async def requester(batch: list[tuple[str, Any, bool]]) -> None:
            nonlocal request_failures
            for job_id, payload, _ in batch:
                t0 = time.perf_counter()
                try:
                    await queue.enqueue_and_wait(job_id, payload, timeout=60)
                except JobFailedError:
                    request_failures += 1
                latencies.append(time.perf_counter() - t0)

        async def draw() -> None:
            while True:
                if bar is not None:
                    bar.draw(counts["completed"] + counts["failed"], counts["failed"], counts["failing"])
                await trio.sleep(0.1 if bar is None or bar.tty else 1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(draw)
            fire = [(i, p) for i, p, req in plan if not req]
            requests = [t for t in plan if t[2]]
            for k in range(min(10, len(requests))):
                nursery.start_soon(requester, requests[k::10])
            for s in range(0, len(fire), 500):
                await queue.enqueue_many(fire[s : s + 500])
            with trio.fail_after(600):
                await finished.wait()
            nursery.cancel_scope.cancel()
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.draw(counts["completed"] + counts["failed"], counts["failed"], counts["failing"], final=True)
    summary = {
        "jobs": jobs,
        "completed": counts["completed"],
        "failed": counts["failed"],
        "retries": counts["failing"],
        "seconds": elapsed,
        "jobs_per_s": jobs / elapsed,
        "requests": len(latencies),
        "request_failures": request_failures,
        "p50_ms": _percentile(latencies, 50) * 1000,
        "p99_ms": _percentile(latencies, 99) * 1000,
    }
    print(
        f"\n{summary['jobs']} jobs on {type(storage).__name__} at concurrency {concurrency}: "
        f"{summary['completed']} completed, {summary['failed']} failed for good, "
        f"{summary['retries']} retried attempts\n"
        f"throughput {summary['jobs_per_s']:.0f} jobs/s over {elapsed:.2f} s\n"
        f"request/response: {summary['requests']} calls, latency p50 {summary['p50_ms']:.2f} ms, "
        f"p99 {summary['p99_ms']:.2f} ms ({request_failures} raised JobFailedError)",
        file=out,
    )
    return summary


def _make_storage(kind: str, directory: str | None) -> tuple[Storage, Any]:
    if kind == "memory":
        return MemoryStorage(), None
    if kind == "file":
        from .storage.file import FileStorage

        tmp = None
        if directory is None:
            tmp = tempfile.TemporaryDirectory(prefix="trioqueue-demo-")
            directory = tmp.name
        return FileStorage(directory), tmp
    if kind == "redis":
        from .storage.redis import RedisStorage

        return RedisStorage(directory or "redis://127.0.0.1:6379/0", prefix="trioqueue-demo"), None
    raise SystemExit(f"unknown storage {kind!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trioqueue", description="trioqueue command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a realistic workload and print a summary")
    demo.add_argument("--jobs", type=int, default=5000)
    demo.add_argument("--concurrency", type=int, default=50)
    demo.add_argument("--storage", choices=["memory", "file", "redis"], default=DEFAULT_STORAGE)
    demo.add_argument("--location", default=None, help="directory (file) or URL (redis)")
    demo.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    storage, tmp = _make_storage(args.storage, args.location)
    try:
        summary = trio.run(
            lambda: run_demo(
                jobs=args.jobs, concurrency=args.concurrency, storage=storage, progress=not args.no_progress
            )
        )
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0 if summary["completed"] + summary["failed"] == summary["jobs"] else 1


DEFAULT_STORAGE = "file"  # the embedded, durable default (a temporary directory unless --location)
