"""A claim's cost with 10, 1,000 and 10,000 groups, on every storage, in one run.
Writes ``results/groups.md``.

For each storage and each number of groups G (10, 1,000, then 10,000), the same backlog of
``--jobs`` jobs is enqueued, spread evenly over G groups (enqueued group by group, so a
FIFO without groups would serve the first group's jobs first); then ``--claims`` claims of
one job each (``Storage.dequeue(max_jobs=1)``, the round-robin's worst case: one turn a
call) are timed. The ratio (10,000 groups / 10 groups) is what the ring design promises
to keep flat: a claim takes the ring's first group and moves it to the end, it never scans
the groups. The claimed jobs are checked to come from distinct groups in turn.

Redis runs on a valkey-server and PostgreSQL on an embedded server, both started here
(free ports; Redis without persistence, PostgreSQL with fsync, as the other benches);
FileStorage writes to a temporary directory (fsync on).

    python benches/bench_groups.py [--jobs 20000] [--claims 2000] [--storages memory,file,redis,postgres]
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import trio

import _harness as h
from trioqueue._core import encode_envelope
from trioqueue.storage import NewJob, Storage

GROUPS = (10, 1_000, 10_000)


def _job(job_id: str, group: str) -> NewJob:
    env = encode_envelope(job_id, b"{}", 1_700_000_000_000, 0, 3, 60_000)
    return NewJob(job_id, env, 3, 60.0, f"t-{job_id}", None, 5, group)


def _cpu(pids: Callable[[], list[int]]) -> float:
    """This process's CPU seconds (every thread) and the server's."""
    return time.process_time() + h.cpu_seconds(pids())


def _no_server() -> list[int]:
    return []


async def one_run(
    storage: Storage, groups: int, jobs: int, claims: int, pids: Callable[[], list[int]] = _no_server
) -> tuple[float, float]:
    """Microseconds per claim of one job, over ``claims`` claims: elapsed, and CPU time
    (this process's and the server's: what the claims cost, whatever else the machine runs)."""
    name = f"g-{uuid.uuid4().hex[:8]}"
    per = jobs // groups
    batch: list[NewJob] = []
    for g in range(groups):
        batch += [_job(f"j{g}-{i}", f"tenant-{g}") for i in range(per)]
        if len(batch) >= 1000:
            await storage.enqueue(name, batch)
            batch = []
    if batch:
        await storage.enqueue(name, batch)
    seen: list[str] = []
    c0 = _cpu(pids)
    t0 = time.perf_counter()
    for _ in range(claims):
        [claim] = await storage.dequeue(name, "w", 1, 1.0, 300.0)
        seen.append(claim.id)
    elapsed = time.perf_counter() - t0
    cpu = _cpu(pids) - c0
    turns = min(claims, groups)
    first = [s.split("-")[0] for s in seen[:turns]]
    assert len(set(first)) == turns, "the first claims did not take the groups in turn"
    return elapsed / claims * 1e6, cpu / claims * 1e6


async def measure(
    make: Callable[[], Storage], jobs: int, claims: int, rounds: int, pids: Callable[[], list[int]] = _no_server
) -> dict[int, tuple[h.Spread, h.Spread]]:
    out: dict[int, list[tuple[float, float]]] = {g: [] for g in GROUPS}
    async with make() as storage:
        for _, g in h.interleaved(rounds, GROUPS):  # every size sees the same machine
            out[g].append(await one_run(storage, g, jobs, claims, pids))
    return {g: (h.Spread.of(w for w, _ in v), h.Spread.of(c for _, c in v)) for g, v in out.items()}


def _table(title: str, results: dict[str, dict[int, tuple[h.Spread, h.Spread]]], k: int) -> list[str]:
    """A table of measure ``k`` (0: elapsed, 1: CPU) of each storage, with the ratios of the medians."""
    rows = []
    for storage, r in results.items():
        m = {g: v[k] for g, v in r.items()}
        rows.append([storage, m[10].fmt(), m[1_000].fmt(), m[10_000].fmt(), f"{m[10_000] / m[10]:.2f}",
                     f"{m[10_000] / m[1_000]:.2f}"])
    head = ["storage", "10 groups", "1,000 groups", "10,000 groups", "ratio 10,000 / 10", "ratio 10,000 / 1,000"]
    return [title, "", *h.table(head, rows)]


def main() -> None:
    parser = h.parser(__doc__, out="groups.md", rounds=2, jobs=20_000, storages=("memory", "file", "redis", "postgres"))
    parser.add_argument("--claims", type=int, default=2_000)
    args = parser.parse_args()
    results: dict[str, dict[int, tuple[h.Spread, h.Spread]]] = {}
    notes: list[str] = []
    for target in h.each_storage(args.storages):
        results[target.name] = trio.run(measure, target.make, args.jobs, args.claims, args.rounds, target.server_pids)
        notes.append(target.note)
    lines = [
        "The same backlog of "
        f"{args.jobs:,} jobs spread evenly over 10 groups, then 1,000, then 10,000 groups; "
        f"{args.claims:,} claims of one job each (`Storage.dequeue(max_jobs=1)`: one turn of",
        "the ring a call) timed, median (min–max) of "
        f"{args.rounds} interleaved rounds. Ratio: cost with 10,000 groups / cost with 10.",
        "",
        *(f"- {n}" for n in notes),
        "",
        "No claim scans the groups (a ring of the groups with ready jobs, rotated on each claim);",
        "what a claim costs with many groups, and why, is discussed below the tables.",
        "",
    ]
    lines += _table("Elapsed (us a claim):", results, 0)
    lines += [""] + _table("CPU time, this process and the server (us a claim):", results, 1)
    h.write(args, "A claim's cost with 10, 1,000 and 10,000 groups", lines)


if __name__ == "__main__":
    main()
