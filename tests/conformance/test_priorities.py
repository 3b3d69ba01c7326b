"""Job priorities (issue 9, item 2): conformance tests over every storage, then the Queue API.

Lanes 0..9, lower first, FIFO within a lane; every way back to the ready list (retry,
release, recovery, promotion) returns a job to its own lane. The only sleeps let a retry
delay, a due time or a lease run out, which no event announces.
"""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from trioqueue import DEFAULT_PRIORITY, MemoryStorage, Queue, ValidationError
from trioqueue._core import encode_envelope
from trioqueue.storage import Claim, NewJob, SettleKind, Storage

from storage_helpers import LEASE, W1, W2, claim, settlement


def pjob(job_id: str, priority: int, *, run_at: float | None = None, max_attempts: int = 3) -> NewJob:
    env = encode_envelope(job_id, b"{}", 1_700_000_000_000, 0, max_attempts, 60_000)
    return NewJob(job_id, env, max_attempts, 60.0, f"t-{job_id}", run_at, priority)


async def ids(storage: Storage, q: str, n: int = 100, worker: str = W2) -> list[str]:
    return [c.id for c in await claim(storage, q, worker, n, 0.05)]


async def test_strict_priority_order_fifo_within_a_priority(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [pjob("a5", 5), pjob("b9", 9), pjob("c0", 0), pjob("d5", 5)])
    await storage.enqueue(queue_name, [pjob("e0", 0), pjob("f3", 3), pjob("g9", 9), pjob("h3", 3)])
    await storage.enqueue(queue_name, [pjob("i5", 5)])
    rec = await storage.get_job(queue_name, "f3")
    assert rec is not None and rec.priority == 3
    assert [c.id for c in await claim(storage, queue_name, W1, 1)] == ["c0"]  # one at a time...
    assert [c.id for c in await claim(storage, queue_name, W1, 3)] == ["e0", "f3", "h3"]  # ... or in batches
    await storage.enqueue(queue_name, [pjob("j1", 1), pjob("k5", 5)])  # a late urgent job jumps the line
    assert await ids(storage, queue_name) == ["j1", "a5", "d5", "i5", "k5", "b9", "g9"]
    rec = await storage.get_job(queue_name, "a5")
    assert rec is not None and rec.priority == DEFAULT_PRIORITY


async def test_concurrent_enqueues_of_mixed_priorities_keep_each_jobs_lane(storage: Storage, queue_name: str) -> None:
    """Calls made at once may share one storage call (Redis coalesces them, and sends a
    batch of default-priority jobs only to a script without the other lanes): a batch
    that mixes priorities must still put every job in its own lane."""
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(storage.enqueue, queue_name, [pjob(f"p{i}", DEFAULT_PRIORITY)])
        nursery.start_soon(storage.enqueue, queue_name, [pjob("urgent", 0)])
        nursery.start_soon(storage.enqueue, queue_name, [pjob("late", 9)])
    got = await ids(storage, queue_name)
    assert got[0] == "urgent" and got[-1] == "late"
    assert sorted(got[1:-1]) == [f"p{i}" for i in range(6)]


async def test_retry_returns_a_job_to_its_priority(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [pjob("r2", 2)])
    await claim(storage, queue_name)
    err = b'{"type":"E","message":"again","traceback":""}'
    await storage.settle(queue_name, W1, [settlement(SettleKind.RETRY, queue_name, "r2", err, delay=0.05)])
    await trio.sleep(0.1)  # the retry is due
    await storage.enqueue(queue_name, [pjob("x5", 5), pjob("y1", 1), pjob("z2", 2)])
    # Promoted at claim time (after z2 was enqueued): the back of lane 2.
    assert await ids(storage, queue_name) == ["y1", "z2", "r2", "x5"]


async def test_a_failed_job_retried_by_hand_keeps_its_priority(storage: Storage, queue_name: str) -> None:
    """``retry_job`` (the admin retry of a failed job) puts it back in its own lane."""
    await storage.enqueue(queue_name, [pjob("f0", 0, max_attempts=1)])
    await claim(storage, queue_name)
    err = b'{"type":"E","message":"no","traceback":""}'
    await storage.settle(queue_name, W1, [settlement(SettleKind.FAIL, queue_name, "f0", err, ttl=60)])
    await storage.enqueue(queue_name, [pjob("d5", 5), pjob("e3", 3)])
    assert await storage.retry_job(queue_name, "f0", "t-f0-again")
    rec = await storage.get_job(queue_name, "f0")
    assert rec is not None and rec.priority == 0
    assert await ids(storage, queue_name) == ["f0", "e3", "d5"]


