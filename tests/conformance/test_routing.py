"""Events routed by need (issue 11), on every storage: ``subscribe(queue, kinds=...)``
delivers only the kinds asked for (plus ``resync``), and a Queue subscribes only as far
as its waiters, consumer, callbacks and streams need: a pure producer not at all, a
waiter to the terminal notices only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

import trio

from support import Recorder
from storage_helpers import MIXED_EVENTS, job, mixed_lifecycle
from trioqueue import Job, Queue
from trioqueue.storage import Storage, StorageEvent
from trioqueue.storage._base import NOTICE_KINDS
from trioqueue.testing import FaultyStorage

FAST = dict(block_timeout=0.2, visibility_timeout=5.0)


async def _until(events: Any, last: tuple[str, str]) -> list[tuple[str, str]]:
    """Every (kind, job id) received up to and including ``last`` (resyncs left out)."""
    seen: list[tuple[str, str]] = []
    with trio.fail_after(10):
        while last not in seen:
            batch = await events.receive()
            assert batch, "a subscription never delivers an empty batch"
            seen.extend((e.kind, e.job_id) for e in batch if e.kind != "resync")
    return seen


async def test_subscribe_by_kinds(storage: Storage, queue_name: str) -> None:
    q = queue_name
    async with (
        storage.subscribe(q) as every,
        storage.subscribe(q, kinds=NOTICE_KINDS) as notices,
        storage.subscribe(q, kinds={"completed"}) as completions,
        storage.subscribe(q, kinds=["enqueued"]) as enqueues,
    ):
        await mixed_lifecycle(storage, q)  # a, b, c enqueued; a completed, b failing, c cancelled, zz fenced
        await storage.enqueue(q, [job("end")])
        assert await _until(every, ("enqueued", "end")) == [*MIXED_EVENTS, ("enqueued", "end")]
        # The notice subscriber gets the outcomes, in order, and never an ``enqueued``.
        assert await _until(notices, ("fenced", "zz")) == [
            ("completed", "a"),
            ("due", ""),
            ("cancelled", "c"),
            ("fenced", "zz"),
        ]
        assert await _until(completions, ("completed", "a")) == [("completed", "a")]
        assert await _until(enqueues, ("enqueued", "end")) == [
            ("enqueued", "a"),
            ("enqueued", "b"),
            ("enqueued", "c"),
            ("enqueued", "end"),
        ]
        # Nothing else is on its way to the narrow subscribers: one more notice arrives
        # alone (what they skipped was never queued behind it).
        await storage.remove_job(q, "end")
        assert await _until(notices, ("removed", "end")) == [("removed", "end")]


class _Recording(FaultyStorage):
    """A pass-through storage (no faults planned) that records every subscription."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.subscriptions: list[frozenset[str] | None] = []

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        self.subscriptions.append(None if kinds is None else frozenset(kinds))
        async with super().subscribe(queue, kinds) as receive:
            yield receive


async def _double(job: Job[int]) -> int:
    return job.payload * 2


async def test_a_pure_producer_does_not_subscribe(storage: Storage, queue_name: str) -> None:
    rec = _Recording(storage)
    async with Queue(rec, name=queue_name) as producer:
        for i in range(3):
            await producer.enqueue(f"p{i}", i)
        await producer.enqueue_many([("m1", 1), ("m2", 2)])
        assert (await producer.get_status("p0")) is not None
    assert rec.subscriptions == []


async def test_a_waiter_gets_terminal_notices_only(storage: Storage, queue_name: str) -> None:
    rec = _Recording(storage)
    async with Queue(storage, name=queue_name, handler=_double, **FAST), Queue(rec, name=queue_name) as producer:
        assert rec.subscriptions == []
        with trio.fail_after(10):
            assert await producer.enqueue_and_wait("w1", 21) == 42
            assert await producer.enqueue_and_wait("w2", 1) == 2
        assert rec.subscriptions == [NOTICE_KINDS]  # once, and notices only


async def test_callbacks_and_streams_widen_the_subscription(storage: Storage, queue_name: str) -> None:
    rec = _Recording(storage)
    done = Recorder()
    producer = Queue(rec, name=queue_name)
    producer.on("completed", done)  # a notice kind: the notices suffice
    async with Queue(storage, name=queue_name, handler=_double, **FAST), producer:
        assert rec.subscriptions == [NOTICE_KINDS]
        with trio.fail_after(10):
            await producer.enqueue("n1", 1)
            await done.wait_for("completed", "n1")
            async with producer.events("enqueued", "completed") as stream:
                assert rec.subscriptions == [NOTICE_KINDS, None]  # live before events() returns
                assert await producer.enqueue_and_wait("n2", 2) == 4  # a waiter across the switch
                got = [(e.name, e.job_id) async for e in _take(stream, 2)]
            assert got == [("enqueued", "n2"), ("completed", "n2")]
            await done.wait_for("completed", "n2")


async def test_on_while_running_hears_of_the_next_enqueue(storage: Storage, queue_name: str) -> None:
    rec = _Recording(storage)
    async with Queue(rec, name=queue_name) as producer:
        await producer.enqueue("before", 0)
        assert rec.subscriptions == []
        enqueued = Recorder()
        producer.on("enqueued", enqueued)  # the queue's next enqueue waits until it is subscribed
        await producer.enqueue("after", 1)
        with trio.fail_after(10):
            await enqueued.wait_for("enqueued", "after")
        assert rec.subscriptions == [None]
        assert enqueued.ids("enqueued") == ["after"]


async def _take(stream: Any, n: int) -> AsyncIterator[Any]:
    async for event in stream:
        if event.name == "resync":
            continue
        yield event
        n -= 1
        if n == 0:
            return
