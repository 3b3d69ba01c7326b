"""Storage conformance suite, part 1: the raw Storage interface.

Every test here runs against every backend (the ``storage`` fixture is parametrised in
conftest.py). Waits are driven by the storage itself (blocking dequeue, event stream);
the only sleeps let a TTL or lease run out, which no event announces.
"""

from __future__ import annotations

import math
import time

import pytest
import trio
import trio.testing

from trioqueue import CancelStatus, EnqueueStatus, UpdateTTLStatus
from trioqueue._core import encode_envelope, parse_state
from trioqueue._model._serde import decode_error
from trioqueue.storage import Claim, NewJob, Settlement, SettleKind, Storage, StorageEvent

W1 = "worker:one"  # worker ids may contain ':'
W2 = "worker-two"
LEASE = 30.0


def job(job_id: str, payload: bytes = b"{}", *, max_attempts: int = 3, ttl: float = 60.0, token: str = "") -> NewJob:
    env = encode_envelope(job_id, payload, 1_700_000_000_000, 0, max_attempts, int(ttl * 1000))
    return NewJob(job_id, env, max_attempts, ttl, token or f"t-{job_id}")


# Claim tokens of the claims made through ``claim``, by (queue, job id): ``settlement``
# fences with the latest one, as a worker would.
TOKENS: dict[tuple[str, str], str] = {}


async def claim(
    storage: Storage, q: str, worker: str = W1, n: int = 10, timeout: float = 0.05, lease: float = LEASE, start=None
) -> list[Claim]:
    claims = await storage.dequeue(q, worker, n, timeout, lease, start)
    TOKENS.update(((q, c.id), c.token) for c in claims)
    return claims


def settlement(kind: SettleKind, q: str, job_id: str, data: bytes, **kw: float) -> Settlement:
    return Settlement(kind, job_id, data, token=TOKENS.get((q, job_id), ""), **kw)


def kind(state: str) -> str:
    return parse_state(state)[0]


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


# The events of :func:`mixed_lifecycle`, in order.
MIXED_EVENTS = [
    ("enqueued", "a"),
    ("enqueued", "b"),
    ("enqueued", "c"),
    ("completed", "a"),
    ("failing", "b"),
    ("due", ""),  # b's retry is the first job of the delayed set
    ("cancelled", "c"),
    ("fenced", "zz"),
]


async def mixed_lifecycle(storage: Storage, q: str) -> None:
    """Enqueue a, b and c; complete a, retry b (in 60 s: a ``due`` notice), cancel c;
    settle zz, which W1 never held (fenced): the events of :data:`MIXED_EVENTS`."""
    await storage.enqueue(q, [job("a"), job("b"), job("c")])
    await claim(storage, q, n=2)
    await storage.settle(
        q,
        W1,
        [
            settlement(SettleKind.COMPLETE, q, "a", b'"ra"', ttl=60),
            settlement(SettleKind.RETRY, q, "b", b'{"type":"E","message":"m","traceback":""}', delay=60),
        ],
    )
    await storage.cancel(q, "c")
    await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "zz", b"1", ttl=60)])


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


async def test_cancelled_state_expires_with_the_result_ttl(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("gone", ttl=0.3)])
    assert await storage.cancel(queue_name, "gone") is CancelStatus.CANCELLED
    assert await storage.update_result_ttl(queue_name, "gone", 0.3) is UpdateTTLStatus.UPDATED
    rec = await storage.get_job(queue_name, "gone")
    assert rec is not None and kind(rec.state) == "cancelled"
    await trio.sleep(0.5)
    assert await storage.get_job(queue_name, "gone") is None
    assert await storage.cancel(queue_name, "gone") is CancelStatus.NOT_FOUND


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
        assert await storage.heartbeat(queue_name, W1, 30.0, [("run", c.token)], LEASE) == ["run"]
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