async def test_listings_and_lookups_report_each_jobs_priority(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [pjob("u0", 0), pjob("d5", 5), pjob("l9", 9)])
    listed = {r.id: r.priority for r in (await storage.list_jobs(queue_name, "queued"))[0]}
    assert listed == {"u0": 0, "d5": 5, "l9": 9}
    for job_id, priority in listed.items():
        rec = await storage.get_job(queue_name, job_id)
        assert rec is not None and rec.priority == priority


async def test_release_returns_jobs_to_the_front_of_their_priority(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [pjob("h3", 3), pjob("l7", 7), pjob("m7", 7), pjob("n8", 8)])
    # Three claims: two started, one reserved (prefetched, never run).
    claims = await claim(storage, queue_name, W1, 3, start=2)
    assert [(c.id, c.started) for c in claims] == [("h3", True), ("l7", True), ("m7", False)]
    await storage.enqueue(queue_name, [pjob("o7", 7), pjob("p5", 5)])
    assert await storage.release(queue_name, W1, ["l7", "m7", "h3"]) == 3
    assert await ids(storage, queue_name) == ["h3", "p5", "l7", "m7", "o7", "n8"]


async def test_recovery_returns_jobs_to_their_priority(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [pjob("s1", 1), pjob("t1", 1), pjob("u8", 8)])
    started = await claim(storage, queue_name, W1, 1, 0.05, 0.2)
    reserved = await claim(storage, queue_name, W1, 2, 0.05, 0.2, start=0)
    assert [c.id for c in started + reserved] == ["s1", "t1", "u8"]
    await storage.enqueue(queue_name, [pjob("v5", 5), pjob("w1", 1)])
    await trio.sleep(0.35)  # the leases run out
    recovered, _ = await storage.recover_stalled(queue_name)
    assert sorted(recovered) == [("s1", "requeued"), ("t1", "requeued"), ("u8", "requeued")]
    # Back to the ready list (the back of their lanes, after w1 enqueued meanwhile).
    order = await ids(storage, queue_name)
    assert order[0] == "w1" and sorted(order[1:3]) == ["s1", "t1"] and order[3:] == ["v5", "u8"]


async def test_delayed_job_is_promoted_to_its_priority(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [pjob("d0", 0, run_at=time.time() + 0.1), pjob("d9", 9, run_at=time.time() + 0.1)])
    await storage.enqueue(queue_name, [pjob("a5", 5), pjob("b0", 0)])
    assert await ids(storage, queue_name, n=1, worker=W1) == ["b0"]
    await trio.sleep(0.15)  # due
    assert await ids(storage, queue_name) == ["d0", "a5", "d9"]
    rec = await storage.get_job(queue_name, "d9")
    assert rec is not None and rec.priority == 9


@pytest.mark.parametrize("priority", [0, 9])
async def test_blocking_claim_wakes_for_any_priority(storage: Storage, queue_name: str, priority: int) -> None:
    got: list[Claim] = []

    async def consumer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(await storage.dequeue(queue_name, W1, 5, 30.0, LEASE))

    with trio.fail_after(10):  # a claim that missed the job would wait 30 s
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.testing.wait_all_tasks_blocked()  # the consumer is blocked in dequeue
            await storage.enqueue(queue_name, [pjob("late", priority)])
    assert [c.id for c in got] == ["late"]
    # Nothing left behind by the wake-up: the queue is empty and a new job is claimed alone.
    await storage.enqueue(queue_name, [pjob("next", priority)])
    assert await ids(storage, queue_name) == ["next"]


async def test_a_waking_claim_takes_the_most_urgent_job(storage: Storage, queue_name: str) -> None:
    """Redis: the blocking move takes the default-priority job, which must yield to the
    urgent one enqueued in the same call (and keep its place at the head of its lane)."""
    got: list[Claim] = []

    async def consumer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(await storage.dequeue(queue_name, W1, 1, 30.0, LEASE))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.testing.wait_all_tasks_blocked()
            await storage.enqueue(queue_name, [pjob("normal", 5), pjob("later", 5), pjob("urgent", 0)])
    assert [c.id for c in got] == ["urgent"]
    assert await ids(storage, queue_name) == ["normal", "later"]
    assert await storage.held_jobs(queue_name, W1) == ["urgent"]


