"""The overhead of trees of jobs (``children=``) against the same number of plain jobs, on
every storage, measured in one run. Writes ``results/flows.md``.

Two shapes, each run as a tree and as its plain-jobs baseline (same number of jobs, same
number of enqueue calls: one ``enqueue_many`` per would-be tree), from the first enqueue
to the last job's completion (median, min–max, of ``--rounds`` interleaved rounds), on one Queue (a no-op async handler, ``concurrency`` 32):

- ``1x100``: one parent with 100 children (101 jobs);
- ``1000x10``: 1,000 parents with 10 children each (11,000 jobs).

Redis runs on a valkey-server started here (free port, no persistence), as the other
benches do; a storage without trees of jobs shows ``n/a`` for them.

    python benches/bench_flows.py [--rounds 3] [--storages memory,file,redis]
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import trio

import _harness as h
from trioqueue import Child, Job, Queue, Storage

SHAPES = {"1x100": (1, 100), "1000x10": (1000, 10)}
CONCURRENCY = 32


async def _noop(job: Job[Any]) -> None:
    return None


async def one_run(storage: Storage, parents: int, children: int, tree: bool) -> float:
    """Seconds from the first enqueue to the last completion (every job of the shape)."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    async with Queue(storage, name=name, handler=_noop, concurrency=CONCURRENCY, block_timeout=1.0) as q:
        done = h.all_completed(parents * (children + 1), q)
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


async def measure(make: Callable[[], Storage], rounds: int) -> dict[str, dict[str, h.Spread | None]]:
    out: dict[str, dict[str, h.Spread | None]] = {}
    async with make() as storage:
        for shape, (parents, children) in SHAPES.items():
            runs: dict[str, list[float]] = {"plain": [], "tree": []}
            supported = True
            for _, side in h.interleaved(rounds, ["plain", "tree"]):  # both see the same machine
                if side == "plain" or supported:
                    try:
                        runs[side].append(await one_run(storage, parents, children, tree=side == "tree"))
                    except NotImplementedError:
                        supported = False
            out[shape] = {"plain": h.Spread.of(runs["plain"]), "tree": h.Spread.of(runs["tree"]) if supported else None}
    return out


def main() -> None:
    args = h.parser(__doc__, out="flows.md", rounds=3, storages=("memory", "file", "redis")).parse_args()
    results: dict[str, dict[str, dict[str, h.Spread | None]]] = {}
    notes = []
    for target in h.each_storage(args.storages):
        results[target.name] = trio.run(measure, target.make, args.rounds)
        notes.append(target.note)
    lines = [
        "The time from the first enqueue to the last job's completion, on one Queue (no-op async",
        "handler, concurrency 32), for a tree and for its baseline, the same number of plain jobs",
        "enqueued in the same number of calls (one `enqueue_many` per would-be tree), in the same",
        f"run; median (min–max) of {args.rounds} interleaved rounds. `1x100`: one parent with 100",
        "children (101 jobs); `1000x10`: 1,000 parents with 10 children each (11,000 jobs). Ratio:",
        "tree / plain.",
        "",
        *(f"- {n}" for n in notes),
        "",
    ]
    rows = []
    for storage, shapes in results.items():
        for shape, r in shapes.items():
            parents, children = SHAPES[shape]
            n = parents * (children + 1)
            plain, tree = r["plain"], r["tree"]
            assert plain is not None
            if tree is None:
                rows.append([storage, shape, plain.fmt(".3f"), "n/a", "n/a", f"{n / plain.median:,.0f}", "n/a (no trees)"])
            else:
                rows.append([storage, shape, plain.fmt(".3f"), tree.fmt(".3f"), f"{tree / plain:.2f}",
                             f"{n / plain.median:,.0f}", f"{n / tree.median:,.0f}"])
    lines += h.table(["storage", "shape", "plain jobs (s)", "tree (s)", "ratio", "plain jobs/s", "tree jobs/s"], rows,
                     "llrrrrr")
    h.write(args, "Trees of jobs against plain jobs", lines)


if __name__ == "__main__":
    main()
