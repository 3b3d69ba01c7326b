"""Groups (fair queuing), on every backend: round-robin claims across the groups of a
priority (priority first), ``group_concurrency`` (``ClaimLimits.group_concurrency``),
pausing one group, the group in the job record, and the validation of ``group=``.

The fairness check enqueues 10,000 jobs of tenant A, then 10 of tenant B, and claims one
job at a time: every B job is claimed within the first 10 x 2 claims (2 groups with ready
jobs). PostgreSQL and FileStorage enqueue 2,000 A jobs instead: the round-robin does not
depend on the backlog's size (one ring of groups, see Storage.dequeue), and 10,000 jobs
there cost seconds per test for nothing more.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import CancelStatus, Job, Queue, RateLimit, ValidationError
from trioqueue.storage import ClaimLimits, NewJob, Settlement, SettleKind, Storage

from support import Recorder
from storage_helpers import LEASE, W1, W2, job

pytestmark = pytest.mark.capability("Groups")


def gjob(job_id: str, group: str | None, priority: int = 5) -> NewJob:
    return job(job_id)._replace(group=group, priority=priority)


def backlog(storage: Storage) -> int:
    """Tenant A's backlog in the fairness check (see the module docstring)."""
    name = type(storage).__name__
    return 2_000 if name in ("PostgresStorage", "FileStorage") else 10_000


async def claim_one(storage: Storage, queue: str, limits: ClaimLimits | None = None, worker: str = W1) -> str | None:
    claims = await storage.dequeue(queue, worker, 1, 0.0, LEASE, None, limits)
    return claims[0].id if claims else None


async def test_a_small_group_is_not_delayed_by_a_large_one(storage: Storage, queue_name: str) -> None:
    n = backlog(storage)
    for i in range(0, n, 1000):
        await storage.enqueue(queue_name, [gjob(f"a{j}", "tenant-a") for j in range(i, min(i + 1000, n))])
    await storage.enqueue(queue_name, [gjob(f"b{j}", "tenant-b") for j in range(10)])
    claimed = [await claim_one(storage, queue_name) for _ in range(10 * 2)]
    assert [c for c in claimed if c and c.startswith("b")] == [f"b{j}" for j in range(10)]  # all, in order
    assert [c for c in claimed if c and c.startswith("a")] == [f"a{j}" for j in range(10)]  # FIFO in a group
    # Once B is drained, A's jobs go on, in order.
    assert await claim_one(storage, queue_name) == "a10"


async def test_a_batch_claim_takes_the_groups_in_turn(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [gjob(f"a{j}", "a") for j in range(50)])
    await storage.enqueue(queue_name, [gjob(f"b{j}", "b") for j in range(3)])
    await storage.enqueue(queue_name, [gjob(f"u{j}", None) for j in range(2)])  # no group: a group of its own
    claims = await storage.dequeue(queue_name, W1, 9, 0.05, LEASE)
    ids = [c.id for c in claims]
    assert sorted(ids) == sorted(["a0", "a1", "a2", "a3", "b0", "b1", "b2", "u0", "u1"])
    assert [i for i in ids if i[0] == "b"] == ["b0", "b1", "b2"] and [i for i in ids if i[0] == "u"] == ["u0", "u1"]
    assert max(ids.index("b2"), ids.index("u1")) < 3 * 3  # within three turns of the ring


async def test_priority_comes_before_the_round_robin(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [gjob(f"low{j}", "a", priority=7) for j in range(3)])
    await storage.enqueue(queue_name, [gjob(f"high{j}", "b", priority=2) for j in range(3)])
    await storage.enqueue(queue_name, [gjob("urgent", None, priority=0)])
    claimed = [await claim_one(storage, queue_name) for _ in range(7)]
    assert claimed == ["urgent", "high0", "high1", "high2", "low0", "low1", "low2"]


async def test_cancelled_jobs_of_a_group_are_skipped(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [gjob("a0", "a"), gjob("a1", "a"), gjob("b0", "b")])
    assert await storage.cancel(queue_name, "a0") is CancelStatus.CANCELLED
    claimed = [await claim_one(storage, queue_name) for _ in range(3)]
    assert sorted(c for c in claimed if c) == ["a1", "b0"] and claimed[2] is None


