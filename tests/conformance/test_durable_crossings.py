"""Where durable sleep and signals cross the other features (trees, removal and
retention, pause, groups, debounce, retry, the reaper): conformance, every backend with
the capabilities each test names."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from trioqueue import CancelStatus, Child, ChildJobFailedError, EnqueueStatus, Job, JobState, Queue, Storage, UnrecoverableError
from trioqueue.storage import Administration, ClaimLimits, Debounce, Settlement, SettleKind, Signals
from trioqueue.storage._rules import WaitSignal

from storage_helpers import LEASE, W1, job
from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}
EVENTS = ("waiting_signal", "sleeping", "completed", "failed", "cancelled", "enqueued", "promoted")


def recorded(q: Queue[Any]) -> Recorder:
    """The queue's job events that these tests wait on, recorded (before it starts)."""
    events = Recorder()
    for name in EVENTS:
        q.on(name, events)
    return events


async def state_of(q: Queue[Any], job_id: str) -> JobState | None:
    status = await q.get_status(job_id)
    return None if status is None else status.state


# -- trees -------------------------------------------------------------------------------


@pytest.mark.capability("Trees", "Signals")
async def test_a_child_waiting_for_a_signal_is_cancelled_with_its_parent(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> Any:
        if job.id == "kid":
            return await job.wait_for_signal("go", timeout=3600)
        return "parent"

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None, children=[Child("kid")])
            await events.wait_for("waiting_signal", "kid")
            assert (await q.cancel("top")).status is CancelStatus.CANCELLED
            await events.wait_for("cancelled", "kid")
        assert await state_of(q, "kid") is JobState.CANCELLED
        assert await q.signal("kid", "go") == "not_found"
        assert (await q.counts())[JobState.WAITING_SIGNAL] == 0


@pytest.mark.capability("Trees", "Signals")
async def test_a_child_waiting_for_a_signal_is_cancelled_when_a_sibling_fails(storage: Storage, queue_name: str) -> None:
    q: Queue[Any]

    async def handler(job: Job[Any]) -> Any:
        if job.id == "kid":
            return await job.wait_for_signal("go")
        if job.id == "bad":
            await events.wait_for("waiting_signal", "kid")  # fail once its sibling waits
            raise UnrecoverableError("bad broke")
        return "parent"

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            with pytest.raises(ChildJobFailedError):
                await q.enqueue_and_wait("top", None, children=[Child("kid"), Child("bad")])
            await events.wait_for("cancelled", "kid")
        assert await state_of(q, "kid") is JobState.CANCELLED
        assert await q.signal("kid", "go") == "not_found"


@pytest.mark.capability("Trees", "Signals")
async def test_a_parent_waiting_for_a_signal_fails_when_its_child_fails(storage: Storage, queue_name: str) -> None:
    """``on_child_failure="cancel"``: a dynamic parent that waits for a signal while its
    child fails ends failed (``ChildJobFailedError``) at once, as a waiting parent does."""

    async def handler(job: Job[Any]) -> Any:
        if job.id == "bad":
            await events.wait_for("waiting_signal", "top")  # fail once its parent waits
            raise UnrecoverableError("bad broke")
        await job.add_children([Child("bad")])
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None)
            await events.wait_for("failed", "top")
        status = await q.get_status("top")
        assert status is not None and status.state is JobState.FAILED
        assert status.error is not None and status.error.type == "ChildJobFailedError" and "bad broke" in status.error.message
        assert await q.signal("top", "go") == "not_found"


@pytest.mark.capability("Trees", "Signals")
async def test_a_parent_whose_child_failed_while_it_ran_fails_when_it_waits_for_a_signal(
    storage: Storage, queue_name: str
) -> None:
    """The run of a parent whose child failed under ``cancel`` fails it whatever it ends
    with (a completion, a retry, a sleep...): a wait for a signal too (it would wait for a
    message that can change nothing)."""

    async def handler(job: Job[Any]) -> Any:
        if job.id == "bad":
            raise UnrecoverableError("bad broke")
        await job.add_children([Child("bad")])
        await events.wait_for("failed", "bad")
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, concurrency=2, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("top", None)
            await events.wait_for("failed", "top")
        status = await q.get_status("top")
        assert status is not None and status.state is JobState.FAILED
        assert status.error is not None and status.error.type == "ChildJobFailedError"
        assert "top" not in events.ids("waiting_signal")


