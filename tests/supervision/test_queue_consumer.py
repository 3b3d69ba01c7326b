"""Storage conformance suite, part 2 (continued): the consumer side of a Queue.

How handlers run: retries and their delay, job timeouts, sync handlers in a thread, the
``execute`` decorator, ``after_execution``, the concurrency limit, lifecycle events and
callbacks, undecodable payloads, unencodable results and a custom serde. Every backend.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import trio

from trioqueue import ExecutionContext, Job, JobFailedError, Queue, QueueEvent, Storage
from trioqueue.storage import NewJob

from queue_helpers import FAST, echo
from support import Recorder


async def test_retries_until_success_with_events(storage: Storage, queue_name: str) -> None:
    attempts: list[int] = []
    recorder = Recorder()

    async def flaky(job: Job[Any]) -> str:
        attempts.append(job.attempts)
        if job.attempts < 3:
            raise RuntimeError(f"attempt {job.attempts}")
        return "finally"

    q = Queue(storage, name=queue_name, handler=flaky, max_attempts=3, **FAST)
    for name in ("enqueued", "failing", "requeued", "completed"):
        q.on(name, recorder)
    async with q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("flaky", None) == "finally"
            await recorder.wait_for("completed", "flaky")
    assert attempts == [1, 2, 3]
    counts = Counter(e.name for e in recorder.events)
    assert counts["enqueued"] == 1 and counts["failing"] == 2 and counts["completed"] == 1
    assert counts["requeued"] == 2


async def test_retry_delay_is_honoured(storage: Storage, queue_name: str) -> None:
    times: list[float] = []

    async def flaky(job: Job[Any]) -> None:
        times.append(trio.current_time())
        if job.attempts == 1:
            raise RuntimeError("later")

    async with Queue(storage, name=queue_name, handler=flaky, retry_delay=lambda n: 0.3, block_timeout=0.5) as q:
        with trio.fail_after(10):
            await q.enqueue_and_wait("d", None)
    assert len(times) == 2 and times[1] - times[0] >= 0.29


async def test_job_timeout_counts_as_failed_attempt(storage: Storage, queue_name: str) -> None:
    async def slow(job: Job[Any]) -> str:
        if job.attempts == 1:
            await trio.sleep(30)
        return "second time lucky"

    async with Queue(storage, name=queue_name, handler=slow, job_timeout=0.2, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("t", None) == "second time lucky"
        status = await q.get_status("t")
        assert status is not None and status.attempts == 2

    async with Queue(storage, name=queue_name, handler=slow, job_timeout=0.1, max_attempts=1, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("t2", None)
        assert info.value.error.type == "JobTimeoutError"


async def test_sync_handler_runs_in_a_thread(storage: Storage, queue_name: str) -> None:
    main_thread = threading.get_ident()

    def blocking(job: Job[Any]) -> int:
        return threading.get_ident()

    async with Queue(storage, name=queue_name, handler=blocking, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("s", None) != main_thread


async def test_execute_decorator_and_handler_errors_do_not_stop_the_queue(storage: Storage, queue_name: str) -> None:
    q = Queue(storage, name=queue_name, max_attempts=1, concurrency=2, **FAST)

    @q.execute
    async def handler(job: Job[Any]) -> Any:
        if job.payload == "bad":
            raise ZeroDivisionError("x")
        return job.payload

    async with q:
        with trio.fail_after(10):
            for i in range(5):
                with pytest.raises(JobFailedError):
                    await q.enqueue_and_wait(f"bad-{i}", "bad")
            assert await q.enqueue_and_wait("good", "fine") == "fine"


async def test_after_execution_can_change_the_outcome(storage: Storage, queue_name: str) -> None:
    contexts: list[ExecutionContext] = []

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "fail":
            raise ValueError("nope")
        return job.payload

    async def after(ctx: ExecutionContext) -> None:
        contexts.append(ctx)
        if ctx.job.payload == "fail":
            ctx.error, ctx.result = None, "rescued"
        elif ctx.job.payload == "shortlived":
            ctx.ttl = 0.2
        else:
            ctx.result = {"wrapped": ctx.result}

    async with Queue(storage, name=queue_name, handler=handler, after_execution=after, max_attempts=2, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("a", "plain") == {"wrapped": "plain"}
            assert await q.enqueue_and_wait("b", "fail") == "rescued"
            assert await q.enqueue_and_wait("c", "shortlived") == "shortlived"
        await trio.sleep(0.4)
        assert await q.get_status("c") is None
    # Called once per job, after the *last* attempt (b failed twice first).
    assert [c.job.id for c in contexts] == ["a", "b", "c"]
    assert contexts[1].job.attempts == 2


async def test_concurrency_limit_and_throughput_of_many_jobs(storage: Storage, queue_name: str) -> None:
    running = 0
    peak = 0
    done = Counter[str]()
    finished = trio.Event()
    total = 300

    async def handler(job: Job[Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(0.001)
        running -= 1
        done[job.id] += 1
        if len(done) == total:
            finished.set()

    async with Queue(storage, name=queue_name, handler=handler, concurrency=7, **FAST) as q:
        await q.enqueue_many([(f"m{i}", i) for i in range(total)])
        with trio.fail_after(30):
            await finished.wait()
    assert peak == 7
    assert set(done.values()) == {1}


async def test_lifecycle_events_and_async_callbacks(storage: Storage, queue_name: str) -> None:
    seen: list[str] = []
    completed_seen = trio.Event()

    async def async_cb(ev: QueueEvent) -> None:
        await trio.lowlevel.checkpoint()
        seen.append(f"async:{ev.name}")
        if ev.name == "completed":
            completed_seen.set()

    def broken(ev: QueueEvent) -> None:
        raise RuntimeError("callback bug")

    errors = Recorder()
    q = Queue(storage, name=queue_name, handler=echo, **FAST)
    q.on("started", async_cb)
    q.on("completed", async_cb)
    q.on("completed", broken)
    q.on("stopped", lambda ev: seen.append("stopped"))
    q.on("error", errors)
    async with q:
        with trio.fail_after(10):
            await q.enqueue_and_wait("e", 1)
            await completed_seen.wait()
            await errors.wait_for("error")
    assert seen == ["async:started", "async:completed", "stopped"]
    assert errors.events[0].data["where"] == "completed callback"


async def test_failed_event_after_last_attempt(storage: Storage, queue_name: str) -> None:
    failed = Recorder()

    async def bad(job: Job[Any]) -> None:
        raise OSError("disk")

    q = Queue(storage, name=queue_name, handler=bad, max_attempts=1, **FAST)
    q.on("failed", failed)
    async with q:
        with trio.fail_after(10), pytest.raises(JobFailedError):
            await q.enqueue_and_wait("x", 1)
        with trio.fail_after(10):
            await failed.wait_for("failed", "x")
    [event] = failed.events
    assert event.job_id == "x" and event.data["error"].type == "OSError"


async def test_undecodable_payload_fails_without_retry(storage: Storage, queue_name: str) -> None:
    from trioqueue._core import encode_envelope

    env = encode_envelope("garbled", b"\xff not json", 0, 0, 3, 60_000)
    await storage.enqueue(queue_name, [NewJob("garbled", env, 3, 60.0)])
    async with Queue(storage, name=queue_name, handler=echo, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("garbled", None)
        assert info.value.error.type == "PayloadDecodeError"
        assert (await q.get_status("garbled")).attempts == 1


async def test_a_result_the_serde_cannot_encode_fails_the_job_at_once(storage: Storage, queue_name: str) -> None:
    """It would never encode: no retry, whatever attempts are left; the error names the
    job and the type of the result (a sync handler's, in a thread, too; and a serde that
    returns something other than bytes)."""

    class NotBytes:
        def dumps(self, value: Any) -> Any:
            return "text"

        def loads(self, data: bytes) -> Any:
            return data

    def sync_bad_result(job: Job[Any]) -> Any:
        return {1, 2}  # not JSON

    async with (
        Queue(storage, name=queue_name, handler=sync_bad_result, max_attempts=3, **FAST) as q,
        Queue(storage, name=f"{queue_name}-s", handler=echo, result_serde=NotBytes(), max_attempts=3, **FAST) as s,
    ):
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("r", None)
        error = info.value.error
        assert error.type == "ResultEncodeError"
        assert "result of job 'r' (a set) cannot be encoded by JsonSerde" in error.message
        assert (await q.get_status("r")).attempts == 1
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await s.enqueue_and_wait("n", None)
        error = info.value.error
        assert error.type == "ResultEncodeError"
        assert "result of job 'n' (a dict): NotBytes.dumps returned str, not bytes" in error.message
        assert (await s.get_status("n")).attempts == 1


async def test_custom_serde(storage: Storage, queue_name: str) -> None:
    import pickle

    class PickleSerde:
        def dumps(self, value: Any) -> bytes:
            return pickle.dumps(value)

        def loads(self, data: bytes) -> Any:
            return pickle.loads(data)

    async def handler(job: Job[Any]) -> Any:
        return (job.payload, frozenset({1}))

    async with Queue(storage, name=queue_name, handler=handler, payload_serde=PickleSerde(), **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("p", {"set": {1, 2}}) == ({"set": {1, 2}}, frozenset({1}))
