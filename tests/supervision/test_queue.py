"""Storage conformance suite, part 2: the Queue API, against every backend — the producer side.

Enqueue and request/response (``enqueue_and_wait``: results, failures, timeouts, cancel
scopes, joining a duplicate in flight), cancelling jobs, result TTLs, input validation and
``enqueue_many``. The rest of part 2, by concern: test_queue_consumer.py (how handlers
run), test_queue_shutdown.py (stopping a Queue), test_queue_reaper.py (stalled jobs and
the reaper); their helpers are in queue_helpers.py.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import (
    CancelStatus,
    EnqueueStatus,
    Job,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
    JobState,
    JobTimeoutError,
    Queue,
    Storage,
    TrioQueueError,
    UpdateTTLStatus,
    ValidationError,
)

from queue_helpers import FAST, echo
from support import Recorder


async def test_enqueue_and_process(storage: Storage, queue_name: str) -> None:
    done = trio.Event()
    seen: list[Job[Any]] = []

    async def handler(job: Job[Any]) -> int:
        seen.append(job)
        done.set()
        return job.payload["n"] * 2

    completed = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, worker_id="w:1", **FAST) as q:
        q.on("completed", completed)
        r = await q.enqueue("job-1", {"n": 21})
        assert r.status is EnqueueStatus.QUEUED and r.id == "job-1"
        with trio.fail_after(10):
            await done.wait()
            await completed.wait_for("completed", "job-1")
        status = await q.get_status("job-1")
        assert status is not None and status.state is JobState.COMPLETED
        assert status.result == 42 and status.attempts == 1 and status.error is None
        assert await q.get_result("job-1") == 42
    [job] = seen
    assert (job.id, job.payload, job.attempts, job.max_attempts, job.worker_id) == ("job-1", {"n": 21}, 1, 3, "w:1")
    assert job.created_at == pytest.approx(status.created_at, abs=5)


async def test_enqueue_and_wait_returns_result(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=echo, concurrency=4, **FAST) as q:
        with trio.fail_after(10):
            results = []
            async with trio.open_nursery() as nursery:

                async def one(i: int) -> None:
                    results.append(await q.enqueue_and_wait(f"rr-{i}", i, timeout=10))

                for i in range(20):
                    nursery.start_soon(one, i)
        assert sorted(r["echo"] for r in results) == list(range(20))
        # A completed id answers from the cache without running again.
        again = await q.enqueue_and_wait("rr-3", "ignored", timeout=5)
        assert again == {"echo": 3, "attempt": 1}
        r = await q.enqueue("rr-3", "ignored")
        assert r.status is EnqueueStatus.COMPLETED and r.result == {"echo": 3, "attempt": 1}


async def test_producer_and_consumer_are_separate_queues(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=echo, **FAST), Queue(storage, name=queue_name) as producer:
        with trio.fail_after(10):
            assert await producer.enqueue_and_wait("x", [1, 2]) == {"echo": [1, 2], "attempt": 1}


async def test_enqueue_and_wait_failure_carries_error(storage: Storage, queue_name: str) -> None:
    async def boom(job: Job[Any]) -> None:
        raise KeyError(f"missing {job.payload}")

    async with Queue(storage, name=queue_name, handler=boom, max_attempts=2, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("f1", "thing")
        err = info.value.error
        assert err.type == "KeyError" and "missing thing" in err.message and "Traceback" in err.traceback
        assert info.value.job_id == "f1"
        status = await q.get_status("f1")
        assert status is not None and status.state is JobState.FAILED and status.attempts == 2
        with pytest.raises(JobFailedError):
            await q.get_result("f1")
        # Waiting again on a failed id raises at once; enqueueing it is a duplicate.
        with trio.fail_after(5), pytest.raises(JobFailedError):
            await q.enqueue_and_wait("f1", "thing")
        r = await q.enqueue("f1", "thing")
        assert r.status is EnqueueStatus.DUPLICATE and r.existing_state is JobState.FAILED


async def test_enqueue_and_wait_timeout(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as producer:  # nobody consumes
        with pytest.raises(JobTimeoutError) as info:
            await producer.enqueue_and_wait("slow", 1, timeout=0.2)
        assert isinstance(info.value, TimeoutError)
        status = await producer.get_status("slow")
        assert status is not None and status.state is JobState.QUEUED  # the job is still there


async def test_enqueue_and_wait_honours_cancel_scope(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as producer:
        with trio.move_on_after(0.2) as scope:
            await producer.enqueue_and_wait("w", 1, timeout=30)
        assert scope.cancelled_caught
        assert not producer._waiters  # the cancelled waiter is gone


async def test_enqueue_and_wait_joins_inflight_duplicate(storage: Storage, queue_name: str) -> None:
    release = trio.Event()
    started = trio.Event()
    runs = Counter[str]()

    async def gated(job: Job[Any]) -> str:
        runs[job.id] += 1
        started.set()
        await release.wait()
        return f"done-{job.payload}"

    async with Queue(storage, name=queue_name, handler=gated, concurrency=3, **FAST) as q:
        results: list[str] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def wait_one() -> None:
                    results.append(await q.enqueue_and_wait("same", "p1"))

                nursery.start_soon(wait_one)
                await started.wait()
                for _ in range(3):
                    nursery.start_soon(wait_one)
                await trio.testing.wait_all_tasks_blocked()
                r = await q.enqueue("same", "p2")
                assert r.status is EnqueueStatus.DUPLICATE and r.existing_state is JobState.PROCESSING
                release.set()
        assert results == ["done-p1"] * 4
        assert runs == {"same": 1}


async def test_cancel_queued_job_never_runs(storage: Storage, queue_name: str) -> None:
    ran: list[str] = []

    async def record(job: Job[Any]) -> None:
        ran.append(job.id)

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("keep-1", 1), ("drop", 2), ("keep-2", 3)])
        assert (await producer.cancel("drop")).status is CancelStatus.CANCELLED
        assert (await producer.cancel("drop")).status is CancelStatus.CANCELLED  # idempotent
        status = await producer.get_status("drop")
        assert status is not None and status.state is JobState.CANCELLED and status.state.terminal
        with pytest.raises(JobCancelledError):
            await producer.get_result("drop")
    async with Queue(storage, name=queue_name, handler=record, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("last", 0) is None
    assert ran == ["keep-1", "keep-2", "last"]


async def test_cancel_while_waited_on(storage: Storage, queue_name: str) -> None:
    enqueued = Recorder()
    async with Queue(storage, name=queue_name) as producer:
        producer.on("enqueued", enqueued)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                outcome: list[BaseException] = []

                async def waiter(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    task_status.started()
                    try:
                        await producer.enqueue_and_wait("c", 1, timeout=30)
                    except JobCancelledError as exc:
                        outcome.append(exc)

                await nursery.start(waiter)
                await enqueued.wait_for("enqueued", "c")
                assert (await producer.cancel("c")).status is CancelStatus.CANCELLED
        assert len(outcome) == 1 and outcome[0].job_id == "c"


async def test_cancel_statuses_of_finished_jobs(storage: Storage, queue_name: str) -> None:
    async def gated(job: Job[Any]) -> str:
        if job.id == "bad":
            raise ValueError("no")
        return "ok"

    async with Queue(storage, name=queue_name, handler=gated, concurrency=2, max_attempts=1, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("run", 0) == "ok"
            assert (await q.cancel("run")).status is CancelStatus.COMPLETED
            with pytest.raises(JobFailedError):
                await q.enqueue_and_wait("bad", 0)
            assert (await q.cancel("bad")).status is CancelStatus.FAILED


async def test_result_ttl_per_job_and_update(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=echo, result_ttl=60, **FAST) as q:
        with trio.fail_after(10):
            await q.enqueue_and_wait("short", 1, result_ttl=0.3)
            await q.enqueue_and_wait("kept", 2, result_ttl=0.3)
            await q.enqueue_and_wait("long", 3)
        assert await q.update_result_ttl("kept", 60) is UpdateTTLStatus.UPDATED
        assert await q.update_result_ttl("nope", 60) is UpdateTTLStatus.NOT_FOUND
        await trio.sleep(0.5)
        assert await q.get_status("short") is None
        assert (await q.get_result("kept"))["echo"] == 2
        assert (await q.get_result("long"))["echo"] == 3
        # The id is free again once its TTL ran out: it runs anew.
        assert (await q.enqueue("short", 10)).status is EnqueueStatus.QUEUED


async def test_first_enqueue_fixes_ttl_and_attempts(storage: Storage, queue_name: str) -> None:
    async def failing(job: Job[Any]) -> None:
        raise RuntimeError("x")

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("j", 1, max_attempts=1, result_ttl=120)
        assert (await producer.enqueue("j", 1, max_attempts=5)).status is EnqueueStatus.DUPLICATE
    async with Queue(storage, name=queue_name, handler=failing, max_attempts=5, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError):
            await q.enqueue_and_wait("j", 1)
        status = await q.get_status("j")
        assert status is not None and status.attempts == 1


async def test_update_result_ttl_not_terminal(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("q", 1)
        assert await producer.update_result_ttl("q", 10) is UpdateTTLStatus.NOT_TERMINAL
        with pytest.raises(JobNotFinishedError) as info:
            await producer.get_result("q")
        assert info.value.state == "queued"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda q: q.enqueue("", 1), "empty"),
        (lambda q: q.enqueue(123, 1), "must be a str"),
        (lambda q: q.enqueue("x" * 1025, 1), "over 1024 bytes"),
        (lambda q: q.enqueue("é" * 513, 1), "over 1024 bytes"),
        (lambda q: q.enqueue("bad-ttl", 1, result_ttl=0), "result_ttl must be finite and > 0"),
        (lambda q: q.enqueue("bad-ttl", 1, result_ttl=math.inf), "result_ttl must be finite"),
        (lambda q: q.enqueue("bad-ttl", 1, result_ttl=math.nan), "result_ttl must be finite"),
        (lambda q: q.enqueue("bad-att", 1, max_attempts=0), "max_attempts must be >= 1"),
        (lambda q: q.enqueue("bad-pay", {1, 2}), "payload of job 'bad-pay' cannot be encoded"),
        (lambda q: q.enqueue("nan-pay", math.nan), "payload of job 'nan-pay'"),
        (lambda q: q.enqueue_and_wait("t", 1, timeout=-1), "timeout must be finite and > 0"),
        (lambda q: q.update_result_ttl("t", math.inf), "ttl must be finite"),
        (lambda q: q.enqueue_many([("ok", 1), ("bad", object())]), "payload of job 'bad'"),
    ],
)
async def test_bad_input_is_rejected_and_writes_nothing(storage: Storage, queue_name: str, call, match) -> None:
    async with Queue(storage, name=queue_name) as producer:
        with pytest.raises(ValidationError, match=match) as info:
            await call(producer)
        assert isinstance(info.value, ValueError)
        for jid in ("bad-ttl", "bad-att", "bad-pay", "nan-pay", "t", "ok", "bad"):
            assert await producer.get_status(jid) is None


def test_bad_constructor_arguments(storage_free_memory: Storage) -> None:
    for kwargs, match in [
        ({"concurrency": 0}, "concurrency must be >= 1"),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"job_timeout": -1}, "job_timeout"),
        ({"result_ttl": math.inf}, "result_ttl"),
        ({"block_timeout": math.nan}, "block_timeout"),
        ({"payload_serde": object()}, "payload_serde"),
    ]:
        with pytest.raises(ValidationError, match=match):
            Queue(storage_free_memory, **kwargs)
    with pytest.raises(ValidationError, match="unknown event"):
        Queue(storage_free_memory).on("nonsense", print)


async def test_api_requires_a_running_queue(storage: Storage, queue_name: str) -> None:
    q = Queue(storage, name=queue_name)
    with pytest.raises(TrioQueueError, match="not running"):
        await q.enqueue("x", 1)


async def test_enqueue_many_mixed_outcomes(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=echo, **FAST) as q:
        with trio.fail_after(10):
            await q.enqueue_and_wait("done", 0)
        results = await q.enqueue_many([("n1", 1), ("done", 0), ("n1", 2), ("n2", 3)])
        assert [r.status for r in results] == [
            EnqueueStatus.QUEUED,
            EnqueueStatus.COMPLETED,
            EnqueueStatus.DUPLICATE,
            EnqueueStatus.QUEUED,
        ]
        assert results[1].result == {"echo": 0, "attempt": 1}
        assert await q.enqueue_many([]) == []


# -- a storage with the core interface only ------------------------------------------------


def _core_only() -> Storage:
    """A storage with the core interface and no capability: each core call goes to a
    MemoryStorage (its capabilities unreachable)."""
    from trioqueue import MemoryStorage

    def delegate(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.inner, name)(*args, **kwargs)

        method.__name__ = name
        return method

    def __init__(self: Any) -> None:
        Storage.__init__(self)
        self.inner = MemoryStorage()

    async def _connect(self: Any) -> None:
        await self.inner.open()

    async def _disconnect(self: Any) -> None:
        await self.inner.aclose()

    namespace = {name: delegate(name) for name in Storage.__abstractmethods__}
    core_only = type("CoreOnly", (Storage,), {**namespace, "__init__": __init__, "_connect": _connect, "_disconnect": _disconnect})
    return core_only()  # type: ignore[no-any-return]


async def test_a_storage_with_only_the_core_runs_jobs_and_names_each_missing_capability() -> None:
    """A backend needs the core alone: a Queue on it runs jobs (worker, reaper, waiters,
    status, listing). What needs a capability it lacks is refused with a ValidationError
    naming the capability and the backend, writing nothing; look-ups of what it cannot
    have answer empty."""
    from trioqueue import Child
    from trioqueue.storage._capabilities import capabilities_of

    storage = _core_only()
    assert capabilities_of(storage) == ()
    with pytest.raises(ValidationError, match=r"^group_concurrency needs a storage with groups \(the Groups capability\), not CoreOnly$"):
        Queue(storage, group_concurrency=1)
    async with Queue(storage, name="q", handler=echo, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("a", 2) == {"echo": 2, "attempt": 1}
        assert (await q.list_jobs("completed")).jobs[0].id == "a"
        refused: list[tuple[Any, str]] = [
            (lambda: q.enqueue("g", 1, group="x"), "Groups"),
            (lambda: q.enqueue("t", 1, children=[Child("c", 1)]), "Trees"),
            (lambda: q.enqueue("d", 1, debounce=1.0), "Debounce"),
            (lambda: q.schedule("s", every=60), "Schedules"),
            (lambda: q.pause(), "Administration"),
            (lambda: q.purge("completed"), "Administration"),
            (lambda: q.pause_group("x"), "Groups"),
        ]
        for call, capability in refused:
            with pytest.raises(ValidationError, match=rf"needs a storage with .* \(the {capability} capability\), not CoreOnly"):
                await call()
        assert [await q.get_status(jid) for jid in ("g", "t", "c", "d")] == [None] * 4
        assert await q.schedules() == [] and not await q.is_paused() and await q.paused_groups() == []
        assert await q.children("a") == {}
        assert (await q.get_status("a")).steps is None  # (no steps to read)

    async def stepping(job: Job[Any]) -> Any:
        return await job.step("s", lambda: 1)

    async with Queue(storage, name="steps", handler=stepping, max_attempts=1, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as failed:
            await q.enqueue_and_wait("s", None)
    assert failed.value.error.type == "ValidationError"
    assert failed.value.error.message == "step 's' of job 's' needs a storage with steps (the Steps capability), not CoreOnly"
