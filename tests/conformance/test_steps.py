"""Steps of durable jobs (``Job.step``) and resuming from the failed step (conformance:
every backend with the Steps capability). Issue 34, items 1 and 2."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import Job, JobFailedError, JobState, Queue, Storage, TrioQueueError
from trioqueue.storage import Administration, Settlement, SettleKind, Steps
from trioqueue.testing import FaultPlan, FaultyStorage

from storage_helpers import LEASE, W1, W2, job
from support import Recorder

pytestmark = pytest.mark.capability("Steps")

FAST = {"retry_delay": 0, "block_timeout": 0.5}


class Calls:
    """How many times each step's function ran."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def sync(self, name: str, value: Any) -> Any:
        self.counts[name] = self.counts.get(name, 0) + 1
        return value

    async def async_(self, name: str, value: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return self.sync(name, value)


# -- the storage ---------------------------------------------------------------------------


async def test_save_step_is_fenced_by_the_claim_token(storage: Storage, queue_name: str) -> None:
    """Only the holder of the current claim stores a step; the steps come back in the
    order they were saved; a name stored twice keeps its first value."""
    assert isinstance(storage, Steps)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.get_steps(queue_name, "s") == {}
    assert await storage.save_step(queue_name, W1, "s", claim.token, "b", b"2")
    assert await storage.save_step(queue_name, W1, "s", claim.token, "a", b"1")
    assert not await storage.save_step(queue_name, W1, "s", "not-the-claim", "c", b"3")
    assert not await storage.save_step(queue_name, W2, "s", claim.token, "c", b"3")
    assert not await storage.save_step(queue_name, W1, "unknown", claim.token, "c", b"3")
    assert await storage.save_step(queue_name, W1, "s", claim.token, "a", b"again")  # (a retried save)
    assert list((await storage.get_steps(queue_name, "s")).items()) == [("b", b"2"), ("a", b"1")]
    done = Settlement(SettleKind.COMPLETE, "s", b"1", 60, token=claim.token)
    assert await storage.settle(queue_name, W1, [done]) == [True]
    assert not await storage.save_step(queue_name, W1, "s", claim.token, "late", b"4")  # settled: not held
    assert list(await storage.get_steps(queue_name, "s")) == ["b", "a"]  # kept with the completed job
    assert await storage.get_steps(queue_name, "unknown") == {}


async def test_concurrent_saves_of_many_jobs_are_each_fenced_by_their_own_claim(storage: Storage, queue_name: str) -> None:
    """Saves of many jobs at once (Redis and PostgreSQL send the concurrent saves of a queue
    together): each is stored or refused by its own claim, a job's saves keep their order,
    and two saves of one job at once are both stored."""
    assert isinstance(storage, Steps)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job(f"c{i}") for i in range(24)])
    claims = []
    while len(claims) < 24:
        claims += await storage.dequeue(queue_name, W1, 24 - len(claims), 0.05, LEASE)
    claims.sort(key=lambda c: int(c.id[1:]))
    refused: list[tuple[str, int]] = []

    async def save_three(i: int) -> None:
        c = claims[i]
        worker, token = [(W1, c.token), (W2, c.token), (W1, "stale")][i % 3]  # held, another worker, a stale claim
        for k in range(3):
            if not await storage.save_step(queue_name, worker, c.id, token, f"s{k}", b"%d" % k):
                refused.append((c.id, k))

    async def save_one(i: int, name: str) -> None:
        assert await storage.save_step(queue_name, W1, claims[i].id, claims[i].token, name, name.encode())

    async with trio.open_nursery() as nursery:
        for i in range(21):
            nursery.start_soon(save_three, i)
        for i in range(21, 24):
            nursery.start_soon(save_one, i, "x")
            nursery.start_soon(save_one, i, "y")
    assert sorted(refused) == sorted((f"c{i}", k) for i in range(21) if i % 3 for k in range(3))
    for i in range(21):
        expected = [("s0", b"0"), ("s1", b"1"), ("s2", b"2")] if i % 3 == 0 else []
        assert list((await storage.get_steps(queue_name, f"c{i}")).items()) == expected, f"c{i}"
    for i in range(21, 24):
        assert await storage.get_steps(queue_name, f"c{i}") == {"x": b"x", "y": b"y"}, f"c{i}"


