"""The lean Redis client (``storage/_resp.py``, RESP in Rust) head to head with valkey-glide,
under Trio, on one local valkey-server started here (free port, no persistence).

Rounds are interleaved (glide, lean, glide, lean, ...) and the best of each is kept;
ratio = lean ops/s / glide ops/s from the same run. Writes ``benches/results/resp.md``.

    python benches/bench_resp.py [--ops 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from pathlib import Path

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer  # noqa: E402

import glide  # noqa: E402

from trioqueue import _core  # noqa: E402
from trioqueue.storage import NewJob  # noqa: E402
from trioqueue.storage.redis._transport import parse_url  # noqa: E402
from trioqueue.storage.redis._resp import RespClient  # noqa: E402
from trioqueue.storage.redis import RedisStorage  # noqa: E402

RESULTS = HERE / "results" / "resp.md"
KEYS = [f"{{bench:q}}:k{i}" for i in range(28)]  # as many KEYS as the enqueue script has
SCRIPT = "redis.call('RPUSH', KEYS[1], ARGV[1]) return 1"
PAYLOAD = "x" * 52

Op = Callable[[], Awaitable[object]]


async def _sequential(op: Op, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await op()
    return n / (time.perf_counter() - t)


async def _concurrent(op: Op, n: int, tasks: int = 100) -> float:
    async def worker(k: int) -> None:
        for _ in range(k):
            await op()

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker, n // tasks)
    return (n // tasks * tasks) / (time.perf_counter() - t)


async def run(url: str, ops: int, rounds: int) -> list[tuple[str, float, float]]:
    g = await glide.GlideClient.create(
        glide.GlideClientConfiguration([glide.NodeAddress("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]))])
    )
    lean = RespClient(parse_url(url))
    script = glide.Script(SCRIPT)
    sha = script.get_hash()
    await lean.execute(_core.encode_command(("SCRIPT", "LOAD", SCRIPT)))
    lpush = _core.encode_command(("LPUSH", "{bench:q}:l", PAYLOAD))

    async def g_lpush() -> object:
        return await g.lpush("{bench:q}:l", [PAYLOAD])

    async def l_lpush() -> object:
        return await lean.execute(lpush)

    async def g_eval() -> object:
        return await g.invoke_script(script, keys=KEYS, args=[PAYLOAD])

    async def l_eval() -> object:
        return await lean.execute(_core.encode_command(("EVALSHA", sha, len(KEYS)), KEYS, (PAYLOAD,)))

    # storage level: RedisStorage.enqueue of one job, awaited, one task (workload A-seq's
    # storage part); client= makes the storage use that GLIDE client for its commands
    st_glide = RedisStorage(url, prefix="g" + uuid.uuid4().hex[:6], client=g)
    st_lean = RedisStorage(url, prefix="l" + uuid.uuid4().hex[:6])
    counter = iter(range(10**9))
    env = b"\x01" + b"x" * 63

    def enq(st: RedisStorage) -> Op:
        async def op() -> object:
            return await st.enqueue("q", [NewJob(f"j{next(counter)}", env, 3, 60.0)])

        return op

    cases: list[tuple[str, Callable[[Op, int], Awaitable[float]], Op, Op]] = [
        ("LPUSH, sequential (one task)", _sequential, g_lpush, l_lpush),
        ("LPUSH, 100 tasks", _concurrent, g_lpush, l_lpush),
        ("EVALSHA with 28 keys, sequential", _sequential, g_eval, l_eval),
        ("EVALSHA with 28 keys, 100 tasks", _concurrent, g_eval, l_eval),
        ("RedisStorage.enqueue of one job, sequential", _sequential, enq(st_glide), enq(st_lean)),
        ("RedisStorage.enqueue of one job, 100 tasks", _concurrent, enq(st_glide), enq(st_lean)),
    ]
    out = []
    async with st_glide, st_lean:
        for name, shape, g_op, l_op in cases:
            best_g = best_l = 0.0
            for _ in range(rounds):
                best_g = max(best_g, await shape(g_op, ops))
                best_l = max(best_l, await shape(l_op, ops))
            print(f"{name:48} glide {best_g:9,.0f}/s  lean {best_l:9,.0f}/s  {best_l / best_g:5.2f}x", flush=True)
            out.append((name, best_g, best_l))
    await lean.aclose()
    await g.close()
    return out


QUEUE_WORKLOADS = ("A-seq", "A-100", "B", "C-1", "C-50")


async def run_queue(url: str, jobs: int, rounds: int) -> list[tuple[str, str, float, float]]:
    """Workloads of ``trioqueue bench`` on RedisStorage(lean=False) and (lean=True),
    interleaved; the best round of each (lowest p50 for C-1)."""
    from trioqueue.cli._bench import run_bench

    best: dict[tuple[str, bool], Any] = {}
    for _ in range(rounds):
        for lean in (False, True):
            st = RedisStorage(url, prefix="q" + uuid.uuid4().hex[:6], lean=lean)
            for r in await run_bench(st, QUEUE_WORKLOADS, jobs=jobs):
                key = (r.workload, lean)
                old = best.get(key)
                if r.workload == "C-1":
                    if old is None or (r.p50_ms or 0) < (old.p50_ms or 0):
                        best[key] = r
                elif old is None or r.rate > old.rate:
                    best[key] = r
    out = []
    for w in QUEUE_WORKLOADS:
        g, lean_r = best[w, False], best[w, True]
        if w == "C-1":
            row = (w, "p50 ms (lower is better)", g.p50_ms, lean_r.p50_ms)
        else:
            row = (w, "jobs/s" if w != "C-50" else "req/s", g.rate, lean_r.rate)
        print(f"{w:8} {row[1]:26} glide {row[2]:10,.2f}  lean {row[3]:10,.2f}", flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=20_000, help="operations per measurement (default 20000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best kept (default 3)")
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs per queue-level workload (default 10000)")
    args = ap.parse_args()
    server = RedisServer()
    server.start()
    try:
        rows = trio.run(run, server.url, args.ops, args.rounds)
        qrows = trio.run(run_queue, server.url, args.jobs, args.rounds)
    finally:
        server.close()
    lines = [
        "# Lean Redis client vs valkey-glide under Trio",
        "",
        f"`python benches/bench_resp.py --ops {args.ops} --rounds {args.rounds}`, {time.strftime('%Y-%m-%d')}: "
        f"Python {platform.python_version()}, trio {trio.__version__}, valkey-glide {glide.__version__ if hasattr(glide, '__version__') else '2.x'}, "
        f"one local valkey-server, {os.cpu_count()} cores (shared with other work: compare ratios). "
        f"Best of {args.rounds} interleaved rounds; ratio = lean / glide from the same run.",
        "",
        "| measure | valkey-glide | lean client | ratio |",
        "|---|---|---|---|",
        *[f"| {name} | {g:,.0f}/s | {lean:,.0f}/s | {lean / g:.2f}x |" for name, g, lean in rows],
        "",
        f"Queue level: the workloads of `trioqueue bench` ({args.jobs:,} jobs) on `RedisStorage(lean=False)`",
        "(everything on GLIDE) and on the default (`lean=True`), interleaved, best round of each:",
        "",
        "| workload | unit | everything on glide | lean client | ratio |",
        "|---|---|---|---|---|",
        *[
            f"| {w} | {unit} | {g:,.2f} | {lean:,.2f} | {(g / lean if w == 'C-1' else lean / g):.2f}x |"
            for w, unit, g, lean in qrows
        ],
        "",
        "(For C-1 the ratio is glide's p50 / lean's p50: > 1 means the lean client is faster.)",
        "",
        "The lean client (`python/trioqueue/storage/_resp.py`) owns one Trio socket per storage,",
        "writes commands as they come (pipelined) and matches replies in order; the caller whose",
        "reply is due reads the socket for everyone (no background task). RESP is encoded and",
        "parsed by the Rust core (`_core.encode_command`, `_core.RespReader`; 4-7x their Python",
        "twins in `core.md`). RedisStorage uses it on a standalone server (plain or TLS) for",
        "commands, scripts, blocking claims and subscriptions; GLIDE serves Cluster.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"written to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
