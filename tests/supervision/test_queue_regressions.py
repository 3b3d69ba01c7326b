"""Regression tests for the Queue's shutdown, waiter and handler-exception paths (issue #8),
run against every backend. Faults are injected by wrapping one method of the real storage
instance (a gate the test controls); the backend itself is never replaced."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import (
    Job,
    JobFailedError,
    JobState,
    Queue,
    QueueStoppedError,
    Storage,
    StorageError,
    TrioQueueError,
    ValidationError,
)
from trioqueue.storage import NonBlockingStart, StorageEvent

FAST = {"retry_delay": 0, "block_timeout": 0.5}


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[0] is not None
    return False


def _through_the_settler(storage: Storage) -> None:
    """Settlements go through the settler task's ``settle()`` call (the one these tests
    hold in flight): on a storage where a worker about to go idle stores them itself with
    a plain call (:class:`NonBlockingStart`), that call is refused, so they go there."""
    if isinstance(storage, NonBlockingStart):

        def refuse(*args: Any) -> list[bool]:
            raise StorageError("not now")

        storage.settle_nowait = refuse  # type: ignore[method-assign]


async def test_forced_stop_keeps_settlements_that_were_in_flight(storage: Storage, queue_name: str) -> None:
    """A handler that returned is settled exactly once even when the consumer is cancelled
    while its settlement is on the way: the job is not run again and its attempt counter
    does not go backwards."""
    runs: list[int] = []
    settling = trio.Event()
    real_settle = storage.settle
    gate = {"armed": True}

    async def stuck_settle(*args: Any) -> list[bool]:
        if gate["armed"]:
            gate["armed"] = False
            settling.set()
            await trio.sleep_forever()  # the batch is in flight when the forced stop lands
        return await real_settle(*args)

    storage.settle = stuck_settle  # type: ignore[method-assign]
    _through_the_settler(storage)

    async def handler(job: Job[Any]) -> str:
        runs.append(job.attempts)
        return "done"

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            q: Queue[Any, Any] = Queue(storage, name=queue_name, handler=handler, reaper=False, **FAST)
            await nursery.start(q.run)
            await q.enqueue("once", 1)
            await settling.wait()
            nursery.cancel_scope.cancel()  # forced stop
        # A second consumer must find nothing to do: the job is completed.
        async with Queue(storage, name=queue_name, handler=handler, **FAST) as q2:
            status = await q2.get_status("once")
            assert status is not None and status.state is JobState.COMPLETED, status
            assert status.attempts == 1 and status.result == "done"
    assert runs == [1]


async def test_forced_stop_after_settlement_landed_reports_no_fencing(storage: Storage, queue_name: str) -> None:
    """A settlement that reached the storage but whose caller was cancelled before the reply
    is not stored twice: the job ends completed once, with no ``fenced`` refusal."""
    settled = trio.Event()
    real_settle = storage.settle
    gate = {"armed": True}
    refusals: list[StorageEvent] = []

    async def lost_reply(*args: Any) -> list[bool]:
        out = await real_settle(*args)
        if gate["armed"]:
            gate["armed"] = False
            settled.set()
            await trio.sleep_forever()
        return out

    storage.settle = lost_reply  # type: ignore[method-assign]
    _through_the_settler(storage)

    async def handler(job: Job[Any]) -> str:
        return "ok"

    with trio.fail_after(20):
        async with storage.subscribe(queue_name) as events:
            async with trio.open_nursery() as nursery:
                q: Queue[Any, Any] = Queue(storage, name=queue_name, handler=handler, reaper=False, **FAST)
                await nursery.start(q.run)
                await q.enqueue("landed", 1)
                await settled.wait()
                nursery.cancel_scope.cancel()
            record = await storage.get_job(queue_name, "landed")
            assert record is not None and record.state.startswith("completed") and record.attempts == 1
            with trio.move_on_after(0.5):  # collect what the stream carried
                async for batch in events:
                    refusals += [e for e in batch if e.kind == "fenced"]
    assert refusals == []


class CustomStop(BaseException):
    """A BaseException that is not one of Trio's or the interpreter's."""


async def test_base_exception_in_handler_consumes_attempts(storage: Storage, queue_name: str) -> None:
    runs: list[int] = []

    async def handler(job: Job[Any]) -> None:
        runs.append(job.attempts)
        raise CustomStop("not an Exception")

    with trio.fail_after(20):
        async with Queue(storage, name=queue_name, handler=handler, max_attempts=2, **FAST) as q:
            with pytest.raises(JobFailedError) as info:
                await q.enqueue_and_wait("poison", 1, timeout=15)
            assert info.value.error.type == "CustomStop"
            status = await q.get_status("poison")
            assert status is not None and status.state is JobState.FAILED and status.attempts == 2
    assert runs == [1, 2]


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
async def test_system_exit_in_handler_settles_then_propagates(
    storage: Storage, queue_name: str, exc_type: type[BaseException]
) -> None:
    async def handler(job: Job[Any]) -> None:
        raise exc_type("stop the process")

    with trio.fail_after(20):
        with pytest.raises(BaseException) as info:
            async with Queue(storage, name=queue_name, handler=handler, max_attempts=3, **FAST) as q:
                await q.enqueue("exit", 1)
                await trio.sleep_forever()
        assert _contains(info.value, exc_type), repr(info.value)
        record = await storage.get_job(queue_name, "exit")
        assert record is not None
        # the failed attempt is counted and its error stored; with no retry delay the job may
        # already be back in the ready list (promoted by the reaper on its way out)
        assert record.state.split(":")[0] in ("failing", "queued") and record.attempts == 1, record
        assert record.error is not None and exc_type.__name__.encode() in record.error


async def test_stop_fails_pending_waiters_at_once(storage: Storage, queue_name: str) -> None:
    outcome: list[BaseException] = []

    async def waiter(q: Queue[Any, Any], task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await q.enqueue_and_wait("never-run", 1, timeout=60)
        except TrioQueueError as exc:
            outcome.append(exc)

    with trio.fail_after(5):  # far less than the waiter's own timeout
        async with trio.open_nursery() as nursery:
            q: Queue[Any, Any] = Queue(storage, name=queue_name)  # a producer: nobody runs the job
            await nursery.start(q.run)
            nursery.start_soon(waiter, q)
            await trio.testing.wait_all_tasks_blocked()
            q.stop()
    [exc] = outcome
    assert isinstance(exc, QueueStoppedError) and "never-run" in str(exc)


async def test_waiter_woken_by_resync_and_completion_together_returns(storage: Storage, queue_name: str) -> None:
    """A resync notice delivered together with the job's completion must not make the
    waiter sleep until its timeout (the resync path used to swap in a fresh wake-up)."""
    real_subscribe = storage.subscribe

    @asynccontextmanager
    async def resync_before_completions(
        queue: str, kinds: Any = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        async with real_subscribe(queue, kinds) as upstream, trio.open_nursery() as nursery:

            async def pump() -> None:
                async for batch in upstream:
                    if any(e.kind == "completed" for e in batch):
                        batch = [StorageEvent("resync", ""), *batch]
                    send.send_nowait(batch)

            nursery.start_soon(pump)
            yield receive
            nursery.cancel_scope.cancel()

    storage.subscribe = resync_before_completions  # type: ignore[method-assign]

    async def handler(job: Job[Any]) -> int:
        return int(job.payload) + 1

    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        with trio.fail_after(5):
            for i in range(5):
                assert await q.enqueue_and_wait(f"rs-{i}", i, timeout=30) == i + 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"name": ""}, "name"), ({"worker_id": ""}, "worker_id"), ({"name": 5}, "name")],
)
def test_constructor_errors_name_the_field(storage_free_memory: Storage, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Queue(storage_free_memory, **kwargs)
    assert str(info.value).startswith(field), str(info.value)
    assert "job id" not in str(info.value)


async def test_waiter_on_reenqueued_job_ignores_the_old_cancellation(storage: Storage, queue_name: str) -> None:
    """cancel(id) then enqueue_and_wait(id): the waiter belongs to the new incarnation and
    must get its result, not the old incarnation's cancellation."""
    real_subscribe = storage.subscribe
    hold = trio.Event()

    @asynccontextmanager
    async def late_events(
        queue: str, kinds: Any = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        # Deliver the stream only once the test says so: the old ``cancelled`` notice then
        # reaches the queue after the new incarnation was enqueued, as it may on a busy loop.
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        async with real_subscribe(queue, kinds) as upstream, trio.open_nursery() as nursery:

            async def pump() -> None:
                await hold.wait()
                async for batch in upstream:
                    send.send_nowait(batch)

            nursery.start_soon(pump)
            yield receive
            nursery.cancel_scope.cancel()

    storage.subscribe = late_events  # type: ignore[method-assign]
    producer = Queue(storage, name=queue_name)
    producer.on("cancelled", lambda event: None)  # subscribed from the start: it hears the old cancel
    async with producer:
        await producer.enqueue("again", 1)
        assert (await producer.cancel("again")).status.value == "cancelled"
        async with Queue(storage, name=queue_name, handler=lambda job: job.payload * 10, **FAST) as consumer:
            del consumer
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    results: list[Any] = []

                    async def wait_new() -> None:
                        results.append(await producer.enqueue_and_wait("again", 2, timeout=9))

                    nursery.start_soon(wait_new)
                    await trio.testing.wait_all_tasks_blocked()
                    hold.set()
            assert results == [20]


async def test_a_forced_stop_interrupts_handlers_that_never_block(storage: Storage, queue_name: str) -> None:
    """Workers run handlers that never block back to back, without a schedule point per
    job, but a forced stop still ends them well before the backlog is done; every job
    then completes exactly once (nothing lost, nothing run twice)."""
    total = 2000
    runs: dict[str, int] = {}
    stop_at = 50
    scope = trio.CancelScope()

    async def handler(job: Job[Any]) -> int:
        runs[job.id] = runs.get(job.id, 0) + 1
        if len(runs) == stop_at:
            scope.cancel()  # a forced stop, seen at the worker's next cancel point
        return 1

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([(f"j{i}", i) for i in range(total)])
        with trio.fail_after(30):
            with scope:
                async with Queue(storage, name=queue_name, handler=handler, concurrency=4, **FAST):
                    await trio.sleep_forever()
            assert stop_at <= len(runs) < total // 2
            counts = await storage.counts(queue_name)
            assert counts["processing"] == 0 and counts["completed"] == len(runs)
            async with Queue(storage, name=queue_name, handler=handler, concurrency=4, **FAST) as again:
                done = await again.enqueue_and_wait("last", None)
    assert done == 1 and len(runs) == total + 1 and set(runs.values()) == {1}