async def test_retry_job_keeps_steps_unless_reset_and_a_new_incarnation_has_none(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Steps) and isinstance(storage, Administration)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("r", max_attempts=1)])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "a", b"1")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.FAIL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.retry_job(queue_name, "r", "t2")
    assert await storage.get_steps(queue_name, "r") == {"a": b"1"}
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "b", b"2")  # the new claim stores
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.FAIL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.get_steps(queue_name, "r") == {"a": b"1", "b": b"2"}
    assert await storage.retry_job(queue_name, "r", "t3", reset_steps=True)
    assert await storage.get_steps(queue_name, "r") == {}
    # cancelled, then enqueued again: a new incarnation starts with no steps
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "c", b"3")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.CANCEL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.get_steps(queue_name, "r") == {"c": b"3"}
    await storage.enqueue(queue_name, [job("r", token="t4")])
    assert await storage.get_steps(queue_name, "r") == {}
    # removed (forgotten), then enqueued again: none either
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "d", b"4")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.remove_job(queue_name, "r")
    assert await storage.get_steps(queue_name, "r") == {}
    await storage.enqueue(queue_name, [job("r", token="t5")])
    assert await storage.get_steps(queue_name, "r") == {}


# -- through the Queue ---------------------------------------------------------------------


async def test_steps_run_once_across_a_retry_after_an_exception(storage: Storage, queue_name: str) -> None:
    """Async and sync step functions; the first attempt fails after two steps, the
    second returns their stored values without running them and goes on."""
    calls = Calls()
    seen: list[tuple[int, Any, Any]] = []

    async def handler(job: Job[Any]) -> str:
        a = await job.step("charge", calls.async_, "charge", {"paid": 10})
        b = await job.step("reserve", calls.sync, "reserve", [1, 2])
        seen.append((job.attempts, a, b))
        if job.attempts == 1:
            raise RuntimeError("the mail server is down")
        c = await job.step("mail", calls.sync, "mail", "sent")
        return f"{a['paid']}-{c}"

    q = Queue(storage, name=queue_name, handler=handler, max_attempts=3, **FAST)
    async with q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("order", None) == "10-sent"
    assert calls.counts == {"charge": 1, "reserve": 1, "mail": 1}
    assert seen == [(1, {"paid": 10}, [1, 2]), (2, {"paid": 10}, [1, 2])]


async def test_steps_run_once_across_a_recovery_after_the_lease_is_lost(storage: Storage, queue_name: str) -> None:
    """Heartbeats fail after the first step: the worker gives the claim up (the handler
    is cancelled), the reaper puts the job back, and the next run finds the step stored."""
    faulty = FaultyStorage(storage, FaultPlan(fail_before=1.0, methods=frozenset({"heartbeat"})))
    faulty.enabled = False
    calls = Calls()

    async def handler(job: Job[Any]) -> int:
        value = await job.step("first", calls.sync, "first", 1)
        if job.attempts == 1:
            faulty.enabled = True  # no more heartbeats: the lease runs out
            await trio.sleep_forever()  # cancelled by the lost lease
        return value + await job.step("second", calls.sync, "second", 2)

    events = Recorder()
    q = Queue(faulty, name=queue_name, handler=handler, visibility_timeout=0.5, **FAST)
    q.on("lease_lost", events)
    q.on("requeued", events)
    async with q:
        await q.enqueue("j", None)
        with trio.fail_after(20):
            await events.wait_for("lease_lost", "j")
            await events.wait_for("requeued", "j")
            faulty.enabled = False
            assert await q.enqueue_and_wait("j", None) == 3
    assert calls.counts == {"first": 1, "second": 1}


async def test_a_fenced_step_save_is_refused_and_cancels_the_handler(storage: Storage, queue_name: str) -> None:
    """The job's claim is taken away while its handler runs (the queue is cleared): the
    next step's save is refused by the storage, nothing is stored, the handler is
    cancelled as on a lost lease (``lease_lost``, why ``fenced``)."""
    assert isinstance(storage, Administration)
    calls = Calls()
    reached_after = False
    cleared = trio.Event()
    ended = trio.Event()

    async def handler(job: Job[Any]) -> None:
        nonlocal reached_after
        try:
            await job.step("first", calls.sync, "first", 1)
            await storage.clear(queue_name)
            cleared.set()
            await job.step("second", calls.sync, "second", 2)
            reached_after = True
        finally:
            ended.set()

    events = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, visibility_timeout=30, **FAST)
    q.on("lease_lost", events)
    async with q:
        await q.enqueue("j", None)
        with trio.fail_after(20):
            await cleared.wait()
            await events.wait_for("lease_lost", "j")
            await ended.wait()
    assert not reached_after and calls.counts == {"first": 1, "second": 1}
    assert [e.data["why"] for e in events.events] == ["fenced"]
    assert await storage.get_steps(queue_name, "j") == {}


async def test_a_step_name_used_twice_returns_the_first_value(storage: Storage, queue_name: str) -> None:
    calls = Calls()

    async def handler(job: Job[Any]) -> list[Any]:
        return [await job.step("x", calls.sync, "x1", "first"), await job.step("x", calls.sync, "x2", "second")]

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("j", None) == ["first", "first"]
        status = await q.get_status("j")
    assert calls.counts == {"x1": 1}
    assert status is not None and status.steps == {"x": "first"}


