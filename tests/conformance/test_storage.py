"""Storage conformance suite, part 1: the raw Storage interface — the core job lifecycle.

Enqueue (dedup, awkward ids), claim (FIFO, blocking, timeout), settle (complete, fail,
retry, fencing), cancel, result TTLs, release, and queues kept apart. The rest of part 1,
by concern: test_storage_leases.py (workers, leases, stalled jobs, attempts),
test_storage_events.py (the event stream), test_storage_features.py (delayed jobs, pause,
progress, cancelling running jobs, schedules); their helpers are in storage_helpers.py.

Every test here runs against every backend (the ``storage`` fixture is parametrised in
conftest.py). Waits are driven by the storage itself (blocking dequeue, event stream);
the only sleeps let a TTL or lease run out, which no event announces.
"""

from __future__ import annotations


import pytest
import trio
import trio.testing

from trioqueue import CancelStatus, EnqueueStatus, UpdateTTLStatus
from trioqueue._core import parse_state
from trioqueue._model._serde import decode_error
from trioqueue.storage import Settlement, SettleKind, Storage

from storage_helpers import LEASE, W1, W2, claim, job, kind, settlement


async def test_enqueue_registers_and_dedups(storage: Storage, queue_name: str) -> None:
    out = await storage.enqueue(queue_name, [job("a"), job("b"), job("a")])
    assert [o.status for o in out] == [EnqueueStatus.QUEUED, EnqueueStatus.QUEUED, EnqueueStatus.DUPLICATE]
    assert kind(out[2].state) == "queued"
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and kind(rec.state) == "queued" and rec.attempts == 0 and rec.max_attempts == 3
    again = await storage.enqueue(queue_name, [job("a", b'"other"')])
    assert again[0].status is EnqueueStatus.DUPLICATE
    claims = await claim(storage, queue_name)
    assert [c.id for c in claims] == ["a", "b"]  # one copy of "a", first payload
    assert claims[0].envelope == job("a").envelope


async def test_a_large_batch_is_claimed_in_the_order_it_was_enqueued(storage: Storage, queue_name: str) -> None:
    """One enqueue of 2,000 jobs whose ids do not sort in the batch's order: claims take
    them in the batch's order."""
    ids = [f"j{(i * 7919) % 2000}" for i in range(2000)]
    await storage.enqueue(queue_name, [job(i) for i in ids])
    got: list[str] = []
    while len(got) < len(ids):
        got += [c.id for c in await claim(storage, queue_name, n=500)]
    assert got == ids


async def test_dequeue_is_fifo_and_marks_processing(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job(f"j{i}") for i in range(5)])
    first = await claim(storage, queue_name, n=2)
    rest = await claim(storage, queue_name, worker=W2, n=10)
    assert [c.id for c in first] == ["j0", "j1"]
    assert [c.id for c in rest] == ["j2", "j3", "j4"]
    assert all(c.attempts == 1 for c in first + rest)
    rec = await storage.get_job(queue_name, "j0")
    assert rec is not None
    k, _, worker = parse_state(rec.state)
    assert (k, worker, rec.attempts) == ("processing", W1, 1)
    assert sorted(await storage.held_jobs(queue_name, W1)) == ["j0", "j1"]
    assert sorted(await storage.held_jobs(queue_name, W2)) == ["j2", "j3", "j4"]
    assert await claim(storage, queue_name) == []


async def test_blocking_dequeue_wakes_on_enqueue(storage: Storage, queue_name: str) -> None:
    got = []

    async def consumer(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        got.extend(await storage.dequeue(queue_name, W1, 5, 30.0, LEASE))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.testing.wait_all_tasks_blocked()  # the consumer is blocked in dequeue
            await storage.enqueue(queue_name, [job("late")])
    assert [c.id for c in got] == ["late"]


async def test_dequeue_timeout_returns_empty(storage: Storage, queue_name: str) -> None:
    with trio.fail_after(10):
        assert await storage.dequeue(queue_name, W1, 5, 0.1, LEASE) == []


async def test_complete_caches_result_until_ttl(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("a")])
    [c] = await claim(storage, queue_name)
    assert await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "a", b'{"x":1}', ttl=0.5)]) == [True]
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and kind(rec.state) == "completed" and rec.result == b'{"x":1}'
    assert await storage.held_jobs(queue_name, W1) == []
    [dup] = await storage.enqueue(queue_name, [job("a")])
    assert dup.status is EnqueueStatus.COMPLETED and dup.result == b'{"x":1}'
    await trio.sleep(0.7)  # the TTL runs out
    assert await storage.get_job(queue_name, "a") is None
    [fresh] = await storage.enqueue(queue_name, [job("a")])
    assert fresh.status is EnqueueStatus.QUEUED


