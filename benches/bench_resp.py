"""The lean Redis client (``_drivers/resp/_client.py``, RESP in Rust) head to head with valkey-glide,
under Trio, on one local valkey-server started here (free port, no persistence).

Rounds are interleaved (glide, lean, lean, glide, ...), the median (min–max) of each kept;
ratio = lean ops/s / glide ops/s (of the medians) from the same run. Writes
``benches/results/resp.md``.

    python benches/bench_resp.py [--ops 20000] [--rounds 3]
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

import glide
import trio

import _harness as h
from redis_server import RedisServer
from trioqueue import _core
from trioqueue.cli._bench import run_bench
from trioqueue.storage import NewJob
from trioqueue.storage.redis import RedisStorage
from trioqueue._drivers.resp._client import RespClient
from trioqueue._drivers.resp._transport import parse_url
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


async def run(url: str, ops: int, rounds: int) -> list[tuple[str, h.Spread, h.Spread]]:
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
            ops_of = {"glide": g_op, "lean": l_op}
            runs: dict[str, list[float]] = {"glide": [], "lean": []}
            for _, side in h.interleaved(rounds, list(ops_of)):
                runs[side].append(await shape(ops_of[side], ops))
            g_s, l_s = h.Spread.of(runs["glide"]), h.Spread.of(runs["lean"])
            print(f"{name:48} glide {g_s.median:9,.0f}/s  lean {l_s.median:9,.0f}/s  {l_s / g_s:5.2f}x", flush=True)
            out.append((name, g_s, l_s))
    await lean.aclose()
    await g.close()
    return out


QUEUE_WORKLOADS = ("A-seq", "A-100", "B", "C-1", "C-50")


async def run_queue(url: str, jobs: int, rounds: int) -> list[tuple[str, str, h.Spread, h.Spread]]:
    """Workloads of ``trioqueue bench`` on RedisStorage(lean=False) and (lean=True),
    interleaved; the median (min–max) of each (of the p50 for C-1)."""
    figures: dict[tuple[str, bool], list[float]] = {}
    for _, lean in h.interleaved(rounds, [False, True]):
        st = RedisStorage(url, prefix="q" + uuid.uuid4().hex[:6], lean=lean)
        for r in await run_bench(st, QUEUE_WORKLOADS, jobs=jobs):
            figures.setdefault((r.workload, lean), []).append((r.p50_ms or 0.0) if r.workload == "C-1" else r.rate)
    out = []
    for w in QUEUE_WORKLOADS:
        g, lean_r = h.Spread.of(figures[w, False]), h.Spread.of(figures[w, True])
        unit = "p50 ms (lower is better)" if w == "C-1" else "jobs/s" if w != "C-50" else "req/s"
        print(f"{w:8} {unit:26} glide {g.median:10,.2f}  lean {lean_r.median:10,.2f}", flush=True)
        out.append((w, unit, g, lean_r))
    return out


def main() -> None:
    ap = h.parser(__doc__, out="resp.md", rounds=3, jobs=10_000)
    ap.add_argument("--ops", type=int, default=20_000, help="operations per measurement (default 20000)")
    args = ap.parse_args()
    server = RedisServer()
    server.start()
    try:
        rows = trio.run(run, server.url, args.ops, args.rounds)
        qrows = trio.run(run_queue, server.url, args.jobs, args.rounds)
    finally:
        server.close()
    glide_version = getattr(glide, "__version__", "2.x")
    lines = [
        f"trio {trio.__version__}, valkey-glide {glide_version}, one local valkey-server (compare ratios). Median "
        f"(min–max) of {args.rounds} interleaved rounds; ratio = lean / glide (of the medians) from the same run.",
        "",
        *h.table(["measure", "valkey-glide ops/s", "lean client ops/s", "ratio"],
                 [[name, g.fmt(), lean.fmt(), f"{lean / g:.2f}x"] for name, g, lean in rows]),
        "",
        f"Queue level: the workloads of `trioqueue bench` ({args.jobs:,} jobs) on `RedisStorage(lean=False)`",
        "(everything on GLIDE) and on the default (`lean=True`), interleaved:",
        "",
        *h.table(["workload", "unit", "everything on glide", "lean client", "ratio"],
                 [[w, unit, g.fmt(",.2f"), lean.fmt(",.2f"), f"{(g / lean if w == 'C-1' else lean / g):.2f}x"]
                  for w, unit, g, lean in qrows], "llrrr"),
        "",
        "(For C-1 the ratio is glide's p50 / lean's p50: > 1 means the lean client is faster.)",
        "",
        "The lean client (`python/trioqueue/_drivers/resp/_client.py`) owns one Trio socket per storage,",
        "writes commands as they come (pipelined) and matches replies in order; the caller whose",
        "reply is due reads the socket for everyone (no background task). RESP is encoded and",
        "parsed by the Rust core (`_core.encode_command`, `_core.RespReader`; 4-7x their Python",
        "twins in `core.md`). RedisStorage uses it on a standalone server (plain or TLS) for",
        "commands, scripts, blocking claims and subscriptions; GLIDE serves Cluster.",
    ]
    h.write(args, "Lean Redis client vs valkey-glide under Trio", lines)


if __name__ == "__main__":
    main()