async def test_a_cancelled_grouped_job_enqueued_again_without_a_group_has_none(storage: Storage, queue_name: str) -> None:
    """A new incarnation takes nothing of the cancelled one's group: it is claimed as a
    job without a group, and its record says so."""
    await storage.enqueue(queue_name, [gjob("x", "g")])
    assert await storage.cancel(queue_name, "x") is CancelStatus.CANCELLED
    await storage.enqueue(queue_name, [job("x")])
    rec = await storage.get_job(queue_name, "x")
    assert rec is not None and rec.group is None
    assert await claim_one(storage, queue_name) == "x"


async def test_the_record_has_the_group(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [gjob("g", "tenant-42"), gjob("n", None)])
    rec, plain = await storage.get_job(queue_name, "g"), await storage.get_job(queue_name, "n")
    assert rec is not None and rec.group == "tenant-42"
    assert plain is not None and plain.group is None
    [c] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=60, token=c.token)])
    done = await storage.get_job(queue_name, "g")
    assert done is not None and done.group == "tenant-42" and done.state.startswith("completed")


async def test_group_concurrency_passes_over_a_full_group(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(group_concurrency=1)
    await storage.enqueue(queue_name, [gjob(f"a{j}", "a") for j in range(3)] + [gjob(f"b{j}", "b") for j in range(3)])
    await storage.enqueue(queue_name, [gjob("u0", None), gjob("u1", None)])  # not limited
    held = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert sorted(c.id for c in held) == ["a0", "b0", "u0", "u1"]
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits) == []
    a0 = next(c for c in held if c.id == "a0")
    b0 = next(c for c in held if c.id == "b0")
    # A settlement frees its group's slot: the next job of that group only.
    await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "a0", b"1", ttl=60, token=a0.token)])
    again = await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits)
    assert [c.id for c in again] == ["a1"]
    # A release frees it too (and the released job is first in its group again).
    assert await storage.release(queue_name, W1, ["b0"]) == 1
    assert [c.id for c in await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits)] == ["b0"]
    # A retry frees it.
    await storage.settle(queue_name, W2, [Settlement(SettleKind.RETRY, "a1", b"{}", delay=60, token=again[0].token)])
    assert [c.id for c in await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)] == ["a2"]
    assert b0.id == "b0"


async def test_a_waiting_claim_takes_a_grouped_job_of_a_higher_priority_first(
    storage: Storage, queue_name: str, backend: str
) -> None:
    """Jobs that arrive together wake a claim waiting for work: it takes them in priority
    order, a grouped job of a higher priority before a job of the default one. (Redis:
    the blocking move took the default priority's job, and its yield to the lanes before
    it did not look at the groups' rings: seen in a long model walk, seed 292.)"""
    got: list[str] = []

    async def waiter() -> None:
        got.extend(c.id for c in await storage.dequeue(queue_name, W1, 1, 20.0, LEASE))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked(0.05)
            if backend in ("redis", "redis7"):  # (the server says when the claim blocks: polled)
                from redis_helpers import _is_blocked

                while not await _is_blocked(storage):  # type: ignore[arg-type]
                    await trio.sleep(0.005)
            await storage.enqueue(queue_name, [gjob("hi", "g", priority=1), gjob("lo", None)])
    assert got == ["hi"]


async def test_a_freed_group_slot_wakes_a_waiting_claim(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(group_concurrency=1)
    await storage.enqueue(queue_name, [gjob("a0", "a"), gjob("a1", "a")])
    [held] = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    got: list[str] = []

    async def waiter() -> None:
        got.extend(c.id for c in await storage.dequeue(queue_name, W2, 10, 20.0, LEASE, None, limits))

    with trio.fail_after(10):  # without a wake-up the claim waits 20 s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert got == []
            await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "a0", b"1", ttl=60, token=held.token)])
    assert got == ["a1"]