# -- the storage: removal, retention, pause, the reaper, groups, debounce ----------------------


def _park(job_id: str, token: str, deadline_ms: int | None = None) -> Settlement:
    return Settlement(SettleKind.WAIT_SIGNAL, job_id, WaitSignal("go", 1, deadline_ms).encode(), token=token)


async def _parked(storage: Storage, queue: str, job_id: str, deadline_ms: int | None = None, mail: int = 1) -> None:
    """Enqueue ``job_id``, send it ``mail`` messages on another name, claim it and park it
    waiting for ``go``."""
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue, W1, 30.0, [], LEASE)
    await storage.enqueue(queue, [job(job_id)])
    [claim] = await storage.dequeue(queue, W1, 1, 0.05, LEASE)
    assert claim.id == job_id
    for i in range(mail):
        assert await storage.signal(queue, job_id, "other", b"%d" % i) == "delivered"
    assert await storage.settle(queue, W1, [_park(job_id, claim.token, deadline_ms)]) == [True]
    assert await _kind(storage, queue, job_id) == "waiting_signal"


async def _kind(storage: Storage, queue: str, job_id: str) -> str | None:
    record = await storage.get_job(queue, job_id)
    return None if record is None else record.state.split(":")[0]


def _later_ms() -> int:
    return int((time.time() + 3600) * 1000)


@pytest.mark.capability("Administration", "Signals")
async def test_a_removed_waiting_job_is_forgotten_with_its_mailbox_and_its_deadline(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals) and isinstance(storage, Administration)
    await _parked(storage, queue_name, "w", deadline_ms=1_000)  # (long past: due at the next promotion)
    assert await storage.remove_job(queue_name, "w")
    assert await storage.get_job(queue_name, "w") is None
    assert await storage.get_signals(queue_name, "w") == []
    assert await storage.signal(queue_name, "w", "go", b"1") == "not_found"
    assert (await storage.counts(queue_name))["waiting_signal"] == 0
    assert await storage.dequeue(queue_name, W1, 1, 0.05, LEASE) == []  # its deadline went with it
    await storage.enqueue(queue_name, [job("w", token="t2")])  # a new incarnation: an empty mailbox
    assert await storage.get_signals(queue_name, "w") == []
    [again] = await storage.dequeue(queue_name, W1, 1, 0.5, LEASE)
    assert again.id == "w" and again.attempts == 1 and again.token.startswith("t2")


@pytest.mark.capability("Signals")
async def test_a_job_enqueued_over_a_cancelled_waiting_one_has_an_empty_mailbox(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals)
    await _parked(storage, queue_name, "w", deadline_ms=_later_ms())
    assert await storage.cancel(queue_name, "w") == "cancelled"
    [out] = await storage.enqueue(queue_name, [job("w", token="t2")])
    assert out.status == "queued"
    assert await storage.get_signals(queue_name, "w") == []
    assert await _kind(storage, queue_name, "w") == "queued"


@pytest.mark.capability("Administration", "Signals")
async def test_purge_and_clear_forget_waiting_jobs_and_their_mailboxes(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals) and isinstance(storage, Administration)
    await _parked(storage, queue_name, "w", deadline_ms=_later_ms())
    await _parked(storage, queue_name, "c")
    assert await storage.purge(queue_name, "cancelled") == 0  # waiting is not terminal: not purged
    assert await _kind(storage, queue_name, "w") == "waiting_signal"
    assert await storage.cancel(queue_name, "c") == "cancelled"
    assert await storage.purge(queue_name, "cancelled") == 1
    assert await storage.get_signals(queue_name, "c") == []
    assert await storage.clear(queue_name) == 1
    assert await storage.get_job(queue_name, "w") is None and await storage.get_signals(queue_name, "w") == []
    assert (await storage.counts(queue_name))["waiting_signal"] == 0
    assert await storage.signal(queue_name, "w", "go", b"1") == "not_found"


