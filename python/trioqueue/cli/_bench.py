"""``trioqueue bench``: the standard workloads against any storage URL.

The workloads are the ones the project compares with its peers (BullMQ, pg-boss and the Python
queues), so that a figure here and one from ``benches/bullmq/bench.mjs`` mean the same:

- ``A-seq``   awaited ``enqueue`` calls one after another from one task;
- ``A-100``   ``enqueue`` calls from 100 tasks at once (100 in flight);
- ``A-batch`` ``enqueue_many``, 1000 jobs a call;
- ``B``       one worker (this process) at ``--concurrency``, noop handler: jobs enqueued
  first, then the time until every one is stored completed;
- ``B-1ms``   the same with a handler that awaits 1 ms;
- ``B-batch`` the same with a noop ``batch_handler`` taking ``--concurrency`` jobs a call
  (how pg-boss's ``work()`` with ``batchSize`` runs its B);
- ``C-1``     ``enqueue_and_wait`` from one caller (p50/p99 latency);
- ``C-50``    ``enqueue_and_wait`` from 50 callers at once (requests/s).

Each workload runs on a queue of its own (``bench-<run>-<workload>``) and leaves its jobs
behind with a short result TTL. Figures drift on a shared machine: compare ratios measured
in the same run, not figures from different runs.

The comparisons built on it (interleaved rounds against a peer or a git revision, medians
with min–max, the commit and machine in each result file) are the scripts of the
repository's ``benches/``; ``benches/README.md`` says which script writes which file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from .._model._errors import ValidationError
from .._model._types import Job
from ._progress import Progress, percentile
from ._run import storage_url
from .._supervision._queue import Queue
from ..storage import Storage, from_url

__all__ = ["WORKLOADS", "BenchResult", "run_bench", "bench_command", "payload_of_size"]

WORKLOADS = ("A-seq", "A-100", "A-batch", "B", "B-1ms", "B-batch", "C-1", "C-50")
_RESULT_TTL = 120.0  # seconds the benchmark's finished jobs are kept


@dataclass
class BenchResult:
    """One workload's figures: ``rate`` is jobs (or requests) per second; latencies in ms."""

    workload: str
    jobs: int
    seconds: float
    rate: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def payload_of_size(size: int) -> dict[str, str]:
    """A JSON object whose serialization by the default :class:`JsonSerde` is ``size``
    bytes (at least 10)."""
    if size < 10:
        raise ValidationError(f"payload-bytes must be at least 10, got {size}")
    return {"d": "x" * (size - len('{"d":""}'))}


async def _noop(job: Job[Any]) -> None:
    return None


async def _sleep_1ms(job: Job[Any]) -> None:
    await trio.sleep(0.001)


async def _noop_batch(jobs: list[Job[Any]]) -> list[None]:
    return [None] * len(jobs)


