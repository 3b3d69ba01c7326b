"""Batch handlers against single-job handlers, on a bulk-insert workload, in one run.
Writes ``results/batch.md``.

Each job inserts one row into a SQLite database on disk (a temporary directory; the
default journal and ``synchronous`` settings: a commit is durable). The single-job
handler inserts its row and commits (a plain function: it runs in a worker thread, as
blocking database code does); the batch handler inserts its batch with one
``executemany`` and one commit (``batch_size`` 100, ``batch_wait`` 0.05 s). Jobs/s from
the first enqueue to the last completion, for ``--jobs`` jobs per run, median (min–max)
of ``--rounds`` rounds, the modes interleaved, on every storage named. Ratio: batch / best
single.

    python benches/bench_batch.py [--jobs 3000] [--rounds 3] [--storages memory,file,redis]
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio

import _harness as h
from trioqueue import Job, Queue, Storage

BATCH_SIZE = 100
SINGLE_CONCURRENCY = (1, 8)


class Rows:
    """A SQLite database the handlers write to (one connection, used by one thread at a
    time: SQLite has one writer anyway)."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS events (job TEXT PRIMARY KEY, value INTEGER)")
        self.db.commit()
        self.lock = threading.Lock()

    def one(self, job: Job[int]) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO events VALUES (?, ?)", (job.id, job.payload))
            self.db.commit()

    def many(self, jobs: list[Job[int]]) -> list[None]:
        with self.lock:
            self.db.executemany("INSERT OR REPLACE INTO events VALUES (?, ?)", [(j.id, j.payload) for j in jobs])
            self.db.commit()
        return [None] * len(jobs)


async def one_run(storage: Storage, rows: Rows, jobs: int, mode: str) -> float:
    """Jobs/s from the first enqueue to the last completion."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    if mode == "batch":
        queue: Queue[Any, Any] = Queue(storage, name=name, batch_handler=rows.many, batch_size=BATCH_SIZE, block_timeout=1.0)
    else:
        queue = Queue(storage, name=name, handler=rows.one, concurrency=int(mode.split("-")[1]), block_timeout=1.0)
    done = h.all_completed(jobs, queue)
    async with queue:
        t0 = time.perf_counter()
        for start in range(0, jobs, 1000):
            await queue.enqueue_many([(f"j{i}", i) for i in range(start, min(jobs, start + 1000))])
        with trio.fail_after(600):
            await done.wait()
        return jobs / (time.perf_counter() - t0)


MODES = ["batch", *(f"single-{c}" for c in SINGLE_CONCURRENCY)]


async def measure(make: Callable[[], Storage], rows: Rows, jobs: int, rounds: int) -> dict[str, h.Spread]:
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    async with make() as storage:
        for _, mode in h.interleaved(rounds, MODES):  # every mode sees the same machine
            rates[mode].append(await one_run(storage, rows, jobs, mode))
    return h.spreads(rates)


def main() -> None:
    args = h.parser(__doc__, out="batch.md", rounds=3, jobs=3000, storages=("memory", "file", "redis")).parse_args()
    results: dict[str, dict[str, h.Spread]] = {}
    notes = []
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as d:
        rows = Rows(os.path.join(d, "rows.db"))
        for target in h.each_storage(args.storages):
            results[target.name] = trio.run(measure, target.make, rows, args.jobs, args.rounds)
            notes.append(target.note)
    lines = [
        "Each job inserts one row into a SQLite database on disk (default journal, `synchronous`",
        "FULL: every commit durable). Single: a plain handler per job (in a worker thread)",
        f"inserting its row and committing, at concurrency {' and '.join(map(str, SINGLE_CONCURRENCY))};",
        f"batch: `batch_handler` with one `executemany` and one commit per batch (`batch_size` {BATCH_SIZE},",
        f"`batch_wait` 0.05 s). {args.jobs:,} jobs per run, enqueued in batches of 1,000, from the first",
        f"enqueue to the last completion; median (min–max) of {args.rounds} rounds, modes interleaved.",
        "",
        *(f"- {n}" for n in notes),
        "",
    ]
    lines += h.table(
        ["storage", "batch jobs/s", *(f"single (c={c}) jobs/s" for c in SINGLE_CONCURRENCY), "batch / best single"],
        [
            [storage, r["batch"].fmt(), *(r[f"single-{c}"].fmt() for c in SINGLE_CONCURRENCY),
             f"{r['batch'] / max(r[f'single-{c}'].median for c in SINGLE_CONCURRENCY):.1f}x"]
            for storage, r in results.items()
        ],
    )
    h.write(args, "Batch handlers against single-job handlers: bulk insert into SQLite", lines)


if __name__ == "__main__":
    main()