@pytest.mark.capability("Signals")
async def test_a_waiting_job_outlives_its_result_ttl_and_count_based_retention(storage: Storage, queue_name: str) -> None:
    """Retention is for ended jobs: a job waits for its signal however long its result
    TTL is, and ``keep`` (``keep_completed``) counts completed jobs only."""
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("w", ttl=0.001), job("d", ttl=0.001)])
    claims = {c.id: c.token for c in await storage.dequeue(queue_name, W1, 2, 0.05, LEASE)}
    assert await storage.signal(queue_name, "w", "other", b"0") == "delivered"
    park = _park("w", claims["w"])
    done = Settlement(SettleKind.COMPLETE, "d", b"1", ttl=0.001, token=claims["d"], keep=0)
    assert await storage.settle(queue_name, W1, [park, done]) == [True, True]
    await trio.sleep(0.05)  # (past both TTLs: no event says a TTL ran out)
    await storage.enqueue(queue_name, [job("x")])  # (a write: sweeps what expired)
    assert await storage.dequeue(queue_name, W1, 5, 0.05, LEASE) != []
    assert await _kind(storage, queue_name, "w") == "waiting_signal"
    assert await storage.get_signals(queue_name, "w") == [("other", b"0")]
    assert await storage.signal(queue_name, "w", "go", b"1") == "delivered"
    assert await _kind(storage, queue_name, "w") == "queued"


@pytest.mark.capability("Administration", "Signals")
async def test_a_waiting_job_past_its_deadline_is_not_claimed_while_the_queue_is_paused(
    storage: Storage, queue_name: str
) -> None:
    assert isinstance(storage, Signals) and isinstance(storage, Administration)
    await _parked(storage, queue_name, "w", deadline_ms=1_000)  # (long past)
    assert await storage.set_paused(queue_name, True)
    assert await storage.dequeue(queue_name, W1, 1, 0.1, LEASE) == []
    await storage.recover_stalled(queue_name)  # (promotes what is due, paused or not)
    assert await _kind(storage, queue_name, "w") in ("waiting_signal", "queued")
    assert await storage.dequeue(queue_name, W1, 1, 0.1, LEASE) == []
    assert await storage.set_paused(queue_name, False)
    [again] = await storage.dequeue(queue_name, W1, 1, 1.0, LEASE)
    assert again.id == "w" and again.attempts == 1


async def test_the_reaper_never_touches_a_waiting_or_sleeping_job(storage: Storage, queue_name: str) -> None:
    """A parked job holds no lease: a dead worker's recovery passes it by."""
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("w"), job("s")])
    claims = {c.id: c.token for c in await storage.dequeue(queue_name, W1, 2, 0.05, 0.05)}  # short leases
    settled = [_park("w", claims["w"]), Settlement(SettleKind.SLEEP, "s", b"", delay=3600, token=claims["s"])]
    if not isinstance(storage, Signals):
        settled = settled[1:]
    assert await storage.settle(queue_name, W1, settled) == [True] * len(settled)
    await storage.unregister_worker(queue_name, W1)  # the worker is gone
    await trio.sleep(0.1)  # (past the leases: no event says a lease ran out)
    recovered, _ = await storage.recover_stalled(queue_name)
    assert recovered == []
    assert await _kind(storage, queue_name, "s") == "delayed"
    if isinstance(storage, Signals):
        assert await _kind(storage, queue_name, "w") == "waiting_signal"
        record = await storage.get_job(queue_name, "w")
        assert record is not None and record.attempts == 0