async def test_the_reaper_frees_the_group_slots_of_a_dead_worker(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(group_concurrency=1)
    await storage.heartbeat(queue_name, W1, 0.2, [], LEASE)  # dies holding a's slot
    await storage.enqueue(queue_name, [gjob("a0", "a"), gjob("a1", "a")])
    assert [c.id for c in await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)] == ["a0"]
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits) == []
    await trio.sleep(0.3)  # the heartbeat runs out: nothing announces that
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == [("a0", "requeued")]
    # one of a's jobs (a recovered job goes to the end of its lane), one only
    assert [c.id for c in await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits)] == ["a1"]


async def test_group_rate_limit_spaces_each_groups_claims(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(group_rate=2, group_per=0.5)
    await storage.enqueue(queue_name, [gjob(f"a{j}", "a") for j in range(4)] + [gjob(f"b{j}", "b") for j in range(4)])
    await storage.enqueue(queue_name, [gjob(f"u{j}", None) for j in range(3)])  # not limited
    t0 = time.time()
    first = await storage.dequeue(queue_name, W1, 20, 0.05, LEASE, None, limits)
    assert sorted(c.id for c in first) == ["a0", "a1", "b0", "b1", "u0", "u1", "u2"]
    # The next claim waits for a's and b's next tokens, due 0.5 s after their first claims
    # (woken by time: nothing else happens meanwhile).
    with trio.fail_after(5):
        later = await storage.dequeue(queue_name, W2, 20, 3.0, LEASE, None, limits)
    assert sorted(c.id for c in later) == ["a2", "a3", "b2", "b3"]
    assert time.time() - t0 >= 0.45


async def test_a_paused_group_is_passed_over_until_resumed(storage: Storage, queue_name: str) -> None:
    assert await storage.set_group_paused(queue_name, "a", True)
    assert not await storage.set_group_paused(queue_name, "a", True)  # already paused
    assert await storage.paused_groups(queue_name) == ["a"]
    await storage.enqueue(queue_name, [gjob("a0", "a"), gjob("b0", "b"), gjob("u0", None)])
    held = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE)
    assert sorted(c.id for c in held) == ["b0", "u0"]
    got: list[str] = []

    async def waiter() -> None:
        got.extend(c.id for c in await storage.dequeue(queue_name, W2, 10, 20.0, LEASE))

    with trio.fail_after(10):  # resuming wakes the waiting claim
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert got == []
            assert await storage.set_group_paused(queue_name, "a", False)
    assert got == ["a0"]
    assert await storage.paused_groups(queue_name) == []
    assert not await storage.set_group_paused(queue_name, "a", False)


@pytest.mark.capability("Administration")
async def test_clear_frees_the_group_slot_of_a_running_job(storage: Storage, queue_name: str) -> None:
    """``clear`` forgets every job of the queue, a claimed one too: it no longer holds its
    group's slot (``group_concurrency=1``), and its settlement, fenced, frees nothing."""
    limits = ClaimLimits(group_concurrency=1)
    await storage.enqueue(queue_name, [gjob("a0", "a")])
    [held] = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert await storage.clear(queue_name) == 1
    await storage.enqueue(queue_name, [gjob("a1", "a"), gjob("a2", "a")])
    assert [c.id for c in await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits)] == ["a1"]
    done = Settlement(SettleKind.COMPLETE, "a0", b"1", ttl=60, token=held.token)
    assert await storage.settle(queue_name, W1, [done]) == [False]  # the cleared claim: fenced
    assert await storage.dequeue(queue_name, W1, 10, 0.0, LEASE, None, limits) == []  # a1 holds the slot


@pytest.mark.capability("Administration")
async def test_clear_forgets_the_group_rate_limit_state(storage: Storage, queue_name: str) -> None:
    """A group that used its ``group_rate`` in the window, then ``clear``: the group's next
    job is claimed at once, not when the old window ends (4 s: a claim that does not wait
    cannot get it before)."""
    limits = ClaimLimits(group_rate=2, group_per=4.0)
    await storage.enqueue(queue_name, [gjob("a0", "a"), gjob("a1", "a"), gjob("a2", "a")])
    held = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert [c.id for c in held] == ["a0", "a1"]
    assert await storage.dequeue(queue_name, W1, 10, 0.0, LEASE, None, limits) == []  # over its rate
    await storage.clear(queue_name)
    await storage.enqueue(queue_name, [gjob("b0", "a")])
    assert [c.id for c in await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits)] == ["b0"]


