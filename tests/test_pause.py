"""Pause and resume through the Queue API (conformance: every backend)."""

from __future__ import annotations

from typing import Any

import trio

from trioqueue import Job, Queue, Storage

from support import Recorder

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