class _Bench:
    def __init__(self, storage: Storage, jobs: int, concurrency: int, payload: Any, progress: bool) -> None:
        self.storage = storage
        self.jobs = jobs
        self.concurrency = concurrency
        self.payload = payload
        self.progress = progress
        self.run_id = uuid.uuid4().hex[:8]

    def _queue(self, workload: str, handler: Callable[[Job[Any]], Awaitable[Any]] | None = None, **kw: Any) -> Queue[Any, Any]:
        return Queue(
            self.storage,
            name=f"bench-{self.run_id}-{workload}",
            handler=handler,
            result_ttl=_RESULT_TTL,
            **kw,
        )

    async def _tracked(self, label: str, total: int, body: Callable[[list[int]], Awaitable[None]]) -> float:
        """Run ``body(done)`` (it bumps ``done[0]``) with a progress bar; its seconds."""
        done = [0]
        bar = Progress(total, label) if self.progress else None
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if bar is not None:

                async def draw() -> None:
                    while True:
                        bar.draw(done[0])
                        await trio.sleep(0.1 if bar.tty else 2.0)

                nursery.start_soon(draw)
            await body(done)
            nursery.cancel_scope.cancel()
        elapsed = time.perf_counter() - t0
        if bar is not None:
            bar.draw(done[0], final=True)
        return elapsed

    async def enqueue_seq(self) -> BenchResult:
        async with self._queue("A-seq") as q:

            async def body(done: list[int]) -> None:
                for i in range(self.jobs):
                    await q.enqueue(f"s{i}", self.payload)
                    done[0] += 1

            seconds = await self._tracked("A-seq", self.jobs, body)
        return BenchResult("A-seq", self.jobs, seconds, self.jobs / seconds)

    async def enqueue_concurrent(self, tasks: int = 100) -> BenchResult:
        per = max(1, self.jobs // tasks)
        async with self._queue("A-100") as q:

            async def one(k: int, done: list[int]) -> None:
                for i in range(per):
                    await q.enqueue(f"c{k}-{i}", self.payload)
                    done[0] += 1

            async def body(done: list[int]) -> None:
                async with trio.open_nursery() as nursery:
                    for k in range(tasks):
                        nursery.start_soon(one, k, done)

            seconds = await self._tracked("A-100", per * tasks, body)
        return BenchResult("A-100", per * tasks, seconds, per * tasks / seconds)

    async def enqueue_batch(self, size: int = 1000) -> BenchResult:
        items = [(f"b{i}", self.payload) for i in range(self.jobs)]
        async with self._queue("A-batch") as q:

            async def body(done: list[int]) -> None:
                for s in range(0, self.jobs, size):
                    await q.enqueue_many(items[s : s + size])
                    done[0] += len(items[s : s + size])

            seconds = await self._tracked("A-batch", self.jobs, body)
        return BenchResult("A-batch", self.jobs, seconds, self.jobs / seconds)

    async def processing(
        self, workload: str, handler: Callable[[Job[Any]], Awaitable[Any]] | None, **consumer_kw: Any
    ) -> BenchResult:
        n = self.jobs
        async with self._queue(workload) as producer:
            items = [(f"p{i}", self.payload) for i in range(n)]
            for s in range(0, n, 1000):
                await producer.enqueue_many(items[s : s + 1000])
        finished = trio.Event()
        counter = [0]
        # B-batch: one batch of ``concurrency`` jobs at a time (``concurrency`` jobs in flight)
        concurrency = 1 if consumer_kw.pop("batch_concurrency", False) else self.concurrency
        consumer = self._queue(workload, handler, concurrency=concurrency, reaper=False, **consumer_kw)

        def completed(_: object) -> None:
            counter[0] += 1
            if counter[0] >= n:
                finished.set()

        consumer.on("completed", completed)

        async def body(done: list[int]) -> None:
            async with consumer:
                while not finished.is_set():
                    done[0] = counter[0]
                    with trio.move_on_after(0.05):
                        await finished.wait()
                done[0] = counter[0]

        seconds = await self._tracked(workload, n, body)
        return BenchResult(workload, n, seconds, n / seconds, extra={"concurrency": self.concurrency})

    async def request_response(self, workload: str, callers: int) -> BenchResult:
        n = max(callers, self.jobs // (20 if callers == 1 else 4))
        per = n // callers
        latencies: list[float] = []
        async with self._queue(workload, _noop, concurrency=max(callers, self.concurrency)) as q:

            async def caller(k: int, done: list[int]) -> None:
                for i in range(per):
                    t = time.perf_counter()
                    await q.enqueue_and_wait(f"w{k}-{i}", self.payload, timeout=60)
                    latencies.append(time.perf_counter() - t)
                    done[0] += 1

            async def body(done: list[int]) -> None:
                async with trio.open_nursery() as nursery:
                    for k in range(callers):
                        nursery.start_soon(caller, k, done)

            seconds = await self._tracked(workload, per * callers, body)
        return BenchResult(
            workload,
            len(latencies),
            seconds,
            len(latencies) / seconds,
            p50_ms=percentile(latencies, 50) * 1000,
            p99_ms=percentile(latencies, 99) * 1000,
            extra={"callers": callers},
        )

    async def run(self, workload: str) -> BenchResult:
        if workload == "A-seq":
            return await self.enqueue_seq()
        if workload == "A-100":
            return await self.enqueue_concurrent()
        if workload == "A-batch":
            return await self.enqueue_batch()
        if workload == "B":
            return await self.processing("B", _noop)
        if workload == "B-1ms":
            return await self.processing("B-1ms", _sleep_1ms)
        if workload == "B-batch":
            return await self.processing(
                "B-batch", None, batch_handler=_noop_batch, batch_size=self.concurrency, batch_concurrency=True
            )
        if workload == "C-1":
            return await self.request_response("C-1", 1)
        if workload == "C-50":
            return await self.request_response("C-50", 50)
        raise ValidationError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")


async def run_bench(
    storage: Storage,
    workloads: Sequence[str] = WORKLOADS,
    *,
    jobs: int = 20_000,
    concurrency: int = 100,
    payload_bytes: int = 52,
    progress: bool = False,
) -> list[BenchResult]:
    """Run ``workloads`` (names from :data:`WORKLOADS`) on ``storage`` in order."""
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValidationError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if jobs < 100:
        raise ValidationError(f"jobs must be at least 100, got {jobs}")
    bench = _Bench(storage, jobs, concurrency, payload_of_size(payload_bytes), progress)
    async with storage:
        return [await bench.run(w) for w in workloads]


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as a plain text table."""
    rows = [("workload", "jobs", "seconds", "rate/s", "p50 ms", "p99 ms")]
    for r in results:
        rows.append(
            (
                r.workload,
                f"{r.jobs}",
                f"{r.seconds:.2f}",
                f"{r.rate:,.0f}",
                "" if r.p50_ms is None else f"{r.p50_ms:.2f}",
                "" if r.p99_ms is None else f"{r.p99_ms:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows)


def _redacted(url: str) -> str:
    """The URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


async def bench_command(args: argparse.Namespace) -> int:
    """``trioqueue bench``: print the table, write JSON when asked."""
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    storage = from_url(args.storage)
    results = await run_bench(
        storage,
        workloads,
        jobs=args.jobs,
        concurrency=args.concurrency,
        payload_bytes=args.payload_bytes,
        progress=not args.no_progress,
    )
    print(f"trioqueue bench on {_redacted(args.storage)} ({type(storage).__name__}), {args.jobs} jobs, "
          f"concurrency {args.concurrency}, payload {args.payload_bytes} B")
    print(format_table(results))
    if args.json:
        from importlib.metadata import version

        doc = {
            "tool": "trioqueue",
            "version": version("trioqueue"),
            "storage": _redacted(args.storage),
            "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "jobs": args.jobs,
            "concurrency": args.concurrency,
            "payload_bytes": args.payload_bytes,
            "results": [asdict(r) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default, and the description's lines (the list of workloads) as written."""


def add_parser(sub: Any, positive_int: Callable[[str], int]) -> None:
    """The ``bench`` subcommand's arguments."""
    p = sub.add_parser(
        "bench",
        help="run the standard workloads (A: enqueue, B: processing, C: request/response) on a storage",
        description="\n\n".join(__doc__.replace("``", "").split("\n\n")[1:]) if __doc__ else None,
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--storage", type=storage_url, default="memory://",
                   help="storage URL (memory://, file:///dir, redis://host:port, postgresql://host/db)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated workloads to run")
    p.add_argument("--jobs", type=positive_int, default=20_000, help="jobs per throughput workload")
    p.add_argument("--concurrency", type=positive_int, default=100, help="worker concurrency (B, C)")
    p.add_argument("--payload-bytes", type=positive_int, default=52, help="size of each JSON payload")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: trioqueue bench --help")