# -- through Queues -------------------------------------------------------------------


async def test_queue_enqueues_with_a_group_and_reports_it(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=lambda job: job.payload * 2) as q:
        assert await q.enqueue_and_wait("w", 21, group="t1") == 42
        await q.enqueue_many([("m1", 1), ("m2", 2)], group="t2")
        status = await q.get_status("w")
        assert status is not None and status.group == "t1"
        for jid in ("m1", "m2"):
            status = await q.get_status(jid)
            assert status is not None and status.group == "t2"


@pytest.mark.parametrize(
    ("group", "problem"),
    [(42, "group must be a str, got int"), ("", "group must not be empty"), ("x" * 1025, "group is over 1024 bytes")],
)
async def test_bad_groups_are_refused_naming_the_job(storage: Storage, queue_name: str, group: Any, problem: str) -> None:
    async with Queue(storage, name=queue_name) as q:
        with pytest.raises(ValidationError, match=problem) as err:
            await q.enqueue("bad-job", 1, group=group)
        assert "'bad-job'" in str(err.value)
        with pytest.raises(ValidationError, match=problem):
            await q.enqueue_many([("ok-job", 1), ("bad-job", 2)], group=group)
        assert await q.get_status("bad-job") is None and await q.get_status("ok-job") is None  # nothing written
        with pytest.raises(ValidationError, match="group"):
            await q.pause_group(group)


def test_group_concurrency_is_validated(storage_free_memory: Storage) -> None:
    with pytest.raises(ValidationError, match="group_concurrency"):
        Queue(storage_free_memory, group_concurrency=0)
    with pytest.raises(ValidationError, match="prefetch cannot be combined"):
        Queue(storage_free_memory, group_concurrency=2, prefetch=4)
    with pytest.raises(ValidationError, match="group_rate_limit must be a trioqueue.RateLimit"):
        Queue(storage_free_memory, group_rate_limit=10)  # type: ignore[arg-type]
    q: Queue[Any, Any] = Queue(storage_free_memory, group_rate_limit=RateLimit(10, per=2.0))
    assert q.prefetch == 0 and q.copy().group_rate_limit == RateLimit(10, per=2.0)


async def test_group_concurrency_one_never_runs_two_jobs_of_a_group_at_once(storage: Storage, queue_name: str) -> None:
    """Two workers (two Queues on one storage, as two processes would be), 4 handlers
    each, 3 groups of 4 jobs: no two jobs of one group overlap, and several groups do run
    at once."""
    running: dict[str, int] = {}
    overlaps: list[str] = []
    peak_total = 0
    done = Recorder()

    async def handler(job: Job[Any]) -> None:
        nonlocal peak_total
        group = job.payload
        running[group] = running.get(group, 0) + 1
        if running[group] > 1:
            overlaps.append(job.id)
        peak_total = max(peak_total, sum(running.values()))
        await trio.sleep(0.02)  # hold the slot a while: overlaps would show
        running[group] -= 1

    settings: dict[str, Any] = {"name": queue_name, "handler": handler, "concurrency": 4, "block_timeout": 1.0}
    with trio.fail_after(60):
        async with Queue(storage, group_concurrency=1, **settings), Queue(storage, group_concurrency=1, **settings) as q:
            q.on("completed", done)
            for g in ("g0", "g1", "g2"):
                await q.enqueue_many([(f"{g}-{i}", g) for i in range(4)], group=g)
            await done.wait_for("completed", count=12)
    assert overlaps == []
    assert peak_total >= 2  # the groups did run side by side


async def test_queue_pause_group_and_resume_group(storage: Storage, queue_name: str) -> None:
    ran: list[str] = []
    done = Recorder()
    async with Queue(storage, name=queue_name, handler=lambda job: ran.append(job.id), block_timeout=1.0) as q:
        q.on("completed", done)
        assert await q.pause_group("slow")
        await q.enqueue("s1", None, group="slow")
        await q.enqueue("f1", None, group="fast")
        await done.wait_for("completed", count=1)
        assert ran == ["f1"] and await q.paused_groups() == ["slow"]
        assert await q.resume_group("slow")
        await done.wait_for("completed", count=2)
    assert ran == ["f1", "s1"]
