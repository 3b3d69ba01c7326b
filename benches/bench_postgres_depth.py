"""What a claim and a settlement of 100 jobs cost PostgresStorage as its queue gets deeper,
on a queue the table's statistics have not seen (filled after an ANALYZE of another
queue: the planner estimates it at about one row, as for a new queue or every bench run).

For each depth, one schema: queue "seen" (2,000 jobs) analysed, then queue "new" filled
with ``depth`` ready jobs. Each round, in one rolled-back transaction per statement
version (interleaved, this tree's and ``--before``'s): ``EXPLAIN (ANALYZE, BUFFERS)`` of
the claim of 100 (claim_plain, claim_fast_plain) and then of settle_jobs on the 100
claimed. Reported: execution time (median, min-max), shared buffers touched (hit + read;
writes included) and rows the scans of jobs returned (these two do not move with load).

    python benches/bench_postgres_depth.py [--depths 1000,10000,100000] [--rounds 5]
                                           [--before main]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

import trio

import _harness as h  # noqa: F401  (also puts the tests' servers on the path)
from postgres_server import PostgresServer
from trioqueue import Queue
from trioqueue.storage.postgres import Connection, PostgresStorage, _sql

SQL_DIR = "python/trioqueue/storage/postgres/sql"
CLAIM_TYPES = "text, int8, int8, text, int8, int8"
SETTLE_TYPES = "text, int8, text[], text[], int4[], bool[], bool[], bytea[], int8[], int8[]"


def statement_at(ref: str, name: str, schema: str) -> str:
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(
        ["git", "show", f"{ref}:{SQL_DIR}/{name}.sql"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    return text.replace("{schema}", schema).replace("{s}", f'"{schema}"')


def rows_read(node: dict[str, Any]) -> int:
    """Rows the scans of jobs anywhere in ``node`` returned (actual rows times loops)."""
    own = 0
    if node.get("Relation Name") == "jobs" and "Scan" in str(node.get("Node Type")):
        own = round(float(node["Actual Rows"]) * int(node["Actual Loops"]))
    return own + sum(rows_read(c) for c in node.get("Plans", []))


def costs(doc: Any) -> tuple[float, int, int]:
    top = (json.loads(doc) if isinstance(doc, str) else doc)[0]
    plan = top["Plan"]
    buffers = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return float(top["Execution Time"]), buffers, rows_read(plan)


async def measure(conn: Connection, tag: str, claim: str) -> dict[str, tuple[float, int, int]]:
    out: dict[str, tuple[float, int, int]] = {}
    await conn.execute("BEGIN")
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {tag}_{claim} ('new', 0, 100, 'w', 60000, 0)")
    out[claim] = costs(rows[0][0])
    await conn.execute("ROLLBACK")
    await conn.execute("BEGIN")
    claimed = await conn.fetch(f"EXECUTE {tag}_claim_plain ('new', 0, 100, 'w', 60000, 0)")
    ids = "ARRAY[" + ",".join(f"'{r[2]}'" for r in claimed) + "]"
    n = len(claimed)
    fill = ", ".join(
        f"array_fill({v}, ARRAY[{n}])"
        for v in ("'completed'::text", "0", "true", "false", "NULL::bytea", "NULL::int8", "NULL::int8")
    )
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {tag}_settle_jobs ('new', 1, {ids}, {fill})")
    out["settle_jobs"] = costs(rows[0][0])
    await conn.execute("ROLLBACK")
    return out


async def one_depth(url: str, depth: int, rounds: int, before: str) -> None:
    schema = f"depth_{depth}"
    async with PostgresStorage(url, schema=schema) as storage:
        async with Queue[int, None](storage, name="seen") as seen:
            await seen.enqueue_many([(f"s{i}", i) for i in range(2000)])
        async with await Connection.connect(url) as conn:
            await conn.execute(f'ANALYZE "{schema}".jobs')
        async with Queue[int, None](storage, name="new") as new:
            for start in range(0, depth, 10_000):
                await new.enqueue_many([(f"n{i}", i) for i in range(start, min(depth, start + 10_000))])
    names = ("claim_plain", "claim_fast_plain", "settle_jobs")
    now = _sql.statements(schema)
    async with await Connection.connect(url) as conn:
        for tag, text in (("after", lambda n: now[n]), ("before", lambda n: statement_at(before, n, schema))):
            for name in names:
                types = SETTLE_TYPES if name == "settle_jobs" else CLAIM_TYPES
                await conn.execute_script(f"PREPARE {tag}_{name} ({types}) AS {text(name)}")
        seen_costs: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
        for _ in range(rounds):
            for tag in ("before", "after"):
                for claim in ("claim_plain", "claim_fast_plain"):
                    for name, value in (await measure(conn, tag, claim)).items():
                        seen_costs.setdefault((tag, name), []).append(value)
    for name in names:
        line = [f"depth {depth:>7,} {name:<17}"]
        for tag in ("before", "after"):
            ms = [c[0] for c in seen_costs[(tag, name)]]
            buffers = statistics.median(c[1] for c in seen_costs[(tag, name)])
            read = statistics.median(c[2] for c in seen_costs[(tag, name)])
            line.append(
                f"{tag} {statistics.median(ms):7.2f} ms ({min(ms):.2f}-{max(ms):.2f})"
                f" {buffers:>6.0f} buffers {read:>7.0f} rows read"
            )
        print("  ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="main", help="git revision whose statements are the baseline")
    args = parser.parse_args()
    server = PostgresServer()
    server.start()
    try:
        for depth in (int(d) for d in args.depths.split(",")):
            trio.run(one_depth, server.url, depth, args.rounds, args.before)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
