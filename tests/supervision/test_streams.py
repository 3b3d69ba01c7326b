"""Events as async iterators (``Queue.events()``, ``Queue.watch()``)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import Job, JobState, Queue, QueueEvent, Storage, ValidationError
from trioqueue._supervision._streams import EventStream

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_events_stream_filters_by_name_and_job(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=lambda job: job.payload, **FAST) as q:
        async with q.events("completed", job_ids=["b", "c"]) as stream:
            await q.enqueue_many([("a", 1), ("b", 2), ("c", 3)])
            got: list[QueueEvent] = []
            with trio.fail_after(10):
                async for event in stream:
                    got.append(event)
                    if len(got) == 2:
                        break
    assert sorted(e.job_id for e in got if e.job_id) == ["b", "c"]
    assert all(e.name == "completed" and e.queue == queue_name for e in got)


async def test_stream_ends_when_the_queue_stops(storage: Storage, queue_name: str) -> None:
    q: Queue[Any, Any] = Queue(storage, name=queue_name, **FAST)
    seen: list[str] = []
    got_one = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)

            async def reader(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                async with q.events() as stream:
                    task_status.started()
                    async for event in stream:
                        seen.append(event.name)
                        got_one.set()

            await nursery.start(reader)
            await q.enqueue("x", None)
            await got_one.wait()
            q.stop()  # the reader's loop ends: the nursery can exit
    assert "enqueued" in seen


async def test_slow_reader_gets_a_resync_marking_the_gap() -> None:
    stream = EventStream("q", None, None, buffer=2)
    for i in range(5):
        stream.push(QueueEvent("enqueued", "q", f"j{i}"))
    stream.push(QueueEvent("completed", "q", "j0"))  # still full: dropped
    first = [await stream.__anext__(), await stream.__anext__()]
    stream.push(QueueEvent("completed", "q", "j1"))
    rest = [await stream.__anext__(), await stream.__anext__()]
    assert [e.job_id for e in first] == ["j0", "j1"]
    assert [(e.name, e.job_id) for e in rest] == [("resync", None), ("completed", "j1")]
    assert stream.dropped == 4 and rest[0].data == {"dropped": 4}


def test_events_arguments_are_validated() -> None:
    with pytest.raises(ValidationError, match=r"unknown event names \['nope'\]"):
        EventStream("q", ["nope"], None, 10)
    with pytest.raises(ValidationError, match="buffer must be a positive int, got 0"):
        EventStream("q", None, None, 0)


async def test_watch_follows_a_job_until_it_is_terminal(storage: Storage, queue_name: str) -> None:
    go = trio.Event()

    async def handler(job: Job[Any]) -> str:
        await job.report_progress(50)
        await go.wait()
        return "done"

    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        await q.enqueue("w", None)
        states: list[tuple[JobState, Any]] = []
        with trio.fail_after(10):
            async for status in q.watch("w"):
                assert status is not None
                states.append((status.state, status.progress))
                if status.progress == 50:
                    go.set()
    assert states[-1][0] is JobState.COMPLETED
    assert (JobState.PROCESSING, 50) in states
    assert [s for s, _ in states].count(JobState.COMPLETED) == 1
