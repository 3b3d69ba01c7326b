"""Storage conformance suite, part 1 (continued): workers, leases and attempts.

The worker registry and its heartbeats, recovery of stalled jobs (lease run out, worker
dead), the reaper's leader lock, claim tokens that fence the old claim of a job claimed
again, reserved claims whose attempt counts only once started, and releases that never
take an attempt back (but refund the claims that never ran). Every backend, as in
test_storage.py.
"""

from __future__ import annotations

import math

import trio

from trioqueue import CancelStatus
from trioqueue._model._serde import decode_error
from trioqueue.storage import Settlement, SettleKind, Storage

from storage_helpers import LEASE, W1, W2, claim, job, kind, settlement


async def test_worker_registry(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.heartbeat(queue_name, W2, 0.2, [], LEASE)
    workers = await storage.workers(queue_name)
    assert set(workers) == {W1, W2}
    await trio.sleep(0.4)
    assert set(await storage.workers(queue_name)) == {W1}
    await storage.unregister_worker(queue_name, W1)
    assert await storage.workers(queue_name) == {}


async def test_recover_stalled_lease_expired(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s", max_attempts=2)])
    [stale] = await claim(storage, queue_name, W1, 1, 0.05, 0.2)
    assert (await storage.recover_stalled(queue_name))[0] == []  # lease still valid
    await trio.sleep(0.35)
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == [("s", "requeued")]
    rec = await storage.get_job(queue_name, "s")
    assert rec is not None and kind(rec.state) == "queued" and rec.attempts == 1
    assert await storage.held_jobs(queue_name, W1) == []
    # The old owner's late settlement is refused.
    assert await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "s", b"1", ttl=9)]) == [False]
    # Second stall uses the last attempt: failed for good.
    [c] = await claim(storage, queue_name, W2, 1, 0.05, 0.2)
    assert c.attempts == 2 and c.token != stale.token
    await storage.heartbeat(queue_name, W2, 30.0, [], 0.2)
    await trio.sleep(0.35)
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == [("s", "failed")]
    rec = await storage.get_job(queue_name, "s")
    assert rec is not None and kind(rec.state) == "failed"
    assert decode_error(rec.error).type == "StalledJobError"


async def test_recover_stalled_dead_worker_and_renewed_lease(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 0.3, [], LEASE)  # will die
    await storage.heartbeat(queue_name, W2, 30.0, [], LEASE)  # stays alive
    await storage.enqueue(queue_name, [job("dead"), job("alive")])
    await claim(storage, queue_name, W1, 1, 0.05)
    [alive] = await claim(storage, queue_name, W2, 1, 0.05, 0.3)
    recovered, next_deadline = await storage.recover_stalled(queue_name)
    assert recovered == [] and next_deadline is not None and math.isfinite(next_deadline)
    for _ in range(4):  # W2 keeps renewing its job's lease
        await trio.sleep(0.15)
        await storage.heartbeat(queue_name, W2, 30.0, [("alive", alive.token)], 0.3)
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == [("dead", "requeued")]
    assert await storage.held_jobs(queue_name, W2) == ["alive"]


async def test_reaper_removes_dead_workers_once_they_hold_nothing(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 0.2, [], LEASE)  # dies holding a job
    await storage.heartbeat(queue_name, W2, 0.2, [], LEASE)  # dies holding nothing
    await storage.enqueue(queue_name, [job("held")])
    await claim(storage, queue_name, W1, 1)
    await trio.sleep(0.3)
    assert await storage.workers(queue_name) == {}
    assert set(await storage.workers(queue_name, include_expired=True)) == {W1, W2}
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == [("held", "requeued")]
    assert await storage.workers(queue_name, include_expired=True) == {}  # W1 too: its list is empty now
    await storage.heartbeat(queue_name, W2, 30.0, [], LEASE)  # a worker that comes back registers again
    assert set(await storage.workers(queue_name)) == {W2}


async def test_leader_lock(storage: Storage, queue_name: str) -> None:
    lock = f"{queue_name}:reaper"
    assert await storage.acquire_lock(lock, "a", 0.3)
    assert not await storage.acquire_lock(lock, "b", 0.3)
    assert await storage.acquire_lock(lock, "a", 0.3)  # renew
    assert not await storage.release_lock(lock, "b")
    assert await storage.release_lock(lock, "a")
    assert await storage.acquire_lock(lock, "b", 0.3)
    await trio.sleep(0.45)
    assert await storage.acquire_lock(lock, "a", 0.3)  # b's lock expired


