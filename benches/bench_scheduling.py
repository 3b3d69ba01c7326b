"""Scheduling benchmarks on RedisStorage (issue 9): delayed-job promotion and priority claims
at depth, on a local valkey-server started here (free port, no persistence), as
``bench_redis.py`` does. Writes ``benches/results/scheduling.md``.

(a) Promotion: ``--jobs`` delayed jobs all due at the same moment, then the time until
    consumers have claimed them all, against claiming as many plain ready jobs the same
    way in the same run (ratio: promoted / plain).
(b) Priority claims at depth: queues of 1k, 100k and 1M jobs of mixed priorities (0..9);
    single-job claim latency and 100-job claim throughput at each depth, measured in
    interleaved rounds (claimed jobs are enqueued again), as ratios against 1k.
(c) The same at depth on FileStorage (a temporary directory), ``--file-depths``.

    python benches/bench_scheduling.py [--jobs 100000] [--depths 1000,100000,1000000]
                                       [--file-depths 1000,100000] [--rounds 5]
"""

from __future__ import annotations

import statistics
import time
from itertools import count
from pathlib import Path
from typing import Any

import trio

import _harness as h
from trioqueue.storage import NewJob, Storage

ENVELOPE = b"\x01" + b"x" * 63  # a typical small envelope (opaque to the storage)
MIXED = True  # --default-priority-only: every job at priority 5 (a control for (b))
BATCH = 20_000  # jobs per enqueue call when building queues (the storage splits it)
CONSUMERS = 4
CLAIM = 100  # jobs per claim call
_ids = count()


def _jobs(n: int, *, run_at: float | None = None, mixed: bool = False) -> list[NewJob]:
    return [
        NewJob(f"j{next(_ids)}", ENVELOPE, 3, 600.0, "t", run_at, (i * 7) % 10 if mixed and MIXED else 5)
        for i in range(n)
    ]


async def _fill(st: Storage, queue: str, jobs: list[NewJob]) -> float:
    t = time.perf_counter()
    for i in range(0, len(jobs), BATCH):
        await st.enqueue(queue, jobs[i : i + BATCH])
    return time.perf_counter() - t


async def _claim_all(st: Storage, queue: str, n: int) -> float:
    """Seconds until ``CONSUMERS`` consumers claiming ``CLAIM`` at a time got ``n`` jobs
    (the others' waiting claims are cancelled then)."""
    got = 0
    t = time.perf_counter()
    end = t

    async def consumer(w: str, scope: trio.CancelScope) -> None:
        nonlocal got, end
        while got < n:
            claims = await st.dequeue(queue, w, CLAIM, 5.0, 600)
            got += len(claims)  # not ``got += len(await ...)``: that reads ``got`` before the await
        end = time.perf_counter()
        scope.cancel()

    async with trio.open_nursery() as nursery:
        for k in range(CONSUMERS):
            nursery.start_soon(consumer, f"w{k}", nursery.cancel_scope)
    return end - t


async def bench_promotion(st: Storage, n: int) -> dict[str, float]:
    fill_plain = await _fill(st, "plain", _jobs(n))
    plain = await _claim_all(st, "plain", n)
    # Due once the whole batch is written (its writing time measured just above, with room).
    due = time.time() + 1.5 * fill_plain + 1.0
    await _fill(st, "delayed", _jobs(n, run_at=due))
    await trio.sleep(max(0.0, due - time.time()) + 0.01)
    promoted = await _claim_all(st, "delayed", n)
    return {"plain": plain, "promoted": promoted}


async def _latency(st: Storage, queue: str, k: int) -> float:
    """Median seconds of ``k`` sequential single-job claims."""
    times = []
    for _ in range(k):
        t = time.perf_counter()
        claims = await st.dequeue(queue, "lat", 1, 0.5, 600)
        times.append(time.perf_counter() - t)
        assert claims, "queue ran dry"
    return statistics.median(times)


