"""Signals to durable jobs (``Queue.signal``, ``Job.wait_for_signal``; conformance: every
backend with the Signals capability). Issue 34, item 4."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, JobState, Queue, SignalTimeoutError, Storage, ValidationError
from trioqueue.storage import Administration, Settlement, SettleKind, Signals
from trioqueue.storage._rules import WaitSignal

from storage_helpers import LEASE, W1, job
from support import Recorder

pytestmark = pytest.mark.capability("Signals")

FAST = {"retry_delay": 0, "block_timeout": 0.5}


def _wait(name: str, count: int, deadline_ms: int | None = None) -> bytes:
    return WaitSignal(name, count, deadline_ms).encode()


def twin(storage: Storage) -> Storage:
    """Another storage object on the same data (another connection, as another process
    would have; memory: the same object, there is no other)."""
    name = type(storage).__name__
    if name == "FileStorage":
        from trioqueue.storage import FileStorage

        return FileStorage(storage._core.root)  # type: ignore[attr-defined]
    if name == "RedisStorage":
        from trioqueue.storage import RedisStorage

        s = storage._settings  # type: ignore[attr-defined]
        return RedisStorage(s.url, prefix=storage.prefix, cluster=s.params.cluster)  # type: ignore[attr-defined]
    if name == "PostgresStorage":
        from trioqueue.storage.postgres import PostgresStorage

        return PostgresStorage(storage._settings.url, schema=storage.schema)  # type: ignore[attr-defined]
    return storage


class Seen:
    """What the handler saw, and an event per mark it reaches."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.events: dict[str, trio.Event] = {}

    def mark(self, what: str) -> None:
        self.log.append(what)
        self.event(what).set()

    def event(self, what: str) -> trio.Event:
        return self.events.setdefault(what, trio.Event())


async def _state(storage: Storage, queue: str, job_id: str) -> str:
    record = await storage.get_job(queue, job_id)
    assert record is not None
    return record.state.split(":")[0]


# -- the storage ---------------------------------------------------------------------------


async def test_signal_appends_to_the_mailbox_of_a_live_job_only(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals)
    assert await storage.signal(queue_name, "nobody", "go", b"1") == "not_found"
    await storage.enqueue(queue_name, [job("s")])
    assert await storage.signal(queue_name, "s", "go", b"1") == "delivered"
    assert await storage.signal(queue_name, "s", "other", b"2") == "delivered"
    assert await storage.signal(queue_name, "s", "go", b"3") == "delivered"
    assert await storage.get_signals(queue_name, "s") == [("go", b"1"), ("other", b"2"), ("go", b"3")]
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.signal(queue_name, "s", "go", b"4") == "delivered"  # processing: kept too
    done = Settlement(SettleKind.COMPLETE, "s", b"1", 60, token=claim.token)
    assert await storage.settle(queue_name, W1, [done]) == [True]
    assert await storage.signal(queue_name, "s", "go", b"5") == "not_found"  # terminal: nothing kept
    assert [p for _, p in await storage.get_signals(queue_name, "s")] == [b"1", b"2", b"3", b"4"]
    assert await storage.get_signals(queue_name, "nobody") == []


