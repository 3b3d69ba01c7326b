"""procrastinate running the workloads of ``trioqueue bench`` on PostgreSQL (same names, same
JSON shape), in a process of its own (procrastinate is asyncio), for
``benches/bench_postgres_peers.py``.

    python procrastinate_bench.py --url postgresql://... [--jobs 5000] [--concurrency 100]
                                  [--payload-bytes 52] [--workloads A-seq,...] [--json out.json]

How the workloads map onto procrastinate's API:

- A-seq: awaited ``defer_async`` calls; A-batch: ``batch_defer_async``, 1000 jobs a call;
- B: the jobs deferred first, then ``run_worker_async(concurrency=100, wait=False)``, which
  returns once the queue is empty and every job has finished (LISTEN/NOTIFY on, its default);
- C-1 / C-50: procrastinate has no request/response call. A worker runs in the background;
  the caller defers, learns in-process that the task ran (a hook this process owns, no
  database round trip) and reads the job's status (``get_job_status_async``) every
  millisecond until it is stored ``succeeded``. This favours procrastinate (a waiter in
  another process would need a poll of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import platform
import time
import uuid
from importlib.metadata import version

import procrastinate

logging.getLogger("procrastinate").setLevel(logging.WARNING)


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-len(s) * p // 100) - 1))]  # type: ignore[call-overload]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.payload = {"d": "x" * (args.payload_bytes - len('{"d":""}'))}
        self.run_id = uuid.uuid4().hex[:8]
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.url))
        self.ran: dict[int, asyncio.Future[None] | None] = {}

        @self.app.task(name="noop", pass_context=True)
        async def noop(context: procrastinate.JobContext, d: str) -> None:
            job_id = context.job.id
            fut = self.ran.get(job_id)
            if fut is None:
                self.ran[job_id] = None  # ran before its caller registered
            elif not fut.done():
                fut.set_result(None)

        self.task = noop

    def queue(self, w: str) -> str:
        return f"bench_{self.run_id}_{w}"

    async def enqueue_seq(self) -> dict:
        t = self.task.configure(queue=self.queue("A-seq"))
        n = self.args.jobs
        t0 = time.perf_counter()
        for _ in range(n):
            await t.defer_async(**self.payload)
        s = time.perf_counter() - t0
        return {"workload": "A-seq", "jobs": n, "seconds": s, "rate": n / s}

    async def fill(self, q: str, n: int, size: int = 1000) -> None:
        t = self.task.configure(queue=q)
        for s in range(0, n, size):
            await t.batch_defer_async(*[self.payload] * min(size, n - s))

    async def enqueue_batch(self) -> dict:
        n = self.args.jobs
        t0 = time.perf_counter()
        await self.fill(self.queue("A-batch"), n)
        s = time.perf_counter() - t0
        return {"workload": "A-batch", "jobs": n, "seconds": s, "rate": n / s}

    async def processing(self) -> dict:
        q, n = self.queue("B"), self.args.jobs
        await self.fill(q, n)
        t0 = time.perf_counter()
        await self.app.run_worker_async(
            queues=[q], concurrency=self.args.concurrency, wait=False, install_signal_handlers=False
        )
        s = time.perf_counter() - t0
        return {"workload": "B", "jobs": n, "seconds": s, "rate": n / s, "extra": {"concurrency": self.args.concurrency}}

    async def request_response(self, w: str, callers: int) -> dict:
        q = self.queue(w)
        n = max(callers, self.args.jobs // (20 if callers == 1 else 4))
        per = n // callers
        t = self.task.configure(queue=q)
        worker = asyncio.create_task(
            self.app.run_worker_async(
                queues=[q], concurrency=max(callers, self.args.concurrency), install_signal_handlers=False
            )
        )
        await asyncio.sleep(0.5)  # the worker is listening
        lat: list[float] = []

        async def request() -> None:
            job_id = await t.defer_async(**self.payload)
            if job_id not in self.ran:
                fut = asyncio.get_running_loop().create_future()
                self.ran[job_id] = fut
                await fut
            del self.ran[job_id]
            while await self.app.job_manager.get_job_status_async(job_id) != procrastinate.jobs.Status.SUCCEEDED:
                await asyncio.sleep(0.001)

        async def caller() -> None:
            for _ in range(per):
                t1 = time.perf_counter()
                await request()
                lat.append(time.perf_counter() - t1)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        s = time.perf_counter() - t0
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        return {
            "workload": w, "jobs": len(lat), "seconds": s, "rate": len(lat) / s,
            "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000, "extra": {"callers": callers},
        }

    async def run(self) -> dict:
        runs = {
            "A-seq": self.enqueue_seq,
            "A-batch": self.enqueue_batch,
            "B": self.processing,
            "C-1": lambda: self.request_response("C-1", 1),
            "C-50": lambda: self.request_response("C-50", 50),
        }
        results = []
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()
            for w in self.args.workloads.split(","):
                r = {"p50_ms": None, "p99_ms": None, "extra": {}, **await asyncio.wait_for(runs[w](), 600)}
                results.append(r)
                print(f"{w}: {r['rate']:.0f}/s", flush=True)
        return {
            "tool": "procrastinate", "version": version("procrastinate"), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "jobs": self.args.jobs,
            "concurrency": self.args.concurrency, "payload_bytes": self.args.payload_bytes, "results": results,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--payload-bytes", type=int, default=52)
    ap.add_argument("--workloads", default="A-seq,A-batch,B,C-1,C-50")
    ap.add_argument("--json")
    args = ap.parse_args()
    doc = asyncio.run(Bench(args).run())
    text = json.dumps(doc, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
