"""``trioqueue demo``: a realistic workload with a live progress bar and a closing summary.

Thousands of jobs go through one Queue at a chosen concurrency: handlers take a few
milliseconds, some fail an attempt and are retried, a few fail for good, and a share of the
jobs are request/response calls (``enqueue_and_wait``) whose latency is measured.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any

import trio

from .._model._errors import JobFailedError, ValidationError
from .._model._types import Job, QueueEvent
from ._progress import Progress, percentile
from .._supervision._queue import Queue
from ..storage import MemoryStorage, Storage


async def run_demo(
    *,
    jobs: int = 5000,
    concurrency: int = 50,
    request_share: float = 0.1,
    fail_rate: float = 0.05,
    fatal_rate: float = 0.01,
    storage: Storage | None = None,
    seed: int = 1,
    run_id: str | None = None,
    out: Any = sys.stdout,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the workload and return the summary figures (also printed to ``out``).

    Job ids are ``demo-<run_id>-<n>`` with a fresh ``run_id`` per run (unless given), so a
    rerun on the same storage runs new jobs instead of meeting the last run's cached ones.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValidationError(f"jobs must be a positive integer, got {jobs!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValidationError(f"concurrency must be a positive integer, got {concurrency!r}")
    run_id = run_id or uuid.uuid4().hex[:8]
    rng = random.Random(seed)
    storage = storage or MemoryStorage()
    plan = []  # (id, payload, is_request)
    for i in range(jobs):
        roll = rng.random()
        kind = "fatal" if roll < fatal_rate else "flaky" if roll < fatal_rate + fail_rate else "ok"
        job_id = f"demo-{run_id}-{i}"
        plan.append((job_id, {"n": i, "kind": kind, "work_ms": rng.uniform(0.2, 3.0)}, rng.random() < request_share))

    async def handler(job: Job[dict[str, Any]]) -> dict[str, Any]:
        await trio.sleep(job.payload["work_ms"] / 1000)
        if job.payload["kind"] == "fatal":
            raise ValueError(f"job {job.id}: invalid input (fails every attempt)")
        if job.payload["kind"] == "flaky" and job.attempts == 1:
            raise ConnectionError(f"job {job.id}: transient error on attempt 1")
        return {"n": job.payload["n"], "square": job.payload["n"] ** 2}

    # Terminal outcomes by id (events may repeat after a resync re-read: count each id once).
    unfinished = {job_id for job_id, _, _ in plan}
    outcome: dict[str, str] = {}
    retries = 0
    finished = trio.Event()
    recheck = trio.Event()
    bar = Progress(jobs) if progress else None

    def settle(job_id: str | None, kind: str) -> None:
        if job_id in unfinished:
            unfinished.discard(job_id)
            outcome[job_id] = kind
            if not unfinished:
                finished.set()

    def on_event(ev: QueueEvent) -> None:
        nonlocal retries
        if ev.name == "failing":
            retries += 1
        elif ev.name == "resync":  # events may have been lost: re-read what is still open
            recheck.set()
        else:
            settle(ev.job_id, ev.name)

    latencies: list[float] = []
    request_failures = 0
    start = time.perf_counter()
    async with AsyncExitStack() as stack:
        queue: Queue[dict[str, Any], Any] = Queue(
            storage, name="demo", handler=handler, concurrency=concurrency, max_attempts=3, retry_delay=0.05
        )
        for name in ("completed", "failed", "failing", "resync"):
            queue.on(name, on_event)
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

        async def rechecker() -> None:
            nonlocal recheck
            while True:
                await recheck.wait()
                recheck = trio.Event()
                for job_id in list(unfinished):
                    status = await queue.get_status(job_id)
                    if status is not None and status.state.terminal:
                        settle(job_id, status.state.value)

        async def draw() -> None:
            while True:
                if bar is not None:
                    bar.draw(jobs - len(unfinished), _note(_failed(outcome), retries))
                await trio.sleep(0.1 if bar is None or bar.tty else 1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(draw)
            nursery.start_soon(rechecker)
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
    failed = _failed(outcome)
    if bar is not None:
        bar.draw(jobs - len(unfinished), _note(failed, retries), final=True)
    summary = {
        "run_id": run_id,
        "jobs": jobs,
        "completed": sum(1 for k in outcome.values() if k == "completed"),
        "failed": failed,
        "retries": retries,
        "seconds": elapsed,
        "jobs_per_s": jobs / elapsed,
        "requests": len(latencies),
        "request_failures": request_failures,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }
    if latencies:
        rr = (
            f"request/response: {summary['requests']} calls, latency p50 {summary['p50_ms']:.2f} ms, "
            f"p99 {summary['p99_ms']:.2f} ms ({request_failures} raised JobFailedError)"
        )
    else:
        rr = "request/response: no calls"
    print(
        f"\n{summary['jobs']} jobs on {type(storage).__name__} at concurrency {concurrency}: "
        f"{summary['completed']} completed, {summary['failed']} failed for good, "
        f"{summary['retries']} retried attempts\n"
        f"throughput {summary['jobs_per_s']:.0f} jobs/s over {elapsed:.2f} s\n{rr}",
        file=out,
    )
    return summary


def _note(failed: int, retries: int) -> str:
    return f"retries {retries:<5} failed {failed:<4}"


def _failed(outcome: dict[str, str]) -> int:
    return sum(1 for k in outcome.values() if k == "failed")


def _make_storage(kind: str, location: str | None) -> tuple[Storage, tempfile.TemporaryDirectory[str] | None]:
    if kind == "memory":
        return MemoryStorage(), None
    if kind == "file":
        from ..storage.file import FileStorage

        tmp = None
        if location is None:
            tmp = tempfile.TemporaryDirectory(prefix="trioqueue-demo-")
            location = tmp.name
        return FileStorage(location), tmp
    if kind == "redis":
        from ..storage.redis import RedisStorage

        return RedisStorage(location or "redis://127.0.0.1:6379/0", prefix="trioqueue-demo"), None
    if kind == "postgres" and location is not None:
        from urllib.parse import parse_qs, urlsplit

        from ..storage import from_url

        named = "schema" in parse_qs(urlsplit(location).query)
        return from_url(location, **({} if named else {"schema": "trioqueue_demo"})), None
    raise ValidationError(f"unknown storage {kind!r}")


async def demo_command(args: argparse.Namespace) -> int:
    """``trioqueue demo``: exit code 0 when every job was accounted for."""
    storage, tmp = _make_storage(args.storage, args.location)
    try:
        summary = await run_demo(
            jobs=args.jobs, concurrency=args.concurrency, storage=storage, progress=not args.no_progress
        )
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0 if summary["completed"] + summary["failed"] == summary["jobs"] else 1
