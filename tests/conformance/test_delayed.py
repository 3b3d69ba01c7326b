"""Delayed and scheduled jobs through the Queue API (conformance: every backend)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from trioqueue import CancelStatus, Job, JobCancelledError, JobState, Queue, Storage, ValidationError

from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_delayed_job_runs_once_due(storage: Storage, queue_name: str) -> None:
    ran_at: list[float] = []

    async def handler(job: Job[Any]) -> str:
        ran_at.append(time.time())
        return job.payload

    promoted = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    q.on("promoted", promoted)
    async with q:
        before = time.time()
        await q.enqueue("reminder", "ping", delay=0.3)
        status = await q.get_status("reminder")
        assert status is not None and status.state is JobState.DELAYED
        assert status.run_at is not None and status.run_at >= before + 0.29
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("reminder", "ping") == "ping"  # joins the delayed job
            await promoted.wait_for("promoted", "reminder")
    assert len(ran_at) == 1 and ran_at[0] >= status.run_at


async def test_at_accepts_an_aware_datetime_or_a_timestamp(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=lambda job: job.id, **FAST) as q:
        when = datetime.now(UTC) + timedelta(seconds=0.2)
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("by-datetime", None, at=when) == "by-datetime"
            assert await q.enqueue_and_wait("by-timestamp", None, at=time.time() + 0.1) == "by-timestamp"
            assert await q.enqueue_and_wait("in-the-past", None, at=datetime(2020, 1, 1, tzinfo=UTC)) == "in-the-past"


async def test_cancel_a_delayed_job(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=lambda job: pytest.fail("cancelled job ran"), **FAST) as q:
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                with pytest.raises(JobCancelledError):
                    await q.enqueue_and_wait("later", None, delay=60)

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert (await q.cancel("later")).status is CancelStatus.CANCELLED
        status = await q.get_status("later")
        assert status is not None and status.state is JobState.CANCELLED


async def test_delay_arguments_are_validated(storage_free_memory: Storage) -> None:
    async with Queue(storage_free_memory) as q:
        with pytest.raises(ValidationError, match=r"give delay or at, not both \(job 'j'\)"):
            await q.enqueue("j", None, delay=1, at=time.time())
        with pytest.raises(ValidationError, match=r"delay must be finite and >= 0, got -1.0 \(job 'j'\)"):
            await q.enqueue("j", None, delay=-1)
        with pytest.raises(ValidationError, match=r"at must be a timezone-aware datetime, got naive 2030-01-01T00:00:00"):
            await q.enqueue("j", None, at=datetime(2030, 1, 1))
        assert await q.get_status("j") is None