async def test_result_ttls_are_per_job(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("short"), job("long")])
    await claim(storage, queue_name)
    await storage.settle(
        queue_name,
        W1,
        [settlement(SettleKind.COMPLETE, queue_name, "short", b"1", ttl=0.3), settlement(SettleKind.COMPLETE, queue_name, "long", b"2", ttl=60)],
    )
    await trio.sleep(0.5)
    assert await storage.get_job(queue_name, "short") is None
    rec = await storage.get_job(queue_name, "long")
    assert rec is not None and rec.result == b"2"


async def test_fail_stores_error_and_blocks_reenqueue(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("f")])
    await claim(storage, queue_name)
    err = b'{"type":"ValueError","message":"bad","traceback":""}'
    assert await storage.settle(queue_name, W1, [settlement(SettleKind.FAIL, queue_name, "f", err, ttl=60)]) == [True]
    rec = await storage.get_job(queue_name, "f")
    assert rec is not None and kind(rec.state) == "failed" and decode_error(rec.error).message == "bad"
    [dup] = await storage.enqueue(queue_name, [job("f")])
    assert dup.status is EnqueueStatus.DUPLICATE and kind(dup.state) == "failed"


async def test_retry_goes_back_after_delay(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("r")])
    await claim(storage, queue_name)
    err = b'{"type":"E","message":"again","traceback":""}'
    await storage.settle(queue_name, W1, [settlement(SettleKind.RETRY, queue_name, "r", err, delay=0.4)])
    rec = await storage.get_job(queue_name, "r")
    assert rec is not None
    k, _, attempts = parse_state(rec.state)
    assert (k, attempts) == ("failing", 1)
    assert await claim(storage, queue_name, timeout=0.05) == []  # not yet due
    with trio.fail_after(10):
        claims = await claim(storage, queue_name, W2, 5, 5.0)  # wakes when due
    assert [(c.id, c.attempts) for c in claims] == [("r", 2)]


async def test_settle_is_fenced_to_the_owner(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("a")])
    await claim(storage, queue_name, worker=W1)
    out = await storage.settle(queue_name, W2, [settlement(SettleKind.COMPLETE, queue_name, "a", b"1", ttl=60)])
    assert out == [False]
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and kind(rec.state) == "processing"
    assert await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "a", b"1", ttl=60)]) == [True]
    # A settlement with a made-up claim token is refused.
    forged = Settlement(SettleKind.FAIL, "a", b"{}", ttl=60, token="forged")
    assert await storage.settle(queue_name, W1, [forged]) == [False]
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and kind(rec.state) == "completed" and rec.result == b"1"


async def test_cancel_queued_job_is_never_claimed(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("c", b'"old"'), job("d")])
    assert await storage.cancel(queue_name, "c") is CancelStatus.CANCELLED
    rec = await storage.get_job(queue_name, "c")
    assert rec is not None and kind(rec.state) == "cancelled" and rec.token == "t-c"
    assert await storage.cancel(queue_name, "c") is CancelStatus.CANCELLED  # idempotent
    # The id is free again; the stale copy of the old envelope must not be claimed.
    [out] = await storage.enqueue(queue_name, [job("c", b'"new"', token="t-c2")])
    assert out.status is EnqueueStatus.QUEUED
    rec = await storage.get_job(queue_name, "c")
    assert rec is not None and kind(rec.state) == "queued" and rec.token == "t-c2" and rec.attempts == 0
    claims = await claim(storage, queue_name)
    assert [c.id for c in claims] == ["d", "c"]
    assert claims[1].envelope == job("c", b'"new"').envelope
    assert await claim(storage, queue_name) == []


async def test_cancel_reports_other_states(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("done"), job("bad")])
    await claim(storage, queue_name)
    await storage.settle(
        queue_name,
        W1,
        [
            settlement(SettleKind.COMPLETE, queue_name, "done", b"1", ttl=60),
            settlement(SettleKind.FAIL, queue_name, "bad", b"{}", ttl=60),
        ],
    )
    assert await storage.cancel(queue_name, "done") is CancelStatus.COMPLETED
    assert await storage.cancel(queue_name, "bad") is CancelStatus.FAILED
    assert await storage.cancel(queue_name, "nope") is CancelStatus.NOT_FOUND


async def test_cancel_failing_job_drops_its_retry(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("r")])
    await claim(storage, queue_name)
    await storage.settle(queue_name, W1, [settlement(SettleKind.RETRY, queue_name, "r", b"{}", delay=0.2)])
    assert await storage.cancel(queue_name, "r") is CancelStatus.CANCELLED
    assert await storage.dequeue(queue_name, W1, 5, 0.5, LEASE) == []