async def _throughput(st: Storage, queue: str, calls: int) -> tuple[int, float]:
    """``(jobs, seconds)`` of ``calls`` sequential claims of ``CLAIM`` jobs."""
    t = time.perf_counter()
    got = 0
    for _ in range(calls):
        claims = await st.dequeue(queue, "thr", CLAIM, 0.5, 600)
        got += len(claims)
    return got, time.perf_counter() - t


async def bench_depth(st: Storage, depths: list[int], rounds: int) -> dict[int, dict[str, Any]]:
    build: dict[int, float] = {}
    for d in depths:
        build[d] = await _fill(st, f"depth-{d}", _jobs(d, mixed=True))
    lat: dict[int, list[float]] = {d: [] for d in depths}
    thr: dict[int, list[float]] = {d: [] for d in depths}
    single, calls, reps = 200, 5, 4  # at most 500 jobs out at a time: under the smallest depth
    for _, d in h.interleaved(rounds, depths):  # machine noise spreads over every depth
        q = f"depth-{d}"
        lat[d].append(await _latency(st, q, single))
        await _fill(st, q, _jobs(single, mixed=True))  # back to depth d (untimed)
        jobs, secs = 0, 0.0
        for _ in range(reps):
            n, t = await _throughput(st, q, calls)
            jobs, secs = jobs + n, secs + t
            await _fill(st, q, _jobs(n, mixed=True))
        thr[d].append(jobs / secs)
    return {
        d: {"build_s": build[d], "latency_s": h.Spread.of(lat[d]), "claims_per_s": h.Spread.of(thr[d])}
        for d in depths
    }


async def run(target: h.Target, n: int, depths: list[int], rounds: int) -> tuple[dict[str, float], dict[int, dict[str, Any]]]:
    async with target.make() as st:
        promotion = await bench_promotion(st, n) if target.name == "redis" else {}
        depth = await bench_depth(st, depths, rounds)
    return promotion, depth


def _depth_rows(depth: dict[int, dict[str, Any]]) -> list[str]:
    """Table rows of :func:`bench_depth`'s figures (median, min–max), with ratios of the
    medians to the smallest depth."""
    base = depth[min(depth)]
    return [
        f"| {d:,} | {r['build_s']:.1f} | {h.Spread.of(x * 1000 for x in r['latency_s'].values).fmt('.3f')} "
        f"| {r['latency_s'] / base['latency_s']:.2f} "
        f"| {r['claims_per_s'].fmt()} | {r['claims_per_s'] / base['claims_per_s']:.2f} |"
        for d, r in sorted(depth.items())
    ]


def _plot_depth(path: Path, series: dict[str, dict[int, dict[str, Any]]]) -> None:
    """Claim cost against queue depth, as ratios to each storage's smallest depth: the
    single-job claim's latency (left) and 100-job claims' throughput (right)."""
    with h.figure(path, 1, 2, size=(10, 4)) as (_, (left, right)):
        for name, depth in series.items():
            if not depth:
                continue
            xs = sorted(depth)
            base = depth[xs[0]]
            left.plot(xs, [depth[x]["latency_s"] / base["latency_s"] for x in xs], marker="o", label=name)
            right.plot(xs, [depth[x]["claims_per_s"] / base["claims_per_s"] for x in xs], marker="o", label=name)
        for ax, title in ((left, "single-job claim latency (vs smallest depth)"),
                          (right, "100-job claims, jobs/s (vs smallest depth)")):
            ax.set_xscale("log")
            ax.set_xlabel("queued jobs")
            ax.set_title(title, fontsize=10)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_ylim(0, 2)
            ax.grid(True, alpha=0.3)
            ax.legend()


