"""Durable sleep (``Job.sleep``, ``Job.sleep_until``; conformance: every backend with the
Steps capability). Issue 34, item 3.

On MemoryStorage the Queue tests run under Trio's virtual clock (the ``clock`` fixture:
a ``MockClock`` with ``autojump_threshold=0``), so their sleeps last days and take no
real time; on the other backends they sleep a fraction of a second, awaited through
events (no timed assertion).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, JobState, Queue, Storage, TrioQueueError, ValidationError, WaitForChildren
from trioqueue._model import _clock
from trioqueue.storage import Settlement, SettleKind

from storage_helpers import LEASE, W1, job
from support import Recorder

pytestmark = pytest.mark.capability("Steps")

DAY = 86400.0


@pytest.fixture
def clock(backend: str) -> trio.testing.MockClock | None:
    """Trio's virtual clock where the backend is memory (its time is the run's clock)."""
    return trio.testing.MockClock(autojump_threshold=0) if backend == "memory" else None


def nap(backend: str) -> float:
    """How long the Queue tests sleep: three days of virtual time, or 0.2 s of real time."""
    return 3 * DAY if backend == "memory" else 0.2


def settings(backend: str) -> dict[str, Any]:
    """Queue options: under the virtual clock, no reaper nor scheduler (each wakes every
    virtual second, which costs real time over days) and long leases and claim waits."""
    if backend == "memory":
        return {"reaper": False, "visibility_timeout": 3600.0, "block_timeout": 3600.0, "retry_delay": 0}
    return {"retry_delay": 0, "block_timeout": 0.5}


def limit(backend: str) -> float:
    return 10 * DAY if backend == "memory" else 30.0


# -- the storage ---------------------------------------------------------------------------


async def test_a_sleep_settlement_delays_the_job_without_an_attempt_nor_a_hold(storage: Storage, queue_name: str) -> None:
    """``SettleKind.SLEEP``: ``delayed`` until due, the attempt refunded; unlike
    ``RATE_LIMITED`` the queue's other jobs are claimed at once. A cancel ends it."""
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s"), job("other")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert claim.id == "s"
    asleep = Settlement(SettleKind.SLEEP, "s", b"", delay=60.0, token=claim.token)
    assert await storage.settle(queue_name, W1, [asleep]) == [True]
    record = await storage.get_job(queue_name, "s")
    assert record is not None and record.state.startswith("delayed:") and record.attempts == 0
    [other] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)  # no hold of the queue's claims
    assert other.id == "other"
    assert await storage.settle(queue_name, W1, [asleep]) == [True]  # a retried call: answered, nothing changes
    assert (await storage.get_job(queue_name, "s")).state.startswith("delayed:")  # type: ignore[union-attr]
    assert await storage.cancel(queue_name, "s") == "cancelled"
    assert (await storage.get_job(queue_name, "s")).state.startswith("cancelled:")  # type: ignore[union-attr]


async def test_a_cancel_request_ends_a_sleeping_claim_cancelled(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.cancel(queue_name, "s") == "cancelled"  # it runs: a cancel request
    asleep = Settlement(SettleKind.SLEEP, "s", b"", delay=60.0, token=claim.token)
    assert await storage.settle(queue_name, W1, [asleep]) == [True]
    assert (await storage.get_job(queue_name, "s")).state.startswith("cancelled:")  # type: ignore[union-attr]


async def test_a_due_sleep_settlement_is_claimed_again(storage: Storage, queue_name: str) -> None:
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.SLEEP, "s", b"", delay=0.0, token=claim.token)]) == [True]
    with trio.fail_after(10):
        claims: list[Any] = []
        while not claims:
            claims = await storage.dequeue(queue_name, W1, 1, 1.0, LEASE)
    assert claims[0].id == "s" and claims[0].attempts == 1  # the sleeping run used no attempt


# -- through the Queue ---------------------------------------------------------------------


