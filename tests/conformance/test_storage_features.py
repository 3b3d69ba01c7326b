"""Storage conformance suite, part 1 (continued): the features around the core lifecycle.

Delayed jobs (due times, promotion, wake-ups), pausing and resuming a queue, progress,
cancel requests on running jobs, and stored schedules. Every backend, as in
test_storage.py.
"""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from trioqueue import CancelStatus, EnqueueStatus
from trioqueue._core import parse_state
from trioqueue.storage import Claim, NewJob, Settlement, SettleKind, Storage, StorageEvent

from storage_helpers import LEASE, W1, W2, claim, job, kind, settlement


# -- delayed jobs ------------------------------------------------------------------------


def delayed(job_id: str, seconds: float) -> NewJob:
    return job(job_id)._replace(run_at=time.time() + seconds)


async def test_delayed_job_waits_until_due_then_is_claimed(storage: Storage, queue_name: str) -> None:
    async with storage.subscribe(queue_name) as events:
        before = time.time()
        [outcome] = await storage.enqueue(queue_name, [delayed("later", 0.3)])
        assert outcome.status is EnqueueStatus.QUEUED
        rec = await storage.get_job(queue_name, "later")
        assert rec is not None
        kind_, _, due_ms = parse_state(rec.state)
        assert kind_ == "delayed" and isinstance(due_ms, int) and due_ms / 1000 >= before + 0.29
        assert await claim(storage, queue_name, timeout=0.01) == []  # not due yet
        dup = await storage.enqueue(queue_name, [job("later")])
        assert dup[0].status is EnqueueStatus.DUPLICATE and kind(dup[0].state or "") == "delayed"
        with trio.fail_after(5):  # the blocking claim wakes when the job is due
            [c] = await claim(storage, queue_name, timeout=10)
        assert c.id == "later" and c.attempts == 1 and time.time() >= due_ms / 1000
        seen: list[str] = []
        with trio.fail_after(5):
            while "promoted" not in seen:
                seen += [e.kind for e in await events.receive() if e.job_id == "later"]
        assert seen[:2] == ["enqueued", "promoted"]


async def test_waiting_claim_wakes_for_a_delayed_job_enqueued_later(storage: Storage, queue_name: str) -> None:
    got: list[Claim] = []

    async def claimer() -> None:
        got.extend(await claim(storage, queue_name, timeout=10))

    with trio.fail_after(5):  # without a recomputed wake-up the claim sleeps 10 s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claimer)
            await trio.testing.wait_all_tasks_blocked(0.05)  # the claim waits on an empty queue
            await storage.enqueue(queue_name, [delayed("soon", 0.2)])
    assert [c.id for c in got] == ["soon"]


async def test_cancelled_delayed_job_is_never_claimed(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [delayed("d", 0.1), delayed("keep", 0.1)])
    assert await storage.cancel(queue_name, "d") is CancelStatus.CANCELLED
    await trio.sleep(0.15)
    claims = await claim(storage, queue_name, timeout=0.5)
    assert [c.id for c in claims] == ["keep"]
    rec = await storage.get_job(queue_name, "d")
    assert rec is not None and kind(rec.state) == "cancelled"


async def test_reaper_promotes_due_jobs_without_consumers(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [delayed("p", 0.2)])
    recovered, next_deadline = await storage.recover_stalled(queue_name)
    assert recovered == [] and next_deadline is not None and next_deadline <= time.time() + 0.25
    await trio.sleep(max(0.0, next_deadline - time.time()) + 0.01)
    await storage.recover_stalled(queue_name)
    rec = await storage.get_job(queue_name, "p")
    assert rec is not None and kind(rec.state) == "queued"


# -- pause / resume ------------------------------------------------------------------------


@pytest.mark.capability("Administration")
async def test_paused_queue_claims_nothing_until_resumed(storage: Storage, queue_name: str) -> None:
    other = queue_name + "-other"
    await storage.enqueue(queue_name, [job("a"), job("b")])
    await storage.enqueue(other, [job("x")])
    [running] = await claim(storage, queue_name, n=1)
    async with storage.subscribe(queue_name) as events:
        assert not await storage.is_paused(queue_name)
        assert await storage.set_paused(queue_name, True)
        assert not await storage.set_paused(queue_name, True)  # already paused: no change
        assert await storage.is_paused(queue_name) and not await storage.is_paused(other)
        assert await claim(storage, queue_name, timeout=0.05) == []
        assert [c.id for c in await claim(storage, other)] == ["x"]  # per queue
        # a running job is not touched: it settles as usual
        assert await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "a", b"1", ttl=9)]) == [True]
        got: list[Claim] = []

        async def claimer() -> None:
            got.extend(await claim(storage, queue_name, timeout=10))

        with trio.fail_after(5):  # resuming wakes the waiting claim at once
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claimer)
                await trio.testing.wait_all_tasks_blocked(0.05)
                assert await storage.set_paused(queue_name, False)
        assert [c.id for c in got] == ["b"] and running.id == "a"
        kinds: list[str] = []
        with trio.fail_after(5):
            while "resumed" not in kinds:
                kinds += [e.kind for e in await events.receive() if e.kind in ("paused", "resumed")]
        assert kinds == ["paused", "resumed"]


# -- progress ------------------------------------------------------------------------------