def main() -> None:
    ap = h.parser(__doc__, out="scheduling.md", rounds=5, jobs=100_000)
    ap.add_argument("--depths", default="1000,100000,1000000")
    ap.add_argument("--default-priority-only", action="store_true", help="(b) with every job at priority 5")
    ap.add_argument("--file-depths", default="1000,100000,1000000", help="(c) FileStorage depths ('' to skip)")
    args = ap.parse_args()
    global MIXED
    MIXED = not args.default_priority_only
    depths = [int(x) for x in args.depths.split(",")]
    file_depths = [int(x) for x in args.file_depths.split(",") if x]
    t0 = time.perf_counter()
    promotion: dict[str, float] = {}
    depth: dict[int, dict[str, Any]] = {}
    file_depth: dict[int, dict[str, Any]] = {}
    server = ""
    for target in h.each_storage(["redis", "file"] if file_depths else ["redis"]):
        if target.name == "redis":
            promotion, depth = trio.run(run, target, args.jobs, depths, args.rounds)
            server = target.note
        else:
            _, file_depth = trio.run(run, target, args.jobs, file_depths, args.rounds)
    total = time.perf_counter() - t0
    n = args.jobs
    lines = [
        f"- {server}",
        f"- run time {total:.0f} s; {CONSUMERS} consumers claiming {CLAIM} jobs a call",
        "",
        f"## (a) Delayed-job promotion: {n:,} jobs due at the same moment",
        "",
        "| | seconds until all claimed | jobs/s | ratio |",
        "|---|---:|---:|---:|",
        f"| plain ready jobs (baseline) | {promotion['plain']:.2f} | {n / promotion['plain']:,.0f} | 1.00 |",
        f"| delayed jobs, promoted by the claims | {promotion['promoted']:.2f} | {n / promotion['promoted']:,.0f} "
        f"| {promotion['promoted'] / promotion['plain']:.2f}× the time |",
        "",
        "Each claim promotes up to 1,000 due jobs (one script call) before claiming.",
        "",
        f"## (b) Claims at depth ({'mixed priorities 0..9' if MIXED else 'every job at the default priority'})",
        "",
        "| queued jobs | built in (s) | single-job claim, median (ms) | vs 1k | 100-job claims (jobs/s) | vs 1k |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _depth_rows(depth)
    lines += [
        "",
        f"Medians (min–max) of {args.rounds} interleaved rounds (per depth and round: 200 single-job claims, then",
        "4 × 5 claims of 100 jobs; the claimed jobs are enqueued again between the timed",
        "parts, so the depth stays put). A claim scans the 10 priority lists in order",
        "(LPOP on each until it has its jobs): its cost does not depend on the depth.",
        "The machine is shared (2 cores, other work running): compare the ratios, which are",
        "measured in the same run, rather than the absolute figures.",
        "",
    ]
    if file_depth:
        lines += [
            "## (c) FileStorage claims at depth (mixed priorities 0..9, a temporary directory)",
            "",
            "| queued jobs | built in (s) | single-job claim, median (ms) | vs smallest | 100-job claims (jobs/s) | vs smallest |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        lines += _depth_rows(file_depth)
        lines += [
            "",
            "Same rounds as (b). A FileStorage claim renames the first names of the ready",
            "directory's per-priority order into the worker's directory under the queue lock.",
            "",
        ]
    plot = Path(args.out).with_name("scheduling-depth.png")
    if not args.no_write:
        _plot_depth(plot, {"Redis (Valkey)": depth, "FileStorage": file_depth})
    lines += [
        "## Claim cost against depth",
        "",
        f"![claims at depth]({plot.name})",
        "",
        "What limits the curves: on Redis, the server's CPU, whose per-claim work is the same",
        "at any depth (list pops, field reads) but whose hash and zset lookups miss the CPU",
        "caches more often in million-entry structures. On FileStorage, the claiming",
        "process: a claim reads each claimed job's record, which comes from the process's",
        "record cache (copies of up to 32,768 records it wrote) at small depths and from",
        "its segment file (open, read, close) beyond that, about halving 100-job claims;",
        "the renames and ext4's hashed directory lookups stay cheap at any size, and each",
        "lane's sorted listing is read once and serves many claims. (Here one process",
        "enqueues and claims; a worker whose producers are other processes reads every",
        "record from its segment at any depth: its claims cost what the deep ones do here.)",
        "",
    ]
    h.write(args, "Scheduling benchmarks (RedisStorage, FileStorage)", lines)


if __name__ == "__main__":
    main()
