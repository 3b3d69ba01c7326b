"""Storage conformance suite, part 1 (continued): the event stream.

What ``Storage.subscribe`` delivers: the events of a mixed lifecycle, in order; each one
carrying the token of the job's incarnation; and no second event for a settlement sent
again after it landed. Every backend, as in test_storage.py.
"""

from __future__ import annotations


import trio

from trioqueue import CancelStatus, EnqueueStatus
from trioqueue.storage import Settlement, SettleKind, Storage, StorageEvent

from storage_helpers import MIXED_EVENTS, W1, claim, job, kind, mixed_lifecycle


async def test_event_stream(storage: Storage, queue_name: str) -> None:
    seen: list[StorageEvent] = []
    async with storage.subscribe(queue_name) as events:
        await mixed_lifecycle(storage, queue_name)
        with trio.fail_after(10):
            while not any(e.kind == "fenced" for e in seen):
                seen.extend(e for e in await events.receive() if e.kind != "resync")
    assert [(e.kind, e.job_id) for e in seen] == MIXED_EVENTS
    completed = seen[3]
    assert completed.worker_id == W1
    assert completed.result in (None, b'"ra"')


async def test_events_carry_the_incarnation_token(storage: Storage, queue_name: str) -> None:
    seen: list[StorageEvent] = []
    async with storage.subscribe(queue_name) as events:
        await storage.enqueue(queue_name, [job("x", token="first")])
        assert await storage.cancel(queue_name, "x") is CancelStatus.CANCELLED
        [again] = await storage.enqueue(queue_name, [job("x", token="second")])
        assert again.status is EnqueueStatus.QUEUED
        [dup] = await storage.enqueue(queue_name, [job("x", token="third")])
        assert dup.status is EnqueueStatus.DUPLICATE and dup.token == "second"
        [c] = await claim(storage, queue_name)
        await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "x", b"1", ttl=60, token=c.token)])
        [cached] = await storage.enqueue(queue_name, [job("x", token="fourth")])
        assert cached.status is EnqueueStatus.COMPLETED and cached.token == "second"
        with trio.fail_after(10):
            while not any(e.kind == "completed" for e in seen):
                seen.extend(e for e in await events.receive() if e.kind != "resync")
    assert [(e.kind, e.token) for e in seen] == [
        ("enqueued", "first"),
        ("cancelled", "first"),
        ("enqueued", "second"),
        ("completed", "second"),
    ]


async def test_settle_retried_after_it_landed_is_a_no_op(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("once")])
    [c] = await claim(storage, queue_name)
    done = Settlement(SettleKind.COMPLETE, "once", b"1", ttl=60, token=c.token)
    async with storage.subscribe(queue_name) as events:
        assert await storage.settle(queue_name, W1, [done]) == [True]
        assert await storage.settle(queue_name, W1, [done]) == [True]  # the reply was lost: sent again
        await storage.enqueue(queue_name, [job("marker")])
        seen: list[StorageEvent] = []
        with trio.fail_after(10):
            while not any(e.job_id == "marker" for e in seen):
                seen.extend(e for e in await events.receive() if e.kind != "resync")
    assert [(e.kind, e.job_id) for e in seen] == [("completed", "once"), ("enqueued", "marker")]
    rec = await storage.get_job(queue_name, "once")
    assert rec is not None and kind(rec.state) == "completed" and rec.attempts == 1