async def test_blocking_claims_wake_for_a_burst_of_urgent_jobs(storage: Storage, queue_name: str) -> None:
    got: list[str] = []

    async def consumer(worker: str) -> None:
        got.extend(c.id for c in await storage.dequeue(queue_name, worker, 1, 30.0, LEASE))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for w in ("c1", "c2", "c3"):
                nursery.start_soon(consumer, w)
            await trio.testing.wait_all_tasks_blocked()
            await storage.enqueue(queue_name, [pjob(f"u{i}", 1) for i in range(3)])
    assert sorted(got) == ["u0", "u1", "u2"]


# -- the Queue API --------------------------------------------------------------------------


async def test_queue_rejects_bad_priorities_writing_nothing() -> None:
    storage = MemoryStorage()
    async with Queue(storage, name="prio") as queue:
        for bad in (-1, 10, 2.0, "1", True, None):
            with pytest.raises(ValidationError, match="priority") as info:
                await queue.enqueue("bad-job", {}, priority=bad)  # type: ignore[arg-type]
            assert "bad-job" in str(info.value)
        with pytest.raises(ValidationError, match="'j1'"):
            await queue.enqueue_many([("j1", {}), ("j2", {})], priority=12)
        with pytest.raises(ValidationError, match="priority"):
            await queue.enqueue_and_wait("w", {}, priority=-3, timeout=1)
        for jid in ("bad-job", "j1", "j2", "w"):
            assert await queue.get_status(jid) is None


async def test_queue_runs_jobs_by_priority() -> None:
    storage = MemoryStorage()
    ran: list[str] = []
    all_ran = trio.Event()

    async def handler(job: object) -> str:
        ran.append(job.id)  # type: ignore[attr-defined]
        if len(ran) == 5:
            all_ran.set()
        return "ok"

    async with Queue(storage, name="prio") as producer:
        await producer.enqueue("normal", {})
        await producer.enqueue_many([("low-1", {}), ("low-2", {})], priority=9)
        await producer.enqueue("urgent", {}, priority=0)
        status = await producer.get_status("urgent")
        assert status is not None and status.priority == 0
        normal = await producer.get_status("normal")
        assert normal is not None and normal.priority == DEFAULT_PRIORITY
        results: list[str] = []

        async def wait_for_mid() -> None:
            results.append(await producer.enqueue_and_wait("mid", {}, priority=4, timeout=10))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_mid)
                await trio.testing.wait_all_tasks_blocked()  # "mid" is enqueued, its caller waits
                async with Queue(storage, name="prio", handler=handler, concurrency=1, prefetch=1):
                    await all_ran.wait()
    assert ran == ["urgent", "mid", "normal", "low-1", "low-2"]
    assert results == ["ok"]


# -- FileStorage: lanes on disk --------------------------------------------------------------


async def test_file_storage_keeps_priorities_across_a_reopen_and_a_repair(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from trioqueue.storage import FileStorage
    from trioqueue.storage.file._fsutil import encode_name

    async with FileStorage(tmp_path / "s") as st:
        await st.enqueue("q", [pjob("a5", 5), pjob("b9", 9), pjob("c0", 0), pjob("d0", 0), pjob("e9", 9)])
        [c] = await st.dequeue("q", W1, 1, 0.05, LEASE)
        assert c.id == "c0"
        assert await st.release("q", W1, ["c0"]) == 1
    [qdir] = list((tmp_path / "s" / "q").iterdir())
    lane0 = qdir / "ready" / "p0"
    # A crash between a record's write and its marker's link: the marker of d0 is missing.
    [d0] = [n for n in os.listdir(lane0) if n.endswith("-" + encode_name("d0"))]
    os.unlink(lane0 / d0)
    async with FileStorage(tmp_path / "s") as st:  # reopened: start-up repair relinks it
        order = [c.id for c in await st.dequeue("q", W2, 10, 0.05, LEASE)]
        rec = await st.get_job("q", "e9")
        assert rec is not None and rec.priority == 9
    assert order == ["c0", "d0", "a5", "b9", "e9"]