async def test_wait_signal_parks_and_a_signal_queues_it_again(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("w"), job("x")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert claim.id == "w" and claim.attempts == 1
    park = Settlement(SettleKind.WAIT_SIGNAL, "w", _wait("go", 1), token=claim.token)
    assert await storage.settle(queue_name, W1, [park]) == [True]
    assert await storage.settle(queue_name, W1, [park]) == [True]  # a retried call: nothing changes
    assert await _state(storage, queue_name, "w") == "waiting_signal"
    record = await storage.get_job(queue_name, "w")
    assert record is not None and record.attempts == 0  # the attempt was not counted
    assert (await storage.counts(queue_name))["waiting_signal"] == 1
    listed, _ = await storage.list_jobs(queue_name, "waiting_signal")
    assert [r.id for r in listed] == ["w"]
    # nothing to claim but x; a signal on another name does not wake it
    assert [c.id for c in await storage.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["x"]
    assert await storage.signal(queue_name, "w", "other", b"0") == "delivered"
    assert await _state(storage, queue_name, "w") == "waiting_signal"
    assert await storage.signal(queue_name, "w", "go", b"1") == "delivered"
    assert await _state(storage, queue_name, "w") == "queued"
    assert (await storage.counts(queue_name))["waiting_signal"] == 0
    [again] = await storage.dequeue(queue_name, W1, 1, 1.0, LEASE)
    assert again.id == "w" and again.attempts == 1


async def test_wait_signal_whose_messages_arrived_is_queued_at_once(storage: Storage, queue_name: str) -> None:
    """The race of a send with the settlement: the job has the messages it needs."""
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("r")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.signal(queue_name, "r", "go", b"1") == "delivered"
    assert await storage.signal(queue_name, "r", "go", b"2") == "delivered"
    park = Settlement(SettleKind.WAIT_SIGNAL, "r", _wait("go", 2), token=claim.token)
    assert await storage.settle(queue_name, W1, [park]) == [True]
    assert await _state(storage, queue_name, "r") == "queued"
    [again] = await storage.dequeue(queue_name, W1, 1, 1.0, LEASE)
    assert again.id == "r" and again.attempts == 1
    # a fenced WAIT_SIGNAL changes nothing
    stale = Settlement(SettleKind.WAIT_SIGNAL, "r", _wait("go", 3), token=claim.token)
    assert await storage.settle(queue_name, W1, [stale]) == [False]
    assert await _state(storage, queue_name, "r") == "processing"


async def test_a_park_publishes_waiting_signal_and_one_whose_signal_arrived_requeued(storage: Storage, queue_name: str) -> None:
    """The settlement that parks a job announces it (``waiting_signal``, as a sleep's
    ``sleeping``); one whose messages had arrived is queued at once (``requeued``)."""
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("p"), job("r")])
    seen: list[Any] = []
    async with storage.subscribe(queue_name) as events:
        claims = {c.id: c.token for c in await storage.dequeue(queue_name, W1, 2, 0.05, LEASE)}
        assert await storage.signal(queue_name, "r", "go", b"1") == "delivered"
        parks = [Settlement(SettleKind.WAIT_SIGNAL, jid, _wait("go", 1), token=claims[jid]) for jid in ("p", "r")]
        assert await storage.settle(queue_name, W1, parks) == [True, True]
        await storage.enqueue(queue_name, [job("marker")])
        with trio.fail_after(10):
            while not any(e.job_id == "marker" for e in seen):
                seen.extend(e for e in await events.receive() if e.job_id in ("p", "r", "marker"))
    assert [(e.kind, e.job_id) for e in seen] == [("waiting_signal", "p"), ("requeued", "r"), ("enqueued", "marker")]
    assert seen[0].worker_id == W1 and seen[0].token == "t-p"