async def test_progress_is_fenced_stored_and_published(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("p")])
    [c] = await claim(storage, queue_name)
    async with storage.subscribe(queue_name) as events:
        assert await storage.set_progress(queue_name, W1, "p", c.token, b"0.5")
        assert await storage.set_progress(queue_name, W1, "p", c.token, b'{"step":2}')
        assert not await storage.set_progress(queue_name, W1, "p", "forged-claim", b"9")  # fenced
        assert not await storage.set_progress(queue_name, W2, "p", c.token, b"9")  # not the holder
        rec = await storage.get_job(queue_name, "p")
        assert rec is not None and rec.progress == b'{"step":2}'
        got: list[StorageEvent] = []
        with trio.fail_after(5):
            while len(got) < 2:
                got += [e for e in await events.receive() if e.kind == "progress"]
    assert [(e.job_id, e.worker_id, e.result, e.token) for e in got] == [
        ("p", W1, b"0.5", "t-p"),
        ("p", W1, b'{"step":2}', "t-p"),
    ]


# -- cancelling running jobs ---------------------------------------------------------------


async def test_cancel_request_on_a_running_job(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("run")])
    [c] = await claim(storage, queue_name)
    async with storage.subscribe(queue_name) as events:
        assert await storage.cancel(queue_name, "run") is CancelStatus.CANCELLED
        assert await storage.cancel(queue_name, "run") is CancelStatus.CANCELLED  # no second request
        rec = await storage.get_job(queue_name, "run")
        assert rec is not None and kind(rec.state) == "processing"  # until the holder settles
        assert (await storage.heartbeat(queue_name, W1, 30.0, [("run", c.token)], LEASE)).cancel_requested == ["run"]
        cancel = Settlement(SettleKind.CANCEL, "run", b"", token=c.token)
        assert await storage.settle(queue_name, W1, [cancel]) == [True]
        assert await storage.settle(queue_name, W1, [cancel]) == [True]  # a retried call: no-op
        rec = await storage.get_job(queue_name, "run")
        assert rec is not None and kind(rec.state) == "cancelled" and rec.attempts == 1
        got: list[tuple[str, str | None]] = []
        with trio.fail_after(5):
            while ("cancelled", W1) not in got:
                got += [(e.kind, e.worker_id) for e in await events.receive() if e.job_id == "run"]
    assert got == [("cancel_requested", W1), ("cancelled", W1)]


@pytest.mark.parametrize("end", ["complete", "retry", "release", "stall", "start"])
async def test_a_cancel_requested_job_ends_cancelled_unless_it_finished_first(
    storage: Storage, queue_name: str, end: str
) -> None:
    await storage.enqueue(queue_name, [job("c")])
    lease = 0.1 if end == "stall" else LEASE
    [c] = await claim(storage, queue_name, lease=lease, start=0 if end == "start" else None)
    assert await storage.cancel(queue_name, "c") is CancelStatus.CANCELLED
    if end == "complete":
        assert await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "c", b"1", ttl=9)]) == [True]
    elif end == "retry":
        assert await storage.settle(queue_name, W1, [settlement(SettleKind.RETRY, queue_name, "c", b"e", delay=0)]) == [True]
    elif end == "release":
        await storage.release(queue_name, W1, ["c"])
    elif end == "stall":
        await trio.sleep(0.2)
        assert (await storage.recover_stalled(queue_name))[0] == [("c", "cancelled")]
    else:
        assert await storage.start(queue_name, W1, [("c", c.token)]) == [False]
    rec = await storage.get_job(queue_name, "c")
    assert rec is not None and kind(rec.state) == ("completed" if end == "complete" else "cancelled")
    assert await storage.held_jobs(queue_name, W1) == []
    assert await claim(storage, queue_name, timeout=0.05) == []  # never runs again


# -- schedules -----------------------------------------------------------------------------


@pytest.mark.capability("Schedules")
async def test_schedules_are_stored_replaced_ticked_and_removed(storage: Storage, queue_name: str) -> None:
    assert await storage.get_schedules(queue_name) == {}
    assert await storage.put_schedule(queue_name, "nightly", b"spec-1", None)
    assert not await storage.put_schedule(queue_name, "nightly", b"spec-x", None)  # exists: not written
    assert await storage.put_schedule(queue_name + "-other", "nightly", b"other", None)
    assert await storage.get_schedules(queue_name) == {"nightly": (b"spec-1", None)}
    assert await storage.tick_schedule(queue_name, "nightly", 1000.0, job("nightly@1000"))
    assert await storage.tick_schedule(queue_name, "nightly", 1000.5, None)  # a skipped tick
    assert not await storage.tick_schedule(queue_name, "nightly", 1000.5, job("late"))  # not later
    assert not await storage.tick_schedule(queue_name, "nightly", 999.0, job("late"))
    assert not await storage.tick_schedule(queue_name, "nope", 5.0, job("late"))  # no such schedule
    assert [c.id for c in await claim(storage, queue_name)] == ["nightly@1000"]  # and no "late"
    assert not await storage.put_schedule(queue_name, "nightly", b"spec-2", b"spec-0")  # not what is stored
    assert await storage.put_schedule(queue_name, "nightly", b"spec-2", b"spec-1")  # replacing keeps the last tick
    assert await storage.get_schedules(queue_name) == {"nightly": (b"spec-2", 1000.5)}
    assert await storage.remove_schedule(queue_name, "nightly")
    assert not await storage.remove_schedule(queue_name, "nightly")
    assert not await storage.put_schedule(queue_name, "nightly", b"spec-3", b"spec-2")  # gone
    assert await storage.get_schedules(queue_name) == {}
    assert await storage.get_schedules(queue_name + "-other") == {"nightly": (b"other", None)}
