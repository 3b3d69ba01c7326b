"""What a long transaction elsewhere in the database does to PostgresStorage: the same
jobs run through a queue twice on one server started here, once with nothing else
running, then while another session holds a snapshot open (``BEGIN ISOLATION LEVEL
REPEATABLE READ`` and one read: the xmin horizon stays where it was), connected to the
queue's database, then to another database of the same server. Reports the
throughput of each slice of jobs, the latency of one-job claims at the end, and what
``VACUUM`` can and cannot remove (``n_dead_tup``), and what the watch queries of the docs
(``pg_stat_activity.backend_xmin``) show meanwhile.

    python benches/bench_postgres_xmin.py [--jobs 20000] [--batch 10]

The discussion lives in ``docs/storage/postgres.md`` (Keeping the table lean).
"""

from __future__ import annotations

import time
import uuid

import trio

import _harness as h
from postgres_server import PostgresServer
from trioqueue.storage import NewJob, SettleKind, Settlement
from trioqueue.storage.postgres import Connection, PostgresStorage

SLICES = 5


async def _dead(admin: Connection, schema: str) -> tuple[int, int, int]:
    """(n_live_tup, n_dead_tup, table+index bytes) of the jobs table after a VACUUM."""
    await admin.execute(f'VACUUM "{schema}".jobs')
    live, dead = await admin.fetchrow(
        "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'jobs'", schema
    ) or (0, 0)
    size = await admin.fetchval(f"SELECT pg_total_relation_size('\"{schema}\".jobs')")
    return int(live), int(dead), int(size)


async def _holders(admin: Connection) -> list[tuple[object, ...]]:
    """The watch query of the docs: sessions holding the xmin horizon, oldest first."""
    return await admin.fetch(
        "SELECT pid, state, age(backend_xmin) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL"
        " AND pid <> pg_backend_pid() ORDER BY age(backend_xmin) DESC LIMIT 3"
    )


async def _claim_p50(st: PostgresStorage, q: str, n: int = 200) -> float:
    """Median latency of a one-job claim (then its completion, untimed) of ``n`` queued jobs."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        [c] = await st.dequeue(q, "w", 1, 1.0, 30.0)
        times.append(time.perf_counter() - t0)
        await st.settle(q, "w", [Settlement(SettleKind.COMPLETE, c.id, b"1", 3600.0, token=c.token)])
    times.sort()
    return times[len(times) // 2] * 1000


async def scenario(url: str, jobs: int, batch: int, hold: str | None) -> None:
    """``hold``: ``None`` (nothing else running), or the URL the holder connects to."""
    schema = f"x_{uuid.uuid4().hex[:8]}"
    async with PostgresStorage(url, schema=schema) as st, await Connection.connect(url) as admin:
        q = "q"
        for start in range(0, jobs + 1000, 1000):  # 1000 more stay queued for the claim latencies
            await st.enqueue(q, [NewJob(f"j{i}", b"x", 3, 3600.0, f"t{i}") for i in range(start, start + 1000)])
        holder = await Connection.connect(hold) if hold else None
        if holder is not None:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM pg_class")  # the snapshot is taken: xmin held
            print(f"  backend_xmin holders (pid, state, xid age): {await _holders(admin)}")
        label = "nothing else running" if hold is None else f"a snapshot held by a session of {hold.rsplit('/', 1)[-1]!r}"
        print(f"{label}: {jobs} jobs, claims of {batch}")
        per_slice = jobs // SLICES
        done = 0
        for s in range(SLICES):
            t0 = time.perf_counter()
            while done < per_slice * (s + 1):
                claims = await st.dequeue(q, "w", batch, 1.0, 30.0)
                await st.settle(q, "w", [Settlement(SettleKind.COMPLETE, c.id, b"1", 3600.0, token=c.token) for c in claims])
                done += len(claims)
            rate = per_slice / (time.perf_counter() - t0)
            live, dead, size = await _dead(admin, schema)
            print(f"  slice {s + 1}: {rate:7.0f} jobs/s   after VACUUM: live {live}, dead {dead}, {size / 1e6:.1f} MB")
        print(f"  one-job claim p50 (the next 200 jobs): {await _claim_p50(st, q):.2f} ms")
        if holder is not None:
            print(f"  backend_xmin holders (pid, state, xid age): {await _holders(admin)}")
            await holder.execute("COMMIT")
            await holder.aclose()
            live, dead, size = await _dead(admin, schema)
            print(f"  the holder committed; after VACUUM: live {live}, dead {dead}, {size / 1e6:.1f} MB")
            print(f"  one-job claim p50 (the next 200 jobs): {await _claim_p50(st, q):.2f} ms")


async def _create_database(url: str, name: str) -> None:
    async with await Connection.connect(url) as admin:
        await admin.execute(f"CREATE DATABASE {name}")


def main() -> None:
    parser = h.parser(__doc__, out=None, rounds=None, jobs=20_000)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    print(f"{h.machine()}, commit {h.commit()}")
    server = PostgresServer()
    server.start()
    try:
        other = server.url.rsplit("/", 1)[0] + "/other"
        trio.run(_create_database, server.url, "other")
        trio.run(scenario, server.url, args.jobs, args.batch, None)
        trio.run(scenario, server.url, args.jobs, args.batch, server.url)  # the queue's own database
        trio.run(scenario, server.url, args.jobs, args.batch, other)  # another database of the server
    finally:
        server.close()


if __name__ == "__main__":
    main()