# -- incarnation and claim tokens, reserved claims (issue #8 items 2, 4, 6, 19) --------


async def test_stale_claim_of_a_reclaimed_job_is_fenced(storage: Storage, queue_name: str) -> None:
    """A worker that lost its lease and claimed the same job again cannot settle it
    through its old claim: fencing is by claim, not by worker id."""
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("j")])
    [old] = await claim(storage, queue_name, W1, 1, lease=0.2)
    await trio.sleep(0.35)
    assert (await storage.recover_stalled(queue_name))[0] == [("j", "requeued")]
    [new] = await claim(storage, queue_name, W1, 1)
    assert new.token != old.token and new.attempts == 2
    stale = Settlement(SettleKind.COMPLETE, "j", b'"stale"', ttl=60, token=old.token)
    assert await storage.settle(queue_name, W1, [stale]) == [False]
    rec = await storage.get_job(queue_name, "j")
    assert rec is not None and kind(rec.state) == "processing"
    await storage.heartbeat(queue_name, W1, 30.0, [("j", old.token)], 0.2)  # renews nothing
    fresh = Settlement(SettleKind.COMPLETE, "j", b'"fresh"', ttl=60, token=new.token)
    assert await storage.settle(queue_name, W1, [fresh]) == [True]
    rec = await storage.get_job(queue_name, "j")
    assert rec is not None and rec.result == b'"fresh"' and rec.attempts == 2


async def test_reserved_claims_count_their_attempt_only_when_started(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("run"), job("pre1", max_attempts=1), job("pre2")])
    claims = await claim(storage, queue_name, W1, 3, lease=0.2, start=1)
    assert [(c.id, c.started, c.attempts) for c in claims] == [("run", True, 1), ("pre1", False, 1), ("pre2", False, 1)]
    assert [(r.id, r.attempts) for r in [await storage.get_job(queue_name, i) for i in ("run", "pre1")] if r] == [
        ("run", 1),
        ("pre1", 0),
    ]
    # pre2's handler is about to run: its attempt is counted once, however often asked.
    assert await storage.start(queue_name, W1, [("pre2", claims[2].token)]) == [True]
    assert await storage.start(queue_name, W1, [("pre2", claims[2].token), ("pre1", "forged")]) == [True, False]
    rec = await storage.get_job(queue_name, "pre2")
    assert rec is not None and rec.attempts == 1
    # The worker dies: the never-started claim goes back free, even at max_attempts=1.
    await trio.sleep(0.35)
    recovered, _ = await storage.recover_stalled(queue_name)
    assert sorted(recovered) == [("pre1", "requeued"), ("pre2", "requeued"), ("run", "requeued")]
    attempts = {i: (await storage.get_job(queue_name, i)).attempts for i in ("run", "pre1", "pre2")}  # type: ignore[union-attr]
    assert attempts == {"run": 1, "pre1": 0, "pre2": 1}
    # A stale start after recovery is refused: the job is not ours to run any more.
    assert await storage.start(queue_name, W1, [("pre1", claims[1].token)]) == [False]
    again = await claim(storage, queue_name, W2, 3)
    assert sorted((c.id, c.attempts, c.started) for c in again) == [
        ("pre1", 1, True),
        ("pre2", 2, True),
        ("run", 2, True),
    ]


async def test_release_never_takes_an_attempt_back(storage: Storage, queue_name: str) -> None:
    """Attempts never go down (the model test found releases undoing started attempts): a
    started claim's attempt stays counted, a reserved claim's was never counted."""
    await storage.enqueue(queue_name, [job("s"), job("r")])
    await claim(storage, queue_name, W1, 2, start=1)
    assert await storage.release(queue_name, W1, ["s", "r"]) == 2
    for job_id, attempts in (("s", 1), ("r", 0)):
        rec = await storage.get_job(queue_name, job_id)
        assert rec is not None and kind(rec.state) == "queued" and rec.attempts == attempts


