"""Error control (conformance, every backend): ``UnrecoverableError``, ``retry_if``,
``Retry(delay=...)`` and per-job ``retry_delay`` / ``job_timeout``.

The queue's own ``retry_delay`` is an hour in these tests: a job that completes on a later
attempt within the test's deadline proves the per-job or per-raise delay was used.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import (
    Job,
    JobFailedError,
    JobState,
    Queue,
    Retry,
    Storage,
    UnrecoverableError,
    ValidationError,
)

from support import Recorder

SLOW_RETRY = {"retry_delay": 3600.0, "block_timeout": 0.5}


class BadInput(UnrecoverableError):
    pass


async def test_unrecoverable_error_fails_at_once(storage: Storage, queue_name: str) -> None:
    calls = 0

    async def handler(job: Job[Any]) -> None:
        nonlocal calls
        calls += 1
        raise BadInput(f"job {job.id}: no such customer")

    async with Queue(storage, name=queue_name, handler=handler, max_attempts=5, **SLOW_RETRY) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("u", None)
        status = await q.get_status("u")
    assert calls == 1
    assert info.value.error.type == "BadInput" and "no such customer" in info.value.error.message
    assert status is not None and status.state is JobState.FAILED and status.attempts == 1


async def test_retry_if_decides_per_exception(storage: Storage, queue_name: str) -> None:
    seen: list[BaseException] = []

    def retry_if(exc: BaseException) -> bool:
        seen.append(exc)
        return not isinstance(exc, KeyError)

    async def handler(job: Job[Any]) -> str:
        if job.attempts == 1:
            raise (KeyError if job.payload == "fatal" else ConnectionError)(job.id)
        return "ok"

    async with Queue(
        storage, name=queue_name, handler=handler, retry_if=retry_if, max_attempts=3, retry_delay=0, block_timeout=0.5
    ) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("transient", "flaky") == "ok"
            with pytest.raises(JobFailedError) as info:
                await q.enqueue_and_wait("fatal", "fatal")
    assert info.value.error.type == "KeyError"
    assert [type(e) for e in seen] == [ConnectionError, KeyError]


async def test_retry_if_that_raises_is_reported_and_the_job_retried(storage: Storage, queue_name: str) -> None:
    def retry_if(exc: BaseException) -> bool:
        raise RuntimeError("bug in retry_if")

    async def handler(job: Job[Any]) -> int:
        if job.attempts == 1:
            raise ValueError("first attempt fails")
        return job.attempts

    errors = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, retry_if=retry_if, retry_delay=0, block_timeout=0.5)
    q.on("error", errors)
    async with q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("r", None) == 2
            await errors.wait_for("error", "r")
    assert "bug in retry_if" in str(errors.events[0].data["error"])


async def test_retry_raised_by_the_handler_uses_its_delay_and_counts_the_attempt(
    storage: Storage, queue_name: str
) -> None:
    async def handler(job: Job[Any]) -> int:
        if job.payload == "always" or job.attempts == 1:
            raise Retry("upstream busy", delay=0.01)
        return job.attempts

    async with Queue(storage, name=queue_name, handler=handler, max_attempts=3, **SLOW_RETRY) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("once", "once") == 2
            with pytest.raises(JobFailedError) as info:
                await q.enqueue_and_wait("always", "always")
        status = await q.get_status("always")
    assert info.value.error.type == "Retry" and info.value.error.message == "upstream busy"
    assert status is not None and status.attempts == 3


async def test_per_job_retry_delay_overrides_the_queue(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> int:
        if job.attempts == 1:
            raise ConnectionError("transient")
        return job.attempts

    async with Queue(storage, name=queue_name, handler=handler, **SLOW_RETRY) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("fast-retry", None, retry_delay=0.01) == 2


async def test_per_job_timeout_overrides_the_queue(storage: Storage, queue_name: str) -> None:
    async def handler(job: Job[Any]) -> int:
        if job.attempts == 1:
            await trio.sleep_forever()
        return job.attempts

    failing = Recorder()
    q = Queue(storage, name=queue_name, handler=handler, retry_delay=0, block_timeout=0.5)  # no queue job_timeout
    q.on("failing", failing)
    async with q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("slow", None, job_timeout=0.05) == 2
    [event] = failing.events
    assert event.data["error"].type == "JobTimeoutError" and "0.05 s" in event.data["error"].message


async def test_error_control_arguments_are_validated(storage_free_memory: Storage) -> None:
    with pytest.raises(ValidationError, match="retry_if must be a callable"):
        Queue(storage_free_memory, retry_if=3)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"Retry.delay must be finite and >= 0, got -1.0"):
        Retry(delay=-1)
    async with Queue(storage_free_memory) as q:
        with pytest.raises(ValidationError, match=r"retry_delay must be finite and >= 0, got -1.0 \(job 'j'\)"):
            await q.enqueue("j", None, retry_delay=-1)
        with pytest.raises(ValidationError, match=r"job_timeout must be finite and > 0, got 0.0 \(job 'j'\)"):
            await q.enqueue("j", None, job_timeout=0)
        assert await q.get_status("j") is None  # nothing written