async def test_an_exception_in_a_step_stores_nothing_and_propagates(storage: Storage, queue_name: str) -> None:
    calls = Calls()
    caught: list[str] = []

    async def flaky(n: int) -> int:
        calls.sync("flaky", None)
        if calls.counts["flaky"] == 1:
            raise ValueError("not yet")
        return n

    async def handler(job: Job[Any]) -> int:
        try:
            return int(await job.step("flaky", flaky, 7))
        except ValueError as exc:
            caught.append(str(exc))
            raise

    q = Queue(storage, name=queue_name, handler=handler, max_attempts=2, **FAST)
    async with q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("j", None) == 7
    assert caught == ["not yet"] and calls.counts == {"flaky": 2}


async def test_job_status_lists_the_steps_in_order(storage: Storage, queue_name: str) -> None:
    stepped = trio.Event()
    proceed = trio.Event()

    async def handler(job: Job[Any]) -> None:
        for name, value in (("zeta", 1), ("alpha", {"k": "v"}), ("mid", None)):
            await job.step(name, lambda v: v, value)
        stepped.set()
        await proceed.wait()

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        await q.enqueue("j", None)
        with trio.fail_after(20):
            await stepped.wait()
            running = await q.get_status("j")
            proceed.set()
            await q.enqueue_and_wait("j", None)
        done = await q.get_status("j")
        [listed] = (await q.list_jobs(JobState.COMPLETED)).jobs
    assert running is not None and running.state is JobState.PROCESSING
    assert list(running.steps.items()) == [("zeta", 1), ("alpha", {"k": "v"}), ("mid", None)]  # type: ignore[union-attr]
    assert done is not None and done.steps == running.steps
    assert listed.steps is None  # (a listing does not read them)


async def test_queue_retry_resumes_after_the_last_step_unless_reset(storage: Storage, queue_name: str) -> None:
    calls = Calls()
    fail = True

    async def handler(job: Job[Any]) -> str:
        a = await job.step("a", calls.sync, "a", "A")
        if fail:
            raise RuntimeError("down")
        b = await job.step("b", calls.sync, "b", "B")
        return a + b

    q = Queue(storage, name=queue_name, handler=handler, max_attempts=1, **FAST)
    async with q:
        with trio.fail_after(20):
            with pytest.raises(JobFailedError, match="down"):
                await q.enqueue_and_wait("j", None)
            fail = False
            assert await q.retry("j")
            assert await q.enqueue_and_wait("j", None) == "AB"
            assert calls.counts == {"a": 1, "b": 1}  # resumed after "a"
            fail = True
            with pytest.raises(JobFailedError, match="down"):
                await q.enqueue_and_wait("k", None)
            fail = False
            assert await q.retry("k", reset_steps=True)
            assert await q.enqueue_and_wait("k", None) == "AB"
            assert calls.counts == {"a": 3, "b": 2}  # started over: "a" ran again


async def test_a_new_incarnation_starts_with_no_steps(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Administration)
    calls = Calls()

    async def handler(job: Job[Any]) -> Any:
        return await job.step("a", calls.sync, "a", job.payload)

    q = Queue(storage, name=queue_name, handler=handler, **FAST)
    async with q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("j", 1) == 1
            assert await q.remove("j")  # forgotten: the id is free
            assert await q.enqueue_and_wait("j", 2) == 2
    assert calls.counts == {"a": 2}


async def test_step_outside_the_handler_is_refused(storage_free_memory: Storage) -> None:
    job: Job[None] = Job("x", None, 1, 3, 0.0, "w")
    with pytest.raises(TrioQueueError, match="step for job 'x' called outside that job's"):
        await job.step("s", lambda: 1)
    with pytest.raises(TypeError, match="step name of job 'x' must be a string"):
        await job.step(1, lambda: 1)  # type: ignore[arg-type]


async def test_a_thread_handler_takes_steps_through_from_thread(queue_name: str) -> None:
    """A sync handler in a thread calls ``trio.from_thread.run(job.step, ...)``; a sync
    step function then runs in a thread too."""
    from trioqueue import MemoryStorage

    calls = Calls()
    threads: list[bool] = []

    def in_thread(value: int) -> int:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            threads.append(True)
        else:
            threads.append(False)
        return calls.sync("t", value)

    def handler(job: Job[Any]) -> int:
        first = trio.from_thread.run(job.step, "t", in_thread, 5)
        again = trio.from_thread.run(job.step, "t", in_thread, 6)
        return int(first) + int(again)

    async with MemoryStorage() as storage:
        q = Queue(storage, name=queue_name, handler=handler, executor="thread", **FAST)
        async with q:
            with trio.fail_after(20):
                assert await q.enqueue_and_wait("j", None) == 10
    assert calls.counts == {"t": 1} and threads == [True]
