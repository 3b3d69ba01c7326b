"""Progress reporting through the Queue API (conformance: every backend)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import Job, Queue, Storage, TrioQueueError

from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_handler_progress_reaches_status_and_events(storage: Storage, queue_name: str) -> None:
    checkpoint = trio.Event()
    proceed = trio.Event()

    async def handler(job: Job[Any]) -> str:
        await job.report_progress(0.25)
        await job.report_progress({"done": 3, "of": 4})
        checkpoint.set()
        await proceed.wait()
        return "ok"

    progress = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    q.on("progress", progress)
    async with q:
        await q.enqueue("long", None)
        with trio.fail_after(10):
            await checkpoint.wait()
            await progress.wait_for("progress", "long", count=2)
            status = await q.get_status("long")
            assert status is not None and status.progress == {"done": 3, "of": 4}
            proceed.set()
            assert await q.enqueue_and_wait("long", None) == "ok"
    assert [e.data["progress"] for e in progress.events] == [0.25, {"done": 3, "of": 4}]
    assert progress.events[0].data["worker_id"] == q.worker_id


async def test_report_progress_outside_the_handler_is_refused(storage_free_memory: Storage) -> None:
    job: Job[None] = Job("x", None, 1, 3, 0.0, "w")
    with pytest.raises(TrioQueueError, match="report_progress for job 'x' called outside that job's"):
        await job.report_progress(1)


async def test_progress_belongs_to_the_running_attempt(storage: Storage, queue_name: str) -> None:
    """A task the handler starts reports for its job while the handler runs; a task that
    outlives the handler (started in an outer nursery) is refused, also while the same
    worker runs the next job, and a sync handler's thread cannot report at all."""
    outcomes: dict[str, str] = {}
    second_running = trio.Event()
    stale_done = trio.Event()

    async def report(job: Job[Any], label: str) -> None:
        try:
            await job.report_progress(label)
            outcomes[label] = "stored"
        except TrioQueueError:
            outcomes[label] = "refused"

    async with trio.open_nursery() as outer:

        async def stale(job: Job[Any]) -> None:
            await second_running.wait()
            await report(job, "stale")
            stale_done.set()

        async def handler(job: Job[Any]) -> None:
            if job.id == "first":
                async with trio.open_nursery() as inner:
                    inner.start_soon(report, job, "child")
                outer.start_soon(stale, job)
            else:
                second_running.set()
                await stale_done.wait()

        async with Queue(storage, name=queue_name, handler=handler, concurrency=1, **FAST) as q:
            with trio.fail_after(10):
                await q.enqueue_and_wait("first", None)
                await q.enqueue_and_wait("second", None)
    assert outcomes == {"child": "stored", "stale": "refused"}

    def sync_handler(job: Job[Any]) -> str:
        try:
            trio.from_thread.run(job.report_progress, 1)
        except TrioQueueError:
            return "refused"
        return "stored"

    async with Queue(storage, name=queue_name, handler=sync_handler, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("sync", None) == "refused"
