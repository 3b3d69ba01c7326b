"""Where durable sleep and signals cross the other features (trees, removal and
retention, pause, groups, debounce, retry, the reaper): conformance, every backend with
the capabilities each test names."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import CancelStatus, Child, ChildJobFailedError, Job, JobState, Queue, Storage, UnrecoverableError

from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}
EVENTS = ("waiting_signal", "sleeping", "completed", "failed", "cancelled", "enqueued", "promoted")


def recorded(q: Queue[Any]) -> Recorder:
    """The queue's job events that these tests wait on, recorded (before it starts)."""
    events = Recorder()
    for name in EVENTS:
        q.on(name, events)
    return events


async def state_of(q: Queue[Any], job_id: str) -> JobState | None:
    status = await q.get_status(job_id)
    return None if status is None else status.state


# -- trees -------------------------------------------------------------------------------


@pytest.mark.capability("Trees", "Signals")
async def test_a_child_waiting_for_a_signal_is_cancelled_with_its_parent(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> Any:
        if job.id == "kid":
            return await job.wait_for_signal("go", timeout=3600)
        return "parent"

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None, children=[Child("kid")])
            await events.wait_for("waiting_signal", "kid")
            assert (await q.cancel("top")).status is CancelStatus.CANCELLED
            await events.wait_for("cancelled", "kid")
        assert await state_of(q, "kid") is JobState.CANCELLED
        assert await q.signal("kid", "go") == "not_found"
        assert (await q.counts())[JobState.WAITING_SIGNAL] == 0


@pytest.mark.capability("Trees", "Signals")
async def test_a_child_waiting_for_a_signal_is_cancelled_when_a_sibling_fails(storage: Storage, queue_name: str) -> None:
    q: Queue[Any]

    async def handler(job: Job[Any]) -> Any:
        if job.id == "kid":
            return await job.wait_for_signal("go")
        if job.id == "bad":
            await events.wait_for("waiting_signal", "kid")  # fail once its sibling waits
            raise UnrecoverableError("bad broke")
        return "parent"

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            with pytest.raises(ChildJobFailedError):
                await q.enqueue_and_wait("top", None, children=[Child("kid"), Child("bad")])
            await events.wait_for("cancelled", "kid")
        assert await state_of(q, "kid") is JobState.CANCELLED
        assert await q.signal("kid", "go") == "not_found"


@pytest.mark.capability("Trees", "Signals")
async def test_a_parent_waiting_for_a_signal_fails_when_its_child_fails(storage: Storage, queue_name: str) -> None:
    """``on_child_failure="cancel"``: a dynamic parent that waits for a signal while its
    child fails ends failed (``ChildJobFailedError``) at once, as a waiting parent does."""

    async def handler(job: Job[Any]) -> Any:
        if job.id == "bad":
            await events.wait_for("waiting_signal", "top")  # fail once its parent waits
            raise UnrecoverableError("bad broke")
        await job.add_children([Child("bad")])
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None)
            await events.wait_for("failed", "top")
        status = await q.get_status("top")
        assert status is not None and status.state is JobState.FAILED
        assert status.error is not None and status.error.type == "ChildJobFailedError" and "bad broke" in status.error.message
        assert await q.signal("top", "go") == "not_found"


@pytest.mark.capability("Trees", "Signals")
async def test_a_parent_whose_child_failed_while_it_ran_fails_when_it_waits_for_a_signal(storage: Storage, queue_name: str) -> None:
    """The run of a parent whose child failed under ``cancel`` fails it whatever it ends
    with (a completion, a retry, a sleep...): a wait for a signal too (it would wait for a
    message that can change nothing)."""

    async def handler(job: Job[Any]) -> Any:
        if job.id == "bad":
            raise UnrecoverableError("bad broke")
        await job.add_children([Child("bad")])
        await events.wait_for("failed", "bad")
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None)
            await events.wait_for("failed", "top")
        status = await q.get_status("top")
        assert status is not None and status.state is JobState.FAILED
        assert status.error is not None and status.error.type == "ChildJobFailedError"
        assert "top" not in events.ids("waiting_signal")
