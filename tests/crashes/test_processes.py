"""Crash tests with real processes, on every backend that several processes can share.

Worker processes (tests/helpers/queue_worker.py) run real Queues and Reapers and are
SIGKILLed mid-job; the jobs they held must be recovered and completed.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import BACKENDS, _make_storage
from support import HELPERS, ProcessLines, Recorder
from trioqueue import Job, JobState, Queue, Storage

HELPER = str(HELPERS / "queue_worker.py")
SHARED_BACKENDS = [b for b in BACKENDS if b != "memory"]  # memory cannot span processes


@pytest.fixture(params=SHARED_BACKENDS)
async def shared_storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    st = _make_storage(request.param, request, tmp_path)
    async with st:
        yield st


def spec_of(storage: Storage, **extra: Any) -> dict[str, Any]:
    from trioqueue.storage.file import FileStorage

    if isinstance(storage, FileStorage):
        return {"backend": "file", "directory": str(storage.directory), **extra}
    if type(storage).__name__ == "PostgresStorage":
        return {"backend": "postgres", "url": storage.url, "schema": storage.schema, **extra}  # type: ignore[attr-defined]
    return {"backend": "redis", "url": storage.url, "prefix": storage.prefix, **extra}  # type: ignore[attr-defined]


class Fleet:
    """Child processes of one test; every one is killed and reaped when the test ends."""

    def __init__(self) -> None:
        self.procs: dict[str, trio.Process] = {}

    async def start(self, mode: str, spec: dict[str, Any], ready: str) -> ProcessLines:
        proc = await trio.lowlevel.open_process(
            [sys.executable, HELPER, mode, json.dumps(spec)], stdout=subprocess.PIPE
        )
        self.procs[spec["worker_id"]] = proc
        lines = ProcessLines(proc)
        await lines.wait_for(ready)
        return lines

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
                if proc.stdout is not None:
                    await proc.stdout.aclose()


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet()
    try:
        yield f
    finally:
        await f.close()


def executions(log: Path) -> Counter[str]:
    if not log.exists():
        return Counter()
    return Counter(line.split(" ")[0] for line in log.read_text().splitlines() if line)


async def test_sigkilled_worker_process_job_is_recovered(
    shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str
) -> None:
    log = tmp_path / "executions.log"
    spec = spec_of(shared_storage, queue=queue_name, worker_id="victim", log=str(log), visibility_timeout=1.0)
    with trio.fail_after(60):
        await fleet.start("worker", spec, "READY")
        started = Recorder()

        async def rescuer(job: Job[Any]) -> dict[str, Any]:
            return {"id": job.id, "by": "rescuer", "attempt": job.attempts}

        async with Queue(shared_storage, name=queue_name) as producer:
            producer.on("stalled", started)
            await producer.enqueue("long-job", {"seconds": 3600})
            # The victim picks it up (its handler logs the start), then dies mid-job.
            while executions(log)["long-job"] == 0:
                await trio.sleep(0.02)  # the log is another process's file: nothing to wait on
            fleet.kill("victim")
            status = await producer.get_status("long-job")
            assert status is not None and status.state is JobState.PROCESSING and status.worker_id == "victim"
            async with Queue(shared_storage, name=queue_name, handler=rescuer, visibility_timeout=1.0, retry_delay=0):
                result = await producer.enqueue_and_wait("long-job", None, timeout=30)
            await started.wait_for("stalled", "long-job")
    assert result == {"id": "long-job", "by": "rescuer", "attempt": 2}


async def test_reaper_leader_process_killed_follower_takes_over(
    shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str
) -> None:
    base = spec_of(shared_storage, queue=queue_name, lock_ttl=1.0, log=str(tmp_path / "unused.log"))
    with trio.fail_after(30):
        await fleet.start("reaper", {**base, "worker_id": "reaper-a"}, "LEADER reaper-a")
        follower = await fleet.start("reaper", {**base, "worker_id": "reaper-b"}, "FOLLOWER reaper-b")
        fleet.kill("reaper-a")  # dies holding the lock: no release
        await follower.wait_for("LEADER reaper-b")


async def test_random_sigkills_lose_no_job(shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str) -> None:
    """N unique jobs, three worker processes, random SIGKILLs (each replaced by a fresh
    process) during the run: at the end every job is completed with its result stored,
    and ran at least once. Duplicates (at-least-once after a crash) are reported."""
    rng = random.Random(uuid.uuid4().int)
    log = tmp_path / "executions.log"
    total = 300
    jobs = [(f"job-{i:04}", {"seconds": rng.uniform(0.0, 0.03)}) for i in range(total)]
    completed = Recorder()
    generation = 0

    def spec(slot: int) -> dict[str, Any]:
        return spec_of(
            shared_storage,
            queue=queue_name,
            worker_id=f"w{slot}-{generation}",
            log=str(log),
            visibility_timeout=1.0,
            concurrency=4,
        )

    with trio.fail_after(180):
        async with Queue(shared_storage, name=queue_name) as producer:
            producer.on("completed", completed)
            alive = {}
            for slot in range(3):
                await fleet.start("worker", spec(slot), "READY")
                alive[slot] = spec(slot)["worker_id"]
            await producer.enqueue_many(jobs)
            kills = 0
            for _ in range(4):
                await trio.sleep(rng.uniform(0.2, 0.6))  # random moment in the run
                slot = rng.randrange(3)
                fleet.kill(alive[slot])
                kills += 1
                generation += 1
                await fleet.start("worker", spec(slot), "READY")
                alive[slot] = spec(slot)["worker_id"]
            await completed.wait_until(lambda evs: len({e.job_id for e in evs}) >= total)
            for job_id, _ in jobs:
                status = await producer.get_status(job_id)
                assert status is not None and status.state is JobState.COMPLETED, (job_id, status)
                assert status.result["id"] == job_id
    runs = executions(log)
    assert set(runs) == {job_id for job_id, _ in jobs}
    duplicates = {j: n for j, n in runs.items() if n > 1}
    print(f"{kills} SIGKILLs, {len(duplicates)} of {total} jobs ran more than once: {sorted(duplicates.items())[:10]}")
