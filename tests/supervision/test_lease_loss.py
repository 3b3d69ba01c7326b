"""A worker that loses the lease of a claim (conformance: every backend): the reaper
hands the job to a worker again, maybe the same one (which then holds two claims of one
job id at once, each ending on its own); the worker learns of the loss from its heartbeat,
or gives the claim up itself when it could not renew the lease in time, and cancels the
handler (its outcome is not stored)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, JobState, Queue, Storage, ValidationError
from trioqueue.storage import Claim, LostClaim, Settlement, SettleKind
from trioqueue.testing import FaultPlan, FaultyStorage

from storage_helpers import LEASE, W1, W2, job
from support import Recorder


async def test_one_worker_holding_two_claims_of_one_job_runs_them_one_after_the_other(
    storage: Storage, queue_name: str
) -> None:
    """Heartbeats fail while the first attempt runs: the worker gives its claim up, the
    reaper puts the job back and the same worker (concurrency 2) claims it again, while
    the first handler has not ended yet (it shields itself from the cancellation). The
    worker holds two claims of one job id at once: it used to crash when they ended
    (KeyError: running handlers were keyed by job id, not by claim), and it could run
    both handlers at once. The second claim waits for the first handler to end; then it
    runs, and completes the job."""
    reclaimed = trio.Event()

    class Watched(FaultyStorage):
        claims_of_j = 0

        async def dequeue(self, *args: Any, **kwargs: Any) -> list[Claim]:
            claims: list[Claim] = await super().dequeue(*args, **kwargs)
            self.claims_of_j += sum(c.id == "j" for c in claims)
            if self.claims_of_j == 2:
                reclaimed.set()
            return claims

    faulty = Watched(storage, FaultPlan(fail_before=1.0, methods=frozenset({"heartbeat"})))
    faulty.enabled = False  # healthy until the first attempt runs
    release_first = trio.Event()
    attempts: list[tuple[str, int]] = []
    first_ended = 0.0
    second_began = 0.0

    async def handler(job: Job[Any]) -> str:
        nonlocal first_ended, second_began
        attempts.append((job.id, job.attempts))
        if job.id == "j" and len(attempts) == 1:
            faulty.enabled = True  # heartbeats fail from now on: the lease runs out
            with trio.CancelScope(shield=True):  # deaf to the worker giving the claim up
                await release_first.wait()
            first_ended = time.monotonic()
            return "first"
        if job.id == "j":
            second_began = time.monotonic()
        return f"done {job.id}"

    events = Recorder()
    queue = Queue(
        faulty, name=queue_name, handler=handler, concurrency=2, visibility_timeout=0.5, block_timeout=0.2, retry_delay=0
    )
    queue.on("lease_lost", events)
    queue.on("requeued", events)
    queue.on("completed", events)
    async with queue:
        await queue.enqueue("j", None)
        try:
            with trio.fail_after(20):
                await events.wait_for("lease_lost", "j")
                await events.wait_for("requeued", "j")  # the reaper put it back
                await reclaimed.wait()  # and the worker claimed it again
            await trio.testing.wait_all_tasks_blocked()  # the worker takes the claim in hand
            assert "j" in await storage.held_jobs(queue_name, queue.worker_id)
            assert attempts == [("j", 1)]  # the second claim waits for the first handler
        finally:
            faulty.enabled = False
            release_first.set()  # the first attempt ends: its lease is lost, nothing is stored
        with trio.fail_after(20):
            await events.wait_for("completed", "j")
        assert attempts == [("j", 1), ("j", 2)] and second_began >= first_ended
        with trio.fail_after(20):
            assert await queue.enqueue_and_wait("k", None) == "done k"  # the worker still runs
        status = await queue.get_status("j")
        assert status is not None and status.state is JobState.COMPLETED and status.result == "done j"


# -- what a lost lease does (issue 24, part 2) -------------------------------------------

LEASE_S = 0.5  # the queues' visibility_timeout: a heartbeat every 0.1 s, a margin of 0.2 s


async def test_heartbeat_says_which_claims_the_worker_lost_and_why(storage: Storage, queue_name: str) -> None:
    """Conformance: one heartbeat renews the claims still held and reports the others:
    ``recovered`` (put back and completed by another claim, or forgotten), ``fenced``
    (processing under another claim), ``cancelled`` (a cancel request ended it); a claim
    that settled its job itself is not lost."""
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job(i) for i in ("kept", "gone", "again", "cut", "done")])
    mine = {c.id: c.token for c in await storage.dequeue(queue_name, W1, 5, 0.05, LEASE)}
    assert set(mine) == {"kept", "gone", "again", "cut", "done"}
    done = Settlement(SettleKind.COMPLETE, "done", b"1", 60, token=mine["done"])
    assert await storage.settle(queue_name, W1, [done]) == [True]
    await storage.cancel(queue_name, "cut")  # a cancel request: "cut" ends cancelled when recovered
    # the leases of three claims run out now; W1 stays alive
    reply = await storage.heartbeat(queue_name, W1, 30.0, [(i, mine[i]) for i in ("gone", "again", "cut")], 0.0)
    assert reply.cancel_requested == ["cut"] and reply.lost == []
    with trio.fail_after(5):
        while len((await storage.recover_stalled(queue_name))[0]) < 3:
            await trio.sleep(0.01)  # (until the storage's clock passed the deadline)
    theirs = {c.id: c for c in await storage.dequeue(queue_name, W2, 5, 0.05, LEASE)}
    assert set(theirs) == {"gone", "again"}
    settled = Settlement(SettleKind.COMPLETE, "gone", b"2", 60, token=theirs["gone"].token)
    assert await storage.settle(queue_name, W2, [settled]) == [True]
    await storage.cancel(queue_name, "kept")

    reply = await storage.heartbeat(queue_name, W1, 30.0, [*mine.items(), ("nobody", "x.1")], LEASE)

    assert reply.cancel_requested == ["kept"]
    assert sorted(reply.lost) == [
        LostClaim("again", mine["again"], "fenced"),
        LostClaim("cut", mine["cut"], "cancelled"),
        LostClaim("gone", mine["gone"], "recovered"),
        LostClaim("nobody", "x.1", "recovered"),
    ]


async def test_heartbeat_with_two_claims_of_one_job_renews_the_new_one_and_fences_the_old(
    storage: Storage, queue_name: str
) -> None:
    """The job of a claim recovered while its worker lived came back to that worker: its
    heartbeat holds the old claim (its handler still ending) and the new one of the same
    job id. The new one is renewed; the old one is lost, ``fenced``. (PostgresStorage
    keyed the renewed claims by job id, and so reported neither: the old handler ran on.)"""
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("j")])
    [old] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    await storage.heartbeat(queue_name, W1, 30.0, [("j", old.token)], 0.0)  # its lease runs out now
    with trio.fail_after(5):
        while not (await storage.recover_stalled(queue_name))[0]:
            await trio.sleep(0.01)  # (until the storage's clock passed the deadline)
    [new] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert new.id == "j" and new.token != old.token

    reply = await storage.heartbeat(queue_name, W1, 30.0, [("j", old.token), ("j", new.token)], LEASE)

    assert reply.lost == [LostClaim("j", old.token, "fenced")] and reply.cancel_requested == []
    settled = Settlement(SettleKind.COMPLETE, "j", b"1", 60, token=new.token)
    assert await storage.settle(queue_name, W1, [settled]) == [True]


async def test_a_worker_that_cannot_renew_a_lease_cancels_the_handler_before_the_reaper_takes_the_job(
    storage: Storage, queue_name: str
) -> None:
    """Self-fencing: heartbeats fail from the moment the handler runs; the worker cancels
    the handler ``lease_margin`` before the lease it estimates runs out, while the storage
    still has the job processing for it, and emits ``lease_lost`` (``expired``). The
    reaper then recovers the job as usual (an attempt counted) and it runs again."""
    faulty = FaultyStorage(storage, FaultPlan(fail_before=1.0, methods=frozenset({"heartbeat"})))
    faulty.enabled = False  # healthy until the first attempt runs
    cancelled = trio.Event()
    seen: dict[str, Any] = {}

    async def handler(job: Job[Any]) -> str:
        if job.attempts > 1:
            return f"attempt {job.attempts}"
        faulty.enabled = True  # heartbeats fail from now on
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                seen["status"] = await queue.get_status(job.id)  # as it was when the handler was cancelled
            cancelled.set()
        return "not reached"

    lost, completed = Recorder(), Recorder()
    queue = Queue(
        faulty, name=queue_name, handler=handler, visibility_timeout=LEASE_S, block_timeout=0.2, retry_delay=0
    )
    queue.on("lease_lost", lost)
    queue.on("completed", completed)
    async with queue:
        await queue.enqueue("j", None)
        with trio.fail_after(10):
            await cancelled.wait()
            await lost.wait_for("lease_lost", "j")
        status = seen["status"]
        assert status.state is JobState.PROCESSING and status.worker_id == queue.worker_id and status.attempts == 1
        assert [e.data for e in lost.events] == [{"worker_id": queue.worker_id, "why": "expired"}]
        faulty.enabled = False
        with trio.fail_after(10):
            await completed.wait_for("completed", "j")
        status = await queue.get_status("j")
        assert status is not None and status.result == "attempt 2" and status.attempts == 2


async def test_a_claim_recovered_while_its_worker_lives_is_given_up_at_the_next_heartbeat(
    storage: Storage, queue_name: str
) -> None:
    """The worker is presumed dead (its registration removed) and its jobs recovered
    while it runs them: its next heartbeat learns the claims are gone (``recovered``). The
    running handler is cancelled and stores nothing; the prefetched claim is dropped, not
    run; both jobs end as their next claims decide."""
    a_started, a_cancelled = trio.Event(), trio.Event()
    runs: list[tuple[str, int]] = []

    async def handler(job: Job[Any]) -> str:
        runs.append((job.id, job.attempts))
        if job.id == "a" and job.attempts == 1:
            a_started.set()
            try:
                await trio.sleep_forever()
            finally:
                a_cancelled.set()
        return f"{job.id} attempt {job.attempts}"

    lost, completed, errors = Recorder(), Recorder(), Recorder()
    queue = Queue(
        storage,
        name=queue_name,
        handler=handler,
        concurrency=1,
        prefetch=1,
        reaper=False,  # the test recovers
        visibility_timeout=LEASE_S,
        block_timeout=0.2,
        retry_delay=0,
    )
    queue.on("lease_lost", lost)
    queue.on("completed", completed)
    queue.on("error", errors)
    async with queue:
        await queue.enqueue_many([("a", None), ("b", None)])
        with trio.fail_after(10):
            await a_started.wait()
            while "b" not in await storage.held_jobs(queue_name, queue.worker_id):
                await trio.sleep(0.01)  # (b is prefetched: no event says so)
            recovered: list[tuple[str, str]] = []
            while ("a", "requeued") not in recovered:  # (a heartbeat may register it again in between)
                await storage.unregister_worker(queue_name, queue.worker_id)
                recovered += (await storage.recover_stalled(queue_name))[0]
            at = trio.current_time()
            await a_cancelled.wait()
            took = trio.current_time() - at
            await lost.wait_for("lease_lost", count=2)
            await completed.wait_for("completed", "a")
            await completed.wait_for("completed", "b")
        assert took < LEASE_S  # the next heartbeat (within 0.1 s) said so: cancelled at once
        assert sorted((e.job_id, e.data["why"]) for e in lost.events) == [("a", "recovered"), ("b", "recovered")]
        assert runs.count(("a", 1)) == 1 and ("a", 2) in runs and [r for r in runs if r[0] == "b"] == [("b", 1)]
        for job_id, result in (("a", "a attempt 2"), ("b", "b attempt 1")):
            status = await queue.get_status(job_id)
            assert status is not None and status.state is JobState.COMPLETED and status.result == result
        assert not [e for e in errors.events if e.job_id == "a"]  # nothing was stored (or fenced) for a's 1st claim


async def test_lease_deadline_is_the_workers_estimate_and_moves_with_each_renewal(
    storage: Storage, queue_name: str
) -> None:
    moved: list[float] = []

    async def handler(job: Job[Any]) -> None:
        first = job.lease_deadline
        assert first is not None and time.time() < first <= time.time() + LEASE_S
        while (now := job.lease_deadline) is not None and now < first + 0.05:
            await trio.sleep(0.02)  # (until a heartbeat renewed the lease: 0.1 s later)
        assert now is not None
        moved.extend((first, now))

    async with Queue(storage, name=queue_name, handler=handler, visibility_timeout=LEASE_S, block_timeout=0.2) as q:
        with trio.fail_after(10):
            await q.enqueue_and_wait("j", None)
    assert moved[0] + 0.05 <= moved[1] <= time.time() + LEASE_S
    assert Job("x", None, 1, 1, 0.0, "w").lease_deadline is None  # outside a handler

    def sync_handler(job: Job[Any]) -> bool:  # runs in a worker thread
        deadline = job.lease_deadline
        return deadline is not None and time.time() < deadline <= time.time() + LEASE_S

    async with Queue(storage, name=queue_name, handler=sync_handler, visibility_timeout=LEASE_S) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("sync", None) is True


@pytest.mark.parametrize(
    ("margin", "message"),
    [
        (-0.1, "lease_margin must be finite and >= 0"),
        ("1", "lease_margin must be a number of seconds"),
        (0.4, "lease_margin must be less than visibility_timeout minus one heartbeat interval"),
    ],
)
def test_lease_margin_is_validated(storage_free_memory: Storage, margin: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Queue(storage_free_memory, visibility_timeout=LEASE_S, lease_margin=margin)
    assert Queue(storage_free_memory, visibility_timeout=LEASE_S).lease_margin == pytest.approx(0.2)
    assert Queue(storage_free_memory, visibility_timeout=LEASE_S, lease_margin=0).lease_margin == 0.0
