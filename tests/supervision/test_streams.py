"""Events as async iterators (``Queue.events()``, ``Queue.watch()``)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import Job, JobError, JobState, Queue, QueueEvent, Storage, ValidationError
from trioqueue._model._serde import encode_error
from trioqueue._supervision._streams import EventStream
from trioqueue.storage import SettleKind

from storage_helpers import W1, claim, job, settlement

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


async def test_callbacks_and_streams_see_a_settlement_batch_s_events_in_its_order(storage: Storage, queue_name: str) -> None:
    """The completed events of a batch reach ``on()`` callbacks and ``events()`` in runs
    (one call for the run): a failure between two runs still comes between them."""
    order = ["a", "b", "c", "d", "e"]
    fails = {"c"}
    seen: list[tuple[str, str | None]] = []
    all_seen = trio.Event()

    def record(e: QueueEvent) -> None:
        seen.append((e.name, e.job_id))
        if len(seen) == len(order):
            all_seen.set()

    async with Queue(storage, name=queue_name, **FAST) as q:
        for name in ("completed", "failed"):
            q.on(name, record)
        async with q.events("completed", "failed") as stream:
            await storage.enqueue(queue_name, [job(j, max_attempts=1) for j in order])
            claimed = await claim(storage, queue_name, W1, n=len(order))
            assert sorted(c.id for c in claimed) == order
            batch = [
                settlement(SettleKind.FAIL if j in fails else SettleKind.COMPLETE, queue_name, j, encode_error(JobError("E", "m")) if j in fails else b"1", ttl=60)
                for j in order
            ]
            assert await storage.settle(queue_name, W1, batch) == [True] * len(order)
            streamed: list[tuple[str, str | None]] = []
            with trio.fail_after(10):
                async for event in stream:
                    streamed.append((event.name, event.job_id))
                    if len(streamed) == len(order):
                        break
                await all_seen.wait()
    expected = [("failed" if j in fails else "completed", j) for j in order]
    assert streamed == expected
    assert seen == expected
