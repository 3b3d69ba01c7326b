"""``Queue(executor="process")``: sync handlers in a pool of worker processes (trio-parallel).

The handlers (tests/process_support.py) are real CPU-bound code in real processes; the
ones that loop forever report their pid over a socket, and the end of that connection is
the event that says their process was killed.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import trio

from process_support import (
    Listener,
    alive,
    crunch,
    fail,
    fail_unpicklable,
    progress,
    sleep,
    spin,
    step,
    unencodable,
    until_closed,
    write_late,
)
from support import Recorder
from trioqueue import JobFailedError, JobState, MemoryStorage, Queue, ValidationError

FAST = {"block_timeout": 0.5, "retry_delay": 0}


async def test_a_cpu_bound_handler_runs_in_another_process_and_its_result_crosses() -> None:
    async with Queue(MemoryStorage(), handler=crunch, executor="process", concurrency=2, **FAST) as queue:
        assert queue.processes == 2  # follows concurrency
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                results: list[Any] = []

                async def one(job_id: str) -> None:
                    results.append(await queue.enqueue_and_wait(job_id, 0.2))

                for job_id in ("a", "b"):
                    nursery.start_soon(one, job_id)
    pids = {r["pid"] for r in results}
    assert results[0]["loops"] is True and os.getpid() not in pids
    assert len(pids) == 2  # two at once: two pool processes
    assert not any(alive(pid) for pid in pids)  # the pool closed with its queue


async def test_errors_cross_with_their_type_message_and_traceback() -> None:
    async with MemoryStorage() as storage:
        async with (
            Queue(storage, name="fail", handler=fail, executor="process", max_attempts=1, **FAST) as failing,
            Queue(storage, name="odd", handler=fail_unpicklable, executor="process", max_attempts=1, **FAST) as odd,
            Queue(storage, name="progress", handler=progress, executor="process", max_attempts=1, **FAST) as reporting,
        ):
            with trio.fail_after(30):
                with pytest.raises(JobFailedError) as failed:
                    await failing.enqueue_and_wait("bad", {"n": 1})
                error = failed.value.error
                assert (error.type, error.message) == ("ValueError", "cannot handle {'n': 1}")
                assert "process_support.py" in error.traceback and "in fail" in error.traceback
                with pytest.raises(JobFailedError) as failed:
                    await odd.enqueue_and_wait("odd", None)
                error = failed.value.error
                assert (error.type, error.message) == ("_Unpicklable", "holding a lock for odd")
                assert "in fail_unpicklable" in error.traceback
                with pytest.raises(JobFailedError) as failed:
                    await reporting.enqueue_and_wait("progress", None)
                assert failed.value.error.type == "TrioQueueError"
                assert "not available in a handler running in a process pool" in failed.value.error.message


async def test_a_step_in_a_pool_process_is_refused_with_a_clear_error() -> None:
    async with Queue(MemoryStorage(), handler=step, executor="process", max_attempts=1, **FAST) as queue:
        with trio.fail_after(30), pytest.raises(JobFailedError) as failed:
            await queue.enqueue_and_wait("s", None)
    error = failed.value.error
    assert error.type == "TrioQueueError"
    assert error.message == (
        "step 'charge' of job 's': not available in a handler running in a process pool (executor='process'); "
        "use an async or a thread handler for a job with steps"
    )


async def test_a_sleep_in_a_pool_process_is_refused_with_a_clear_error() -> None:
    async with Queue(MemoryStorage(), handler=sleep, executor="process", max_attempts=1, **FAST) as queue:
        with trio.fail_after(30), pytest.raises(JobFailedError) as failed:
            await queue.enqueue_and_wait("s", None)
    error = failed.value.error
    assert error.type == "TrioQueueError"
    assert error.message == (
        "sleep 'nap' of job 's': not available in a handler running in a process pool (executor='process'); "
        "use an async or a thread handler for a job that sleeps"
    )


async def test_a_result_the_serde_cannot_encode_in_the_pool_process_fails_the_job_at_once() -> None:
    async with Queue(MemoryStorage(), handler=unencodable, executor="process", max_attempts=3, **FAST) as queue:
        with trio.fail_after(30), pytest.raises(JobFailedError) as failed:
            await queue.enqueue_and_wait("set", None)
        error = failed.value.error
        assert error.type == "ResultEncodeError"
        assert "result of job 'set' (a set) cannot be encoded by JsonSerde" in error.message
        assert (await queue.get_status("set")).attempts == 1


async def test_job_timeout_kills_a_handler_that_loops_forever() -> None:
    listener = await Listener.open()
    failed = Recorder()
    async with Queue(MemoryStorage(), handler=spin, executor="process", job_timeout=1.0, max_attempts=1, **FAST) as queue:
        queue.on("failed", failed)
        with trio.fail_after(30):
            # the pool process is started (a loaded machine may take over a second to start
            # it: the warm-up has a timeout of its own), so the queue's 1 s is the loop's
            await queue.enqueue_and_wait("warm-up", None, job_timeout=30.0)
            await queue.enqueue("forever", listener.port)
            pid, conn = await listener.accept()
        began = time.monotonic()
        with trio.fail_after(2.0):  # the timeout (1 s, counted from just before the report) + 1 s
            await until_closed(conn)
            await failed.wait_for("failed", "forever")
        assert time.monotonic() - began < 2.0 and not alive(pid)
        status = await queue.get_status("forever")
        assert status is not None and status.state is JobState.FAILED
        assert status.error is not None and status.error.type == "JobTimeoutError"
    await listener.aclose()


async def test_cancel_kills_the_running_cpu_bound_handler_within_a_second() -> None:
    listener = await Listener.open()
    cancelled = Recorder()
    async with Queue(MemoryStorage(), handler=spin, executor="process", max_attempts=3, **FAST) as queue:
        queue.on("cancelled", cancelled)
        with trio.fail_after(30):
            await queue.enqueue("forever", listener.port)
            pid, conn = await listener.accept()
        with trio.fail_after(1.0):
            await queue.cancel("forever")
            await until_closed(conn)
            await cancelled.wait_for("cancelled", "forever")
        assert not alive(pid)
        status = await queue.get_status("forever")
        assert status is not None and status.state is JobState.CANCELLED and status.attempts == 1
    await listener.aclose()


async def test_a_forced_stop_leaves_no_pool_process_alive() -> None:
    listener = await Listener.open()
    storage = await MemoryStorage().__aenter__()  # kept open: the jobs are read after the stop
    queue = Queue(storage, handler=spin, executor="process", processes=2, concurrency=2, **FAST)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.run)
            await queue.enqueue_many([("one", listener.port), ("two", listener.port)])
            running = [await listener.accept(), await listener.accept()]
            nursery.cancel_scope.cancel()  # a forced stop: running handlers are cancelled
    pids = [pid for pid, _ in running]
    assert len(set(pids)) == 2 and not any(alive(pid) for pid in pids)
    with trio.fail_after(1.0):
        for _, conn in running:
            await until_closed(conn)
    async with Queue(storage) as producer:  # their jobs went back
        for job_id in ("one", "two"):
            status = await producer.get_status(job_id)
            assert status is not None and status.state is JobState.QUEUED
    await storage.aclose()
    await listener.aclose()


async def test_a_pool_process_stops_its_handler_at_the_lease_deadline_while_its_worker_is_frozen(tmp_path: Any) -> None:
    """The worker is frozen (here its Trio thread blocks, as in a GC pause, a debugger or
    SIGSTOP): no heartbeat renews the lease, and its lease watch cannot cancel the
    handler. The pool process knows the lease deadline and stops the handler itself by
    then: the file the handler writes well after the deadline (1 s lease, 3 s of work) is
    never written, whoever takes the job next."""
    listener = await Listener.open()
    late = tmp_path / "late"
    async with Queue(
        MemoryStorage(), handler=write_late, executor="process", visibility_timeout=1.0, max_attempts=1, **FAST
    ) as queue:
        with trio.fail_after(30):
            await queue.enqueue("slow", {"port": listener.port, "path": str(late), "seconds": 3.0})
            pid, conn = await listener.accept()
        # Frozen: until the pool process is gone (stopped at its deadline), or the handler
        # wrote its file (it ran on past it); 10 s at most.
        frozen_until = time.monotonic() + 10.0
        while alive(pid) and not late.exists() and time.monotonic() < frozen_until:
            time.sleep(0.05)
        assert not late.exists(), "the handler ran on past its lease deadline"
        assert not alive(pid)
    await listener.aclose()


async def async_handler(job: Any) -> None:
    pass


def test_executor_options_are_validated() -> None:
    storage = MemoryStorage()
    with pytest.raises(ValidationError, match="executor must be 'thread' or 'process', got 'fork'"):
        Queue(storage, executor="fork")
    with pytest.raises(ValidationError, match="processes applies to executor='process' only"):
        Queue(storage, processes=2)
    with pytest.raises(ValidationError, match="processes must be in 1..1024, got 0"):
        Queue(storage, executor="process", processes=0)
    with pytest.raises(ValidationError, match="processes must be an int, got float"):
        Queue(storage, executor="process", processes=2.0)
    with pytest.raises(ValidationError, match="runs sync handlers only; 'async_handler' is async"):
        Queue(storage, handler=async_handler, executor="process")
    with pytest.raises(ValidationError, match="needs a picklable handler \\(a module-level function\\)"):
        Queue(storage, handler=lambda job: None, executor="process")
    queue = Queue(storage, executor="process", processes=3)
    with pytest.raises(ValidationError, match="runs sync handlers only"):
        queue.execute(async_handler)
    queue.execute(crunch)
    copied = queue.copy(concurrency=5)
    assert (copied.executor, copied.processes, copied.concurrency) == ("process", 3, 5)
    assert Queue(storage).processes is None and Queue(storage).executor == "thread"
    assert Queue(storage, executor="process", concurrency=4).processes == 4



def test_concurrency_follows_processes_unless_given() -> None:
    """``executor="process", processes=4`` ran one job at a time (concurrency 1) while
    three processes idled: concurrency now defaults to ``processes``."""
    storage = MemoryStorage()
    queue = Queue(storage, executor="process", processes=4)
    assert (queue.concurrency, queue.processes, queue.prefetch) == (4, 4, 4)
    assert Queue(storage, executor="process", processes=4, concurrency=2).concurrency == 2
    assert Queue(storage, executor="process").concurrency == 1  # and processes follows it
    assert Queue(storage).concurrency == 1
    assert queue.copy(processes=6).concurrency == 6
    assert queue.copy(concurrency=3).processes == 4