@pytest.mark.capability("Groups", "Signals")
async def test_a_grouped_job_that_parks_or_sleeps_frees_its_group_slot(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(group_concurrency=1)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job(f"a{i}")._replace(group="a") for i in range(3)])
    [a0] = await storage.dequeue(queue_name, W1, 5, 0.05, LEASE, None, limits)
    assert a0.id == "a0" and await storage.dequeue(queue_name, W1, 5, 0.0, LEASE, None, limits) == []
    assert await storage.settle(queue_name, W1, [_park("a0", a0.token)]) == [True]
    [a1] = await storage.dequeue(queue_name, W1, 5, 0.05, LEASE, None, limits)
    assert a1.id == "a1" and await storage.dequeue(queue_name, W1, 5, 0.0, LEASE, None, limits) == []
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.SLEEP, "a1", b"", delay=3600, token=a1.token)]) == [True]
    [a2] = await storage.dequeue(queue_name, W1, 5, 0.05, LEASE, None, limits)
    assert a2.id == "a2"
    # woken, the parked one takes its turn once the slot is free again
    assert await storage.signal(queue_name, "a0", "go", b"1") == "delivered"
    assert await storage.dequeue(queue_name, W1, 5, 0.0, LEASE, None, limits) == []
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "a2", b"1", ttl=60, token=a2.token)]) == [True]
    [again] = await storage.dequeue(queue_name, W1, 5, 0.5, LEASE, None, limits)
    assert again.id == "a0"


@pytest.mark.capability("Debounce", "Signals")
async def test_a_debounce_of_a_job_that_waits_for_a_signal_or_sleeps_is_a_duplicate(storage: Storage, queue_name: str) -> None:
    """A debounce updates a job not claimed yet; one that ran and now waits for a signal
    or sleeps is in the middle of its run: the debounced enqueue is a duplicate, and its
    payload, due time and mailbox stay as they were."""
    assert isinstance(storage, Debounce)
    await _parked(storage, queue_name, "w")
    await storage.enqueue(queue_name, [job("s", b'"first"')])
    [s] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.SLEEP, "s", b"", delay=3600, token=s.token)]) == [True]
    before = await storage.get_job(queue_name, "s")
    assert before is not None
    outs = await storage.debounce(queue_name, [job("w", b'"new"', token="t2"), job("s", b'"new"', token="t2")], 0.0, None)
    assert [o.status for o in outs] == [EnqueueStatus.DUPLICATE, EnqueueStatus.DUPLICATE]
    assert await _kind(storage, queue_name, "w") == "waiting_signal"
    after = await storage.get_job(queue_name, "s")
    assert after is not None and after.state == before.state and after.token == before.token
    assert isinstance(storage, Administration)
    envelope = await storage.get_envelope(queue_name, "s")
    assert envelope is not None and b'"first"' in envelope
    assert await storage.dequeue(queue_name, W1, 1, 0.1, LEASE) == []  # not due earlier either


# -- through the Queue ---------------------------------------------------------------------


@pytest.mark.capability("Administration", "Signals")
async def test_retry_of_a_cancelled_waiting_job_waits_again_and_its_signal_completes_it(
    storage: Storage, queue_name: str
) -> None:
    runs: list[int] = []

    async def handler(job: Job[Any]) -> Any:
        runs.append(job.attempts)
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("r", None)
            await events.wait_for("waiting_signal", "r")
            assert (await q.cancel("r")).status is CancelStatus.CANCELLED
            assert await q.signal("r", "go", "too late") == "not_found"
            await q.retry("r")
            await events.wait_for("waiting_signal", "r", count=2)  # it waits again
            assert await q.signal("r", "go", "now") == "delivered"
            await events.wait_for("completed", "r")
        status = await q.get_status("r")
        assert status is not None and status.state is JobState.COMPLETED and status.result == "now"
    assert runs == [1, 1, 1]


@pytest.mark.capability("Signals")
async def test_a_signal_to_a_sleeping_job_is_kept_for_its_later_wait(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> Any:
        await job.sleep("nap", 0.3)
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    events = recorded(q)
    async with q:
        with trio.fail_after(20):
            await q.enqueue("s", None)
            await events.wait_for("sleeping", "s")
            assert await q.signal("s", "go", "early") == "delivered"
            await events.wait_for("completed", "s")
        status = await q.get_status("s")
        assert status is not None and status.result == "early"
    assert "s" not in events.ids("waiting_signal")  # its message was there: it never parked