async def test_update_result_ttl(storage: Storage, queue_name: str) -> None:
    assert await storage.update_result_ttl(queue_name, "x", 10) is UpdateTTLStatus.NOT_FOUND
    await storage.enqueue(queue_name, [job("x")])
    assert await storage.update_result_ttl(queue_name, "x", 10) is UpdateTTLStatus.NOT_TERMINAL
    await claim(storage, queue_name)
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "x", b"7", ttl=0.3)])
    assert await storage.update_result_ttl(queue_name, "x", 60) is UpdateTTLStatus.UPDATED
    await trio.sleep(0.5)
    rec = await storage.get_job(queue_name, "x")
    assert rec is not None and rec.result == b"7"  # outlived its first TTL
    assert await storage.update_result_ttl(queue_name, "x", 0.2) is UpdateTTLStatus.UPDATED
    await trio.sleep(0.4)
    assert await storage.get_job(queue_name, "x") is None  # and a shorter TTL shortens it


async def test_cancelled_state_expires_with_the_result_ttl(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("gone", ttl=0.3)])
    assert await storage.cancel(queue_name, "gone") is CancelStatus.CANCELLED
    assert await storage.update_result_ttl(queue_name, "gone", 0.3) is UpdateTTLStatus.UPDATED
    rec = await storage.get_job(queue_name, "gone")
    assert rec is not None and kind(rec.state) == "cancelled"
    await trio.sleep(0.5)
    assert await storage.get_job(queue_name, "gone") is None
    assert await storage.cancel(queue_name, "gone") is CancelStatus.NOT_FOUND


async def test_release_returns_jobs_to_the_front(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("a"), job("b"), job("c")])
    claims = await claim(storage, queue_name, n=2)
    assert [c.id for c in claims] == ["a", "b"]
    assert await storage.release(queue_name, W1, ["a", "b", "zzz"]) == 2
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and kind(rec.state) == "queued" and rec.attempts == 1
    assert await storage.held_jobs(queue_name, W1) == []
    again = await claim(storage, queue_name, worker=W2)
    assert [(c.id, c.attempts) for c in again] == [("a", 2), ("b", 2), ("c", 1)]


async def test_queues_are_isolated(storage: Storage, queue_name: str) -> None:
    other = queue_name + "-other"
    await storage.enqueue(queue_name, [job("same")])
    [o] = await storage.enqueue(other, [job("same")])
    assert o.status is EnqueueStatus.QUEUED
    async with storage.subscribe(other) as events:
        await storage.enqueue(queue_name, [job("only-mine")])
        await storage.enqueue(other, [job("marker")])
        with trio.fail_after(10):
            batch = [e for e in await events.receive() if e.kind != "resync"]
        assert [e.job_id for e in batch] == ["marker"]
    assert [c.id for c in await claim(storage, other)] == ["same", "marker"]
    assert [c.id for c in await claim(storage, queue_name)] == ["same", "only-mine"]


@pytest.mark.parametrize("job_id", ["../etc/passwd", "a/b\\c", "ünïcødé ✓", "x" * 1024, " spaced : colon "])
async def test_awkward_ids_round_trip(storage: Storage, queue_name: str, job_id: str) -> None:
    await storage.enqueue(queue_name, [job(job_id)])
    [c] = await claim(storage, queue_name)
    assert c.id == job_id
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, job_id, b"1", ttl=60)])
    rec = await storage.get_job(queue_name, job_id)
    assert rec is not None and rec.id == job_id and rec.result == b"1"


# -- cancelled enqueues never strand the others (issue 8, item 7) ---------------------------


async def test_cancelled_concurrent_enqueues_never_wedge_the_others(storage: Storage, queue_name: str) -> None:
    """Concurrent enqueues share round trips (one call carries the batch of the others);
    a call cancelled at any point — before, while or after it carried a batch — must not
    leave the later calls waiting for a carrier that never comes. A job whose call was
    not cancelled is enqueued; a cancelled call's jobs are enqueued or absent, never half."""
    import random

    rng = random.Random(7)
    landed: set[str] = set()
    for round_ in range(30):
        ids = [f"r{round_}-{k}" for k in range(6)]

        async def one(job_id: str, cancel_after: int | None) -> None:
            with trio.CancelScope() as scope:
                if cancel_after is not None:

                    async def canceller() -> None:
                        for _ in range(cancel_after):
                            await trio.lowlevel.checkpoint()
                        scope.cancel()

                    nursery.start_soon(canceller)
                await storage.enqueue(queue_name, [job(job_id)])
                landed.add(job_id)

        with trio.fail_after(20):  # a wedged coalescer hangs here
            async with trio.open_nursery() as nursery:
                for k, job_id in enumerate(ids):
                    nursery.start_soon(one, job_id, rng.choice([None, 0, 1, 2, 3]) if k % 2 else None)
        for job_id in ids:
            rec = await storage.get_job(queue_name, job_id)
            if job_id in landed:
                assert rec is not None and kind(rec.state) == "queued", (job_id, rec)
    with trio.fail_after(10):  # and the queue still takes jobs
        assert (await storage.enqueue(queue_name, [job("after")]))[0].status is EnqueueStatus.QUEUED
