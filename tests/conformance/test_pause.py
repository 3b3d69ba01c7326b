"""Pause and resume through the Queue API (conformance: every backend)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, JobState, Queue, Storage

from support import Recorder

pytestmark = pytest.mark.capability("Administration")

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_pause_stops_every_worker_and_resume_wakes_them(storage: Storage, queue_name: str) -> None:
    ran: list[str] = []

    async def handler(job: Job[Any]) -> None:
        ran.append(job.id)

    events = Recorder()
    async with Queue(storage, name=queue_name, **FAST) as admin:  # a producer pausing two workers
        async with (
            Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST) as w1,
            Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST) as w2,
        ):
            w1.on("resumed", events)
            w1.on("completed", events)
            assert await admin.pause() and await w2.is_paused()
            await admin.enqueue_many([(f"j{i}", None) for i in range(6)])
            await trio.testing.wait_all_tasks_blocked(0.2)  # nobody may claim them
            assert ran == []
            assert await admin.resume() and not await w1.is_paused()
            with trio.fail_after(10):
                await events.wait_for("completed", count=6)
            assert sorted(ran) == [f"j{i}" for i in range(6)]
            assert events.ids("resumed") == [None]


@pytest.mark.parametrize("pauser", ["the worker", "another queue"])
async def test_pause_starts_no_prefetched_job(storage: Storage, queue_name: str, pauser: str) -> None:
    """Jobs a worker had prefetched when ``pause()`` returned never start while paused:
    they go back to the queue (attempts not counted) and run after ``resume()``."""
    gate = trio.Event()
    started: list[str] = []

    async def handler(job: Job[Any]) -> None:
        started.append(job.id)
        if job.payload == "block":
            await gate.wait()

    events = Recorder()
    async with Queue(storage, name=queue_name, **FAST) as admin:
        async with Queue(storage, name=queue_name, handler=handler, concurrency=2, prefetch=2, **FAST) as w:
            w.on("completed", events)
            await admin.enqueue_many([("a", "block"), ("b", "block"), ("c", None), ("d", None)])
            with trio.fail_after(10):  # a and b run, c and d wait in the worker's buffer
                while len(await storage.held_jobs(queue_name, w.worker_id)) < 4 or len(started) < 2:
                    await trio.sleep(0.01)  # no event says "claimed": look
            assert sorted(started) == ["a", "b"]
            assert await (w if pauser == "the worker" else admin).pause()
            gate.set()
            with trio.fail_after(10):
                await events.wait_for("completed", count=2)
            await trio.testing.wait_all_tasks_blocked(0.3)
            assert sorted(started) == ["a", "b"]
            for job_id in ("c", "d"):
                status = await admin.get_status(job_id)
                assert status is not None and status.state is JobState.QUEUED and status.attempts == 0
            assert await admin.resume()
            with trio.fail_after(10):
                await events.wait_for("completed", count=4)
            assert sorted(started) == ["a", "b", "c", "d"]