async def test_a_waiting_job_is_queued_again_at_its_deadline(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("d")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    park = Settlement(SettleKind.WAIT_SIGNAL, "d", _wait("go", 1, 1_000), token=claim.token)  # (long past)
    assert await storage.settle(queue_name, W1, [park]) == [True]
    [again] = await storage.dequeue(queue_name, W1, 1, 2.0, LEASE)  # promoted as a delayed job is
    assert again.id == "d" and again.attempts == 1


async def test_cancel_a_waiting_job_and_retry_keeps_its_mailbox(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Signals) and isinstance(storage, Administration)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("c")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.signal(queue_name, "c", "first", b"1") == "delivered"
    park = Settlement(SettleKind.WAIT_SIGNAL, "c", _wait("go", 1), token=claim.token)
    assert await storage.settle(queue_name, W1, [park]) == [True]
    assert (await storage.cancel(queue_name, "c")) == "cancelled"
    assert await _state(storage, queue_name, "c") == "cancelled"
    assert await storage.signal(queue_name, "c", "go", b"2") == "not_found"
    assert await storage.dequeue(queue_name, W1, 1, 0.05, LEASE) == []
    assert await storage.retry_job(queue_name, "c", "t2", reset_steps=True)
    assert await storage.get_signals(queue_name, "c") == [("first", b"1")]  # kept by retry_job
    await storage.remove_job(queue_name, "c")
    await storage.enqueue(queue_name, [job("c", token="t3")])
    assert await storage.get_signals(queue_name, "c") == []  # a new incarnation: an empty mailbox


# -- through the Queue ---------------------------------------------------------------------


async def test_a_signal_sent_before_the_wait_is_returned_without_parking(storage: Storage, queue_name: str) -> None:
    started = trio.Event()
    go_on = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        started.set()
        await go_on.wait()
        return await job.wait_for_signal("approve")

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        await q.enqueue("e", None)
        with trio.fail_after(20):
            await started.wait()
            assert await q.signal("e", "approve", {"by": "ann"}) == "delivered"
            go_on.set()
            assert await _wait_result(q, "e") == {"by": "ann"}
        status = await q.get_status("e")
        assert status is not None and status.attempts == 1
        assert status.steps == {}  # the wait's internal steps are not listed


async def test_a_wait_parks_without_a_slot_and_a_later_signal_resumes_it(storage: Storage, queue_name: str) -> None:
    """Steps before the wait run once; while it waits, the job holds no slot (another job
    runs at concurrency 1) and uses no attempt; a signal from elsewhere resumes it."""
    seen = Seen()
    runs: list[int] = []

    async def handler(job: Job[Any]) -> Any:
        if job.id == "other":
            seen.mark("other ran")
            return "other"
        runs.append(job.attempts)
        charged = await job.step("charge", lambda: seen.mark("charged") or 10)
        seen.mark(f"waiting {len(runs)}")
        approval = await job.wait_for_signal("approve")
        return [charged, approval]

    q = Queue(storage, name=queue_name, handler=handler, concurrency=1, **FAST)
    parked = Recorder()
    q.on("waiting_signal", parked)
    async with q:
        await q.enqueue("o", None)
        with trio.fail_after(20):
            await seen.event("waiting 1").wait()
            await parked.wait_for("waiting_signal", "o")
            status = await q.get_status("o")
            assert status is not None and status.attempts == 0
            assert (await q.counts())[JobState.WAITING_SIGNAL] == 1
            page = await q.list_jobs(JobState.WAITING_SIGNAL)
            assert [s.id for s in page.jobs] == ["o"]
            assert await q.enqueue_and_wait("other", None) == "other"  # the slot is free
            async with Queue(twin(storage), name=queue_name) as sender:  # another connection
                assert await sender.signal("o", "approve", "yes") == "delivered"
            assert await _wait_result(q, "o") == [10, "yes"]
    assert seen.log.count("charged") == 1
    assert runs == [1, 1]  # the wait used no attempt


async def _wait_result(q: Queue[Any], job_id: str) -> Any:
    async with q.events() as events:
        status = await q.get_status(job_id)
        if status is None or not status.state.terminal:
            async for ev in events:
                if ev.job_id == job_id and ev.name in ("completed", "failed", "cancelled"):
                    break
    status = await q.get_status(job_id)
    assert status is not None and status.state is JobState.COMPLETED, status
    return status.result


async def test_a_resumed_wait_takes_its_message_from_the_mailbox_and_writes_no_step(
    storage: Storage, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mailbox only grows while the job lives, so the k-th message is the same on
    every run: a wait that finds it writes nothing (the run a signal resumes pays no
    write of its own), and a later run returns the same payloads, in order."""
    assert isinstance(storage, Signals)
    saved: list[str] = []
    inner = storage.save_step

    async def counted(queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        saved.append(name)
        return await inner(queue, worker_id, job_id, token, name, value)

    monkeypatch.setattr(storage, "save_step", counted)
    attempts: list[int] = []

    async def handler(job: Job[Any]) -> Any:
        first = await job.wait_for_signal("go")
        second = await job.wait_for_signal("go")
        attempts.append(job.attempts)
        if job.attempts == 1:
            raise ValueError("the rerun replays both waits")
        return [first, second]

    async with Queue(storage, name=queue_name, handler=handler, max_attempts=2, **FAST) as q:
        parked = Recorder()
        q.on("waiting_signal", parked)
        await q.enqueue("m", None)
        with trio.fail_after(20):
            await parked.wait_for("waiting_signal", "m")
            assert await q.signal("m", "go", 1) == "delivered"
            await parked.wait_for("waiting_signal", "m", count=2)
            assert await q.signal("m", "go", 2) == "delivered"
            assert await _wait_result(q, "m") == [1, 2]
    assert attempts == [1, 2]
    assert saved == []


async def test_two_waits_on_one_name_take_two_messages_in_order(storage: Storage, queue_name: str) -> None:
    seen = Seen()

    async def handler(job: Job[Any]) -> Any:
        first = await job.wait_for_signal("item")
        seen.mark("first")
        second = await job.wait_for_signal("item")
        other = await job.wait_for_signal("done")
        return [first, second, other]

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        await q.enqueue("t", None)
        with trio.fail_after(20):
            assert await q.signal("t", "item", 1) == "delivered"
            await seen.event("first").wait()
            assert await q.signal("t", "item", 2) == "delivered"
            assert await q.signal("t", "done", None) == "delivered"
            assert await _wait_result(q, "t") == [1, 2, None]


async def test_a_wait_times_out_with_signal_timeout_error_on_the_rerun(storage: Storage, queue_name: str) -> None:
    seen: list[Any] = []

    async def handler(job: Job[Any]) -> Any:
        try:
            return await job.wait_for_signal("approve", timeout=0.2)
        except SignalTimeoutError as exc:
            seen.append((exc.job_id, exc.name, exc.timeout))
            return "timed out"

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        await q.enqueue("l", None)
        with trio.fail_after(30):
            assert await _wait_result(q, "l") == "timed out"
    assert seen == [("l", "approve", 0.2)]


async def test_signal_to_an_unknown_or_completed_job_is_not_found(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> str:
        return "done"

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        assert await q.signal("nobody", "go") == "not_found"
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("d", None) == "done"
        assert await q.signal("d", "go", [1]) == "not_found"
        with pytest.raises(ValidationError, match="'d'"):
            await q.signal("d", "go", object())
        with pytest.raises(ValidationError, match="'x'"):
            await q.signal("x", "go", {"nan": float("nan")})


async def test_cancel_a_job_waiting_for_a_signal(storage: Storage, queue_name: str) -> None:
    seen = Seen()

    async def handler(job: Job[Any]) -> Any:
        seen.mark("waiting")
        return await job.wait_for_signal("approve")

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    parked = Recorder()
    q.on("waiting_signal", parked)
    async with q:
        await q.enqueue("c", None)
        with trio.fail_after(20):
            await seen.event("waiting").wait()
            await parked.wait_for("waiting_signal", "c")
        result = await q.cancel("c")
        assert result.status == "cancelled"
        assert (await q.get_status("c")).state is JobState.CANCELLED  # type: ignore[union-attr]
        assert await q.signal("c", "approve") == "not_found"


async def test_a_three_day_timeout_passes_on_the_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    """MemoryStorage under a MockClock: the wait parks for three virtual days, then the
    rerun raises SignalTimeoutError; a second job gets its signal after a day."""
    from trioqueue import MemoryStorage, Reaper

    day = 24 * 3600.0
    slow = {"visibility_timeout": 3600.0, "block_timeout": 3600.0, "reaper": False}
    ran: list[tuple[str, float]] = []

    async def handler(job: Job[Any]) -> Any:
        ran.append((job.id, trio.current_time()))
        try:
            return await job.wait_for_signal("approve", timeout=3 * day)
        except SignalTimeoutError:
            return "timed out"

    start = trio.current_time()
    storage = MemoryStorage()
    async with Reaper(storage, visibility_timeout=3600.0, scan_interval=360.0, scheduler=False), Queue(storage, handler=handler, **slow) as q:
        await q.enqueue("slow", None)
        await q.enqueue("answered", None)
        with trio.fail_after(4 * day):
            await trio.sleep(day)
            assert await q.signal("answered", "approve", "ok") == "delivered"
            assert await _wait_result(q, "answered") == "ok"
            assert await _wait_result(q, "slow") == "timed out"
    runs = [t - start for jid, t in ran if jid == "slow"]
    assert len(runs) == 2 and 3 * day - 1 <= runs[1] < 3 * day + 60  # (the deadline is kept in ms)
