"""A worker whose lease on a job ran out while its handler still ran (conformance: every
backend). The reaper hands the job to a worker again, maybe the same one: that worker then
holds two claims of one job id at once, and each ends on its own."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trioqueue import Job, JobState, Queue, Storage
from trioqueue.testing import FaultPlan, FaultyStorage

from support import Recorder


async def test_one_worker_holding_two_claims_of_one_job_survives_both_ending(storage: Storage, queue_name: str) -> None:
    """Heartbeats fail while the first attempt runs: its lease runs out, the reaper puts
    the job back and the same worker (concurrency 2) claims it again. The second attempt
    completes, then the first ends; the worker used to crash there (KeyError: running
    handlers were keyed by job id, not by claim)."""
    faulty = FaultyStorage(storage, FaultPlan(fail_before=1.0, methods=frozenset({"heartbeat"})))
    faulty.enabled = False  # healthy until the first attempt runs
    release_first = trio.Event()
    attempts: list[tuple[str, int]] = []

    async def handler(job: Job[Any]) -> str:
        attempts.append((job.id, job.attempts))
        if job.id == "j" and len(attempts) == 1:
            faulty.enabled = True  # heartbeats fail from now on: the lease runs out
            await release_first.wait()
            return "first"
        return f"done {job.id}"

    completed = Recorder()
    queue = Queue(
        faulty, name=queue_name, handler=handler, concurrency=2, visibility_timeout=0.5, block_timeout=0.2, retry_delay=0
    )
    queue.on("completed", completed)
    async with queue:
        await queue.enqueue("j", None)
        with trio.fail_after(20):
            await completed.wait_for("completed", "j")  # the second claim's attempt
        assert [a for a in attempts if a[0] == "j"] == [("j", 1), ("j", 2)]
        faulty.enabled = False
        release_first.set()  # the first attempt ends: its settlement is fenced
        with trio.fail_after(20):
            assert await queue.enqueue_and_wait("k", None) == "done k"  # the worker still runs
        status = await queue.get_status("j")
        assert status is not None and status.state is JobState.COMPLETED and status.result == "done j"