async def test_release_of_a_started_claim_whose_attempts_are_used_up_fails_it(storage: Storage, queue_name: str) -> None:
    """A worker restarted under its old id gives back the claims its dead run held,
    without a refund (their handlers may have run). A started claim that used the last
    attempt fails (``StalledJobError``), as the reaper's recovery of it would: it never
    runs an attempt past ``max_attempts`` (a chaos run on PostgreSQL ran one a third
    time at max_attempts=2). A started claim with attempts left, and a reserved one at
    the limit, go back."""
    await storage.enqueue(queue_name, [job("s", max_attempts=2), job("left", max_attempts=2), job("r", max_attempts=1)])
    await claim(storage, queue_name, W1, 2, start=2)  # s and left: attempt 1
    assert await storage.release(queue_name, W1, ["s"]) == 1
    claims = {c.id: c for c in await claim(storage, queue_name, W1, 3, start=1)}
    assert claims["s"].started and claims["s"].attempts == 2 and not claims["r"].started
    async with storage.subscribe(queue_name) as events:
        assert await storage.release(queue_name, W1, ["s", "left", "r"]) == 2
        seen = []
        while ("failed", "s") not in seen:
            with trio.fail_after(5):
                seen += [(ev.kind, ev.job_id) for ev in await events.receive()]
    rec = await storage.get_job(queue_name, "s")
    assert rec is not None and kind(rec.state) == "failed" and rec.attempts == 2
    assert decode_error(rec.error).type == "StalledJobError"
    for job_id, attempts in (("left", 1), ("r", 0)):
        rec = await storage.get_job(queue_name, job_id)
        assert rec is not None and kind(rec.state) == "queued" and rec.attempts == attempts
    assert sorted(c.id for c in await claim(storage, queue_name, W2, 3)) == ["left", "r"]
    assert await storage.held_jobs(queue_name, W1) == []


async def test_release_with_refund_takes_back_the_attempts_of_claims_that_never_ran(
    storage: Storage, queue_name: str
) -> None:
    """A consumer hands back prefetched claims at shutdown that were started at claim
    time but never reached a handler: their attempts are taken back, and only theirs."""
    await storage.enqueue(queue_name, [job("s", max_attempts=1), job("other"), job("r")])
    claims = await claim(storage, queue_name, W1, 3, start=2)
    assert [(c.id, c.started) for c in claims] == [("s", True), ("other", True), ("r", False)]
    assert await storage.start(queue_name, W1, [("r", claims[2].token)]) == [True]
    assert await storage.release(queue_name, W1, ["s", "r"], refund=True) == 2
    assert await storage.release(queue_name, W1, ["other"]) == 1
    for job_id, attempts in (("s", 0), ("r", 0), ("other", 1)):
        rec = await storage.get_job(queue_name, job_id)
        assert rec is not None and kind(rec.state) == "queued" and rec.attempts == attempts
    # A job at max_attempts=1 handed back with a refund runs its one attempt in full.
    again = {c.id: c for c in await claim(storage, queue_name, W2, 3)}
    assert again["s"].attempts == 1 and again["r"].attempts == 1 and again["other"].attempts == 2


async def test_one_start_of_several_reserved_claims_answers_each_on_its_own(storage: Storage, queue_name: str) -> None:
    """A start() mixing claims to start, one started already, one with a cancel request
    and one forged: each gets its own answer, and only the first kind count an attempt."""
    await storage.enqueue(queue_name, [job(i) for i in ("a", "b", "done", "gone", "forged")])
    claims = {c.id: c for c in await claim(storage, queue_name, W1, 5, start=0)}
    assert await storage.start(queue_name, W1, [("done", claims["done"].token)]) == [True]
    assert await storage.cancel(queue_name, "gone") is CancelStatus.CANCELLED
    asked = [
        ("a", claims["a"].token),
        ("done", claims["done"].token),
        ("gone", claims["gone"].token),
        ("forged", "forged"),
        ("b", claims["b"].token),
    ]
    assert await storage.start(queue_name, W1, asked) == [True, True, False, False, True]
    records = {i: await storage.get_job(queue_name, i) for i in claims}
    assert {i: r.attempts for i, r in records.items() if r} == {"a": 1, "b": 1, "done": 1, "gone": 0, "forged": 0}
    assert kind(records["gone"].state) == "cancelled"  # type: ignore[union-attr]
    assert sorted(await storage.held_jobs(queue_name, W1)) == ["a", "b", "done", "forged"]
