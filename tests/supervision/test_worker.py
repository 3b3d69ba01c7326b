"""The Worker as an object of its own: a Queue that only produces and administers, and a
Worker (``Worker(queue, handler=...)``) that consumes it (conformance: every backend where
it matters)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import CancelStatus, Job, JobCancelledError, JobState, Queue, Storage, ValidationError, Worker
from trioqueue.storage import MemoryStorage

FAST: dict[str, Any] = {"retry_delay": 0, "block_timeout": 0.5}


async def double(job: Job[int]) -> int:
    return job.payload * 2


async def test_a_worker_consumes_the_jobs_of_a_producer_only_queue(storage: Storage, queue_name: str) -> None:
    """A producer Queue in one place, a Worker on its own Queue object in another (as two
    processes would be): the producer's job is run by the worker, and the producer never
    runs a consumer."""
    producer: Queue[int, int] = Queue(storage, name=queue_name)
    assert producer.worker is None
    worker = Worker(Queue(storage, name=queue_name), handler=double, **FAST)
    async with producer, worker:
        with trio.fail_after(30):
            assert await producer.enqueue_and_wait("a", 21) == 42
        status = await producer.get_status("a")
        assert status is not None and status.state is JobState.COMPLETED and status.worker_id is None
        assert worker.running and worker.queues[0].running  # the worker started its queue
    assert not worker.running and not worker.queues[0].running  # and stopped it


async def test_one_worker_consumes_two_queues(storage: Storage, queue_name: str) -> None:
    seen: list[tuple[str, int]] = []

    async def record(job: Job[int]) -> int:
        seen.append((job.id, job.payload))
        return job.payload

    first: Queue[int, int] = Queue(storage, name=f"{queue_name}-a")
    second: Queue[int, int] = Queue(storage, name=f"{queue_name}-b")
    async with first, second, Worker([first, second], handler=record, concurrency=2, **FAST) as worker:
        with trio.fail_after(30):
            assert await first.enqueue_and_wait("x", 1) == 1
            assert await second.enqueue_and_wait("y", 2) == 2
        assert sorted(seen) == [("x", 1), ("y", 2)]
        assert first.running and second.running and worker.running
    assert not first.running and not second.running  # stopped by the async with, not the worker


async def test_a_worker_of_several_queues_runs_concurrency_handlers_on_each(storage: Storage, queue_name: str) -> None:
    """``concurrency`` is per queue, not one budget shared by the queues (see the Worker's
    docstring for why): with ``concurrency=1``, a job of one queue that blocks does not
    hold up the other queue's job."""
    began = {"a": trio.Event(), "b": trio.Event()}
    release = trio.Event()

    async def hold(job: Job[str]) -> str:
        began[job.payload].set()
        await release.wait()
        return job.payload

    first: Queue[str, str] = Queue(storage, name=f"{queue_name}-a")
    second: Queue[str, str] = Queue(storage, name=f"{queue_name}-b")
    async with first, second, Worker([first, second], handler=hold, concurrency=1, **FAST):
        await first.enqueue("x", "a")
        await second.enqueue("y", "b")
        with trio.fail_after(30):
            await began["a"].wait()
            await began["b"].wait()  # both handlers run at once: one on each queue
            release.set()
            assert await first.enqueue_and_wait("x", "a") == "a"  # (its stored result)
            assert await second.enqueue_and_wait("y", "b") == "b"


async def test_run_under_nursery_start_and_stop_let_the_running_job_finish(storage: Storage, queue_name: str) -> None:
    began, release = trio.Event(), trio.Event()

    async def slow(job: Job[int]) -> int:
        began.set()
        await release.wait()
        return job.payload + 1

    async with Queue(storage, name=queue_name) as producer:
        worker = Worker(producer, handler=slow, **FAST)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                assert worker.running
                await producer.enqueue("a", 1)
                await began.wait()
                worker.stop()  # graceful: the running handler finishes, its result is stored
                release.set()
            assert not worker.running
            assert producer.running  # not the worker's to stop: it attached to it
            assert await producer.get_result("a") == 2


async def test_cancel_and_pause_through_the_queue_reach_a_worker_attached_to_it(
    storage: Storage, queue_name: str
) -> None:
    """The Queue's admin calls reach the Worker consuming it in this process: a cancel of
    the running job cancels its handler, a pause hands back what the worker prefetched."""
    began = trio.Event()

    async def forever(job: Job[int]) -> None:
        began.set()
        await trio.sleep_forever()

    async with Queue(storage, name=queue_name) as queue, Worker(queue, handler=forever, **FAST):
        with trio.fail_after(30):
            waiting = None
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    nonlocal waiting
                    try:
                        await queue.enqueue_and_wait("a", 1)
                    except JobCancelledError as exc:
                        waiting = exc

                nursery.start_soon(wait)
                await began.wait()
                assert (await queue.cancel("a")).status is CancelStatus.CANCELLED
            assert isinstance(waiting, JobCancelledError)
            assert await queue.pause()
            await queue.enqueue("b", 2)
            status = await queue.get_status("b")
            assert status is not None and status.state is JobState.QUEUED


async def test_the_shorthand_queue_owns_a_worker_built_from_its_settings() -> None:
    queue: Queue[int, int] = Queue(MemoryStorage(), handler=double, concurrency=3, visibility_timeout=5.0)
    assert queue.worker is not None and queue.worker.queues == (queue,)
    assert queue.worker.settings is queue.worker_settings and queue.worker.worker_id == queue.worker_id
    assert (queue.concurrency, queue.prefetch, queue.lease_margin) == (3, 3, 2.0)
    async with queue:
        assert queue.worker.running
        assert await queue.enqueue_and_wait("a", 2) == 4
    assert not queue.worker.running


def test_worker_settings_are_validated_and_copied() -> None:
    queue: Queue[int, int] = Queue(MemoryStorage())
    with pytest.raises(ValidationError, match="needs a handler"):
        Worker(queue)
    with pytest.raises(ValidationError, match="a handler or a batch_handler, not both"):
        Worker(queue, handler=double, batch_handler=lambda jobs: jobs)
    with pytest.raises(ValidationError, match="consumes trioqueue Queues, got str"):
        Worker("queue", handler=double)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="at least one Queue"):
        Worker([], handler=double)
    with pytest.raises(ValidationError, match="each queue once"):
        Worker([queue, Queue(queue.storage)], handler=double)
    with pytest.raises(ValidationError, match="concurrency"):
        Worker(queue, handler=double, concurrency=0)
    with pytest.raises(ValidationError, match="handler must be callable"):
        Worker(queue, handler=42)  # type: ignore[arg-type]
    worker = Worker(queue, handler=double, concurrency=4, worker_id="w-1")
    assert (worker.worker_id, worker.concurrency, worker.settings.prefetch) == ("w-1", 4, 4)
    copied = worker.copy(concurrency=2)
    assert copied.handler is double and copied.concurrency == 2 and copied.settings.prefetch == 2
    assert copied.worker_id != "w-1" and copied.queues == (queue,)
    batch = Worker(queue, batch_handler=lambda jobs: [None] * len(jobs), batch_size=10)
    assert batch.settings.batch is not None and batch.copy().settings.batch == batch.settings.batch


async def test_a_worker_cannot_run_twice(storage: Storage, queue_name: str) -> None:
    worker = Worker(Queue(storage, name=queue_name), handler=double, **FAST)
    async with worker:
        with pytest.raises(Exception, match="already running"):
            await worker.run()