async def test_a_sleeping_job_holds_no_slot_and_resumes_after_its_steps(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    """The steps before the sleep run once; while it sleeps the job is ``delayed`` with
    its attempts unchanged and another job runs (concurrency 1); it then completes with
    the earlier steps' stored values. ``except Exception`` does not swallow the sleep."""
    calls: list[str] = []
    swallowed: list[BaseException] = []
    seen: dict[str, Any] = {}
    runs: list[int] = []

    def charge() -> dict[str, int]:
        calls.append("charge")
        return {"paid": 10}

    async def handler(job: Job[Any]) -> Any:
        if job.id == "other":
            status = await q.get_status("sleeper")
            assert status is not None
            seen["state"], seen["attempts"] = status.state, status.attempts
            return "ran"
        runs.append(job.attempts)
        paid = await job.step("charge", charge)
        try:
            await job.sleep("wait", nap(backend))
        except Exception as exc:  # noqa: BLE001 - what the test is about
            swallowed.append(exc)
        return paid["paid"]

    events = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, concurrency=1, **settings(backend))
    q.on("sleeping", events)
    q.on("completed", events)
    async with q:
        with trio.fail_after(limit(backend)):
            start = _clock.now()
            await q.enqueue("sleeper", None)
            await events.wait_for("sleeping", "sleeper")
            await q.enqueue("other", None)
            await events.wait_for("completed", "other")
            await events.wait_for("completed", "sleeper")
        assert _clock.now() - start >= nap(backend)
        status = await q.get_status("sleeper")
    assert seen == {"state": JobState.DELAYED, "attempts": 0}
    assert calls == ["charge"] and swallowed == []
    assert runs == [1, 1]  # the sleeping run did not use an attempt
    assert status is not None and status.state == JobState.COMPLETED and status.result == 10 and status.attempts == 1
    assert status.steps is not None and list(status.steps) == ["charge", "wait"]


