"""RedisStorage throughput on a local valkey-server started here (free port, no persistence).

Storage-level figures (no Queue on top), next to ``valkey-benchmark``/``redis-benchmark``
LPUSH/RPOP from the same run as the ceiling; medians (min–max) of ``--rounds`` rounds.
Writes ``benches/results/redis.md``.

    python benches/bench_redis.py [--jobs 50000] [--rounds 1]
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import trio

import _harness as h
from redis_server import benchmark_binary
from trioqueue.storage import NewJob, Settlement, SettleKind
from trioqueue.storage.redis import RedisStorage

ENVELOPE = b"\x01" + b"x" * 63  # a typical small envelope (the codec's output is opaque here)


def _jobs(n: int, tag: str) -> list[NewJob]:
    return [NewJob(f"{tag}-{i}", ENVELOPE, 3, 60.0) for i in range(n)]


async def bench_enqueue_batched(st: RedisStorage, n: int) -> float:
    jobs = _jobs(n, "b")
    t = time.perf_counter()
    for i in range(0, n, 1000):
        await st.enqueue("batched", jobs[i : i + 1000])
    return n / (time.perf_counter() - t)


async def bench_enqueue_concurrent(st: RedisStorage, n: int, tasks: int = 100) -> float:
    per = n // tasks

    async def one(k: int) -> None:
        for i in range(per):
            await st.enqueue("concurrent", [NewJob(f"c{k}-{i}", ENVELOPE, 3, 60.0)])

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(one, k)
    return per * tasks / (time.perf_counter() - t)


async def bench_enqueue_sequential(st: RedisStorage, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        await st.enqueue("sequential", [NewJob(f"s{i}", ENVELOPE, 3, 60.0)])
    return n / (time.perf_counter() - t)


async def bench_process(st: RedisStorage, queue: str, n: int, consumers: int) -> float:
    done = 0

    async def consumer(w: str) -> None:
        nonlocal done
        while done < n:
            claims = await st.dequeue(queue, w, 100, 0.2, 60)
            if not claims:
                continue
            await st.settle(queue, w, [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=60, token=c.token) for c in claims])
            done += len(claims)

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(consumers):
            nursery.start_soon(consumer, f"w{k}")
    return done / (time.perf_counter() - t)


def server_benchmark(port: int) -> dict[str, float]:
    binary = benchmark_binary()
    out: dict[str, float] = {}
    if binary is None:
        return out
    for label, extra in (("50 conns", ["-c", "50"]), ("1 conn", ["-c", "1"]), ("50 conns, pipeline 16", ["-c", "50", "-P", "16"])):
        n = "20000" if extra == ["-c", "1"] else "200000"
        res = subprocess.run(
            [binary, "-h", "127.0.0.1", "-p", str(port), "-t", "lpush,rpop", "-n", n, "-q", *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )
        for line in res.stdout.replace("\r", "\n").splitlines():
            m = re.match(r"^(LPUSH|RPOP).*?:\s*([\d.]+) requests per second", line.strip())
            if m:
                out[f"{m.group(1)} ({label})"] = float(m.group(2))
    out["_binary"] = binary  # type: ignore[assignment]
    return out


async def run(target: h.Target, n: int) -> dict[str, float]:
    st = target.make()
    r: dict[str, float] = {}
    async with st:
        r["enqueue, 1000 jobs/call"] = await bench_enqueue_batched(st, n)
        r["enqueue, 100 concurrent single-job calls (coalesced)"] = await bench_enqueue_concurrent(st, n // 2)
        r["enqueue, 1 task, single-job calls (one round trip each)"] = await bench_enqueue_sequential(st, min(n // 10, 5000))
        r["dequeue(max_jobs=100) + settle, 1 consumer"] = await bench_process(st, "batched", n, 1)
        r["dequeue(max_jobs=100) + settle, 4 consumers"] = await bench_process(st, "concurrent", (n // 2 // 100) * 100, 4)
    return r


def main() -> None:
    args = h.parser(__doc__, out="redis.md", rounds=1, jobs=50_000).parse_args()
    runs: dict[str, list[float]] = {}
    for target in h.each_storage(["redis"]):
        for _ in range(args.rounds):
            for k, v in trio.run(run, target, args.jobs).items():
                runs.setdefault(k, []).append(v)
        server = target.note
        ceiling = server_benchmark(int(target.url.rsplit(":", 1)[1].split("/")[0]))
    storage = h.spreads(runs)
    binary = ceiling.pop("_binary", None)
    lpush = ceiling.get("LPUSH (50 conns)")
    piped = ceiling.get("LPUSH (50 conns, pipeline 16)")
    lines = [
        f"- {server}",
        f"- jobs per figure: {args.jobs} (sequential single enqueue: {min(args.jobs // 10, 5000)}); median (min–max) "
        f"of {args.rounds} round(s)",
        "",
        "## Storage level (jobs/s)",
        "",
        "| operation | jobs/s | vs LPUSH, 50 conns | vs LPUSH, 50 conns pipelined ×16 |",
        "|---|---:|---:|---:|",
    ]
    for k, v in storage.items():
        ratio = f"{v / lpush:.2f}×" if lpush else "n/a"
        ratio_p = f"{v / piped:.3f}×" if piped else "n/a"
        lines.append(f"| {k} | {v.fmt()} | {ratio} | {ratio_p} |")
    lines += ["", f"## Ceiling: `{Path(binary).name if binary else 'none'}` on the same server (requests/s)", ""]
    if ceiling:
        lines += h.table(["command", "requests/s"], [[k, f"{v:,.0f}"] for k, v in ceiling.items()])
    else:
        lines.append("no valkey-benchmark/redis-benchmark found")
    lines += [
        "",
        "Notes: a job costs at least one LPUSH-equivalent and one RPOP-equivalent plus its",
        "registry writes, all inside Lua scripts; an awaited round trip under Trio costs ~250 µs,",
        "so throughput comes from batching (1000-job enqueue calls, 100-job claims and settles)",
        "and from coalescing concurrent enqueue calls into shared script calls.",
    ]
    h.write(args, "RedisStorage benchmark", lines)


if __name__ == "__main__":
    main()