async def test_sleep_until_a_datetime_and_a_timestamp(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    woke: list[tuple[str, float]] = []

    async def handler(job: Job[Any]) -> None:
        until = _clock.now() + nap(backend)  # (read again on the second run: only the first is stored)
        if job.payload == "datetime":
            await job.sleep_until("until", datetime.fromtimestamp(until, UTC))
        else:
            await job.sleep_until("until", until)
        woke.append((job.id, _clock.now()))

    q = Queue(storage, name=queue_name, handler=handler, **settings(backend))
    async with q:
        with trio.fail_after(limit(backend)):
            start = _clock.now()
            async with trio.open_nursery() as nursery:
                for kind in ("datetime", "timestamp"):
                    nursery.start_soon(functools.partial(q.enqueue_and_wait, kind, kind, timeout=limit(backend)))
        statuses = await q.get_statuses(["datetime", "timestamp"])
    assert sorted(job_id for job_id, _ in woke) == ["datetime", "timestamp"]
    assert all(at - start >= nap(backend) * 0.99 for _, at in woke)
    assert all(s is not None and s.state == JobState.COMPLETED and s.attempts == 1 for s in statuses)


async def test_an_early_run_sleeps_again_for_the_rest(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    """A run that comes before the wake-up time (here: the sleep's step stored far ahead,
    as a worker whose clock was behind would) does not pass the sleep."""
    passed: list[int] = []

    async def handler(job: Job[Any]) -> None:
        await job.sleep("long", 365 * DAY)
        passed.append(job.attempts)

    events = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, **settings(backend))
    q.on("sleeping", events)
    async with q:
        with trio.fail_after(limit(backend)):
            await q.enqueue("early", None)
            await events.wait_for("sleeping", "early")
            # a cancel, then Queue.retry: runs it again at once, with its steps (an early run)
            assert (await q.cancel("early")).status == "cancelled"
            assert await q.retry("early")
            await events.wait_for("sleeping", "early", count=2)
        status = await q.get_status("early")
    assert passed == []
    assert status is not None and status.state == JobState.DELAYED and status.attempts == 0


async def test_except_exception_does_not_swallow_wait_for_children(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    from trioqueue import Child
    from trioqueue.storage import Trees

    if not isinstance(storage, Trees):
        pytest.skip("no Trees capability")
    swallowed: list[BaseException] = []
    runs: list[str] = []

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "child":
            return "c"
        runs.append(job.id)
        if len(runs) == 1:
            await job.add_children([Child(f"{job.id}-c", "child")])
            try:
                raise WaitForChildren()
            except Exception as exc:  # noqa: BLE001 - what the test is about
                swallowed.append(exc)
            return "too early"
        return await job.children_results()

    q = Queue(storage, name=queue_name, handler=handler, **settings(backend))
    async with q:
        with trio.fail_after(limit(backend)):
            result = await q.enqueue_and_wait("parent", "parent", timeout=limit(backend))
    assert swallowed == [] and runs == ["parent", "parent"] and result == {"parent-c": "c"}


async def test_a_sleeping_job_is_cancelled(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    passed: list[str] = []

    async def handler(job: Job[Any]) -> None:
        await job.sleep("nap", nap(backend))
        passed.append(job.id)

    events = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, **settings(backend))
    q.on("sleeping", events)
    q.on("cancelled", events)
    async with q:
        with trio.fail_after(limit(backend)):
            await q.enqueue("c", None)
            await events.wait_for("sleeping", "c")
            assert (await q.cancel("c")).status == "cancelled"
            await events.wait_for("cancelled", "c")
            status = await q.get_status("c")
            await trio.sleep(2 * nap(backend))  # (past its wake-up time: it does not run)
    assert passed == []
    assert status is not None and status.state == JobState.CANCELLED


async def test_a_cancel_request_during_the_run_that_then_sleeps_ends_cancelled(
    storage: Storage, queue_name: str, backend: str, clock: trio.testing.MockClock | None
) -> None:
    started, requested = trio.Event(), trio.Event()

    async def handler(job: Job[Any]) -> None:
        with trio.CancelScope(shield=True):  # (it goes to sleep although its cancel came)
            started.set()
            await requested.wait()
            await job.sleep("nap", nap(backend))

    events = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, **settings(backend))
    q.on("cancelled", events)
    async with q:
        with trio.fail_after(limit(backend)):
            await q.enqueue("c", None)
            await started.wait()
            assert (await q.cancel("c")).status == "cancelled"
            requested.set()
            await events.wait_for("cancelled", "c")
        status = await q.get_status("c")
    assert status is not None and status.state == JobState.CANCELLED


# -- refusals ------------------------------------------------------------------------------


async def test_bad_sleeps_are_refused_naming_the_job(storage_free_memory: Storage) -> None:
    job_: Job[None] = Job("x", None, 1, 3, 0.0, "w")
    with pytest.raises(ValidationError, match="timezone-aware.*job 'x'"):
        await job_.sleep_until("n", datetime(2030, 1, 1))
    with pytest.raises(ValidationError, match="seconds of sleep 'n'.*job 'x'"):
        await job_.sleep("n", -1)
    with pytest.raises(ValidationError, match="job 'x'"):
        await job_.sleep_until("n", "tomorrow")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sleep name of job 'x'"):
        await job_.sleep(1, 5)  # type: ignore[arg-type]
    with pytest.raises(TrioQueueError, match="sleep for job 'x' called outside"):
        await job_.sleep("n", 5)
    with pytest.raises(TrioQueueError, match="sleep_until for job 'x' called outside"):
        await job_.sleep_until("n", datetime.now(UTC) + timedelta(days=1))


async def test_sleep_in_a_batch_handler_is_refused(queue_name: str) -> None:
    from trioqueue import BatchOutcome, MemoryStorage

    errors: list[BaseException] = []

    async def batch(jobs: list[Job[Any]]) -> BatchOutcome:
        try:
            await jobs[0].sleep("nap", 1)
        except TrioQueueError as exc:
            errors.append(exc)
        return BatchOutcome({j.id: 1 for j in jobs})

    async with MemoryStorage() as storage:
        q = Queue(storage, name=queue_name, batch_handler=batch, batch_size=2, block_timeout=0.5)
        async with q:
            with trio.fail_after(20):
                assert await q.enqueue_and_wait("b", None) == 1
    assert len(errors) == 1 and "not available in a batch handler" in str(errors[0])


async def test_a_thread_handler_sleeps_through_from_thread(queue_name: str) -> None:
    """(Real time: under an autojumping clock, virtual time would jump while the handler's
    thread runs.)"""
    from trioqueue import MemoryStorage

    runs: list[int] = []

    def handler(job: Job[Any]) -> str:
        runs.append(job.attempts)
        trio.from_thread.run(job.sleep, "nap", 0.1)
        return "woke"

    async with MemoryStorage() as storage:
        q = Queue(storage, name=queue_name, handler=handler, executor="thread", block_timeout=0.5)
        async with q:
            with trio.fail_after(20):
                assert await q.enqueue_and_wait("t", None) == "woke"
    assert runs == [1, 1]


async def test_a_sleep_or_a_wait_in_a_task_of_the_handler_suspends_it(
    queue_name: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Raised in a nursery of the handler, the suspension reaches the worker inside an
    exception group: the job sleeps (or waits for its children) all the same."""
    from trioqueue import Child, MemoryStorage

    runs: list[str] = []

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "child":
            return "c"
        runs.append(job.id)
        if runs.count(job.id) > 1:
            return "again"
        async with trio.open_nursery() as nursery:
            if job.id == "sleeper":
                nursery.start_soon(job.sleep, "nap", DAY)
            else:
                await job.add_children([Child(f"{job.id}-c", "child")])

                async def wait() -> None:
                    raise WaitForChildren()

                nursery.start_soon(wait)
        return "too early"

    async with MemoryStorage() as storage:
        q = Queue(storage, name=queue_name, handler=handler, **settings("memory"))
        async with q:
            with trio.fail_after(2 * DAY):
                assert await q.enqueue_and_wait("sleeper", None, timeout=2 * DAY) == "again"
                assert await q.enqueue_and_wait("parent", None, timeout=2 * DAY) == "again"
    assert runs == ["sleeper", "sleeper", "parent", "parent"]


async def test_a_handler_that_swallows_the_sleep_still_sleeps(queue_name: str, autojump_clock: trio.testing.MockClock) -> None:
    """``except BaseException`` catches the sleep's exception; the handler returns (or
    raises something else): the job sleeps all the same, and its next run passes."""
    from trioqueue import MemoryStorage

    runs: list[tuple[str, float]] = []

    async def handler(job: Job[Any]) -> str:
        runs.append((job.id, trio.current_time()))
        try:
            await job.sleep("nap", DAY)
        except BaseException:  # noqa: BLE001 - what the test is about
            if job.id == "raises":
                raise RuntimeError("not a failure: it sleeps") from None
            return "swallowed"
        return "woke"

    async with MemoryStorage() as storage:
        q = Queue(storage, name=queue_name, handler=handler, **settings("memory"))
        async with q:
            with trio.fail_after(3 * DAY):
                start = trio.current_time()
                statuses = []
                for job_id in ("returns", "raises"):
                    assert await q.enqueue_and_wait(job_id, None, timeout=3 * DAY) == "woke"
                    statuses.append(await q.get_status(job_id))
    assert [job_id for job_id, _ in runs] == ["returns", "returns", "raises", "raises"]
    assert runs[1][1] - start >= DAY and runs[3][1] - runs[2][1] >= DAY
    assert [(s.attempts, s.error) for s in statuses if s is not None] == [(1, None), (1, None)]
