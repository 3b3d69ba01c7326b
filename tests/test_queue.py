"""Storage conformance suite, part 2: the Queue API, against every backend."""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import (
    CancelStatus,
    EnqueueStatus,
    ExecutionContext,
    Job,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
    JobState,
    JobTimeoutError,
    LeaderElection,
    Queue,
    QueueEvent,
    Reaper,
    Storage,
    TrioQueueError,
    UpdateTTLStatus,
    ValidationError,
)
from trioqueue.storage import NewJob

from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def echo(job: Job[Any]) -> Any:
    return {"echo": job.payload, "attempt": job.attempts}


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


async def test_graceful_stop_finishes_running_and_returns_prefetched(storage: Storage, queue_name: str) -> None:
    started = trio.Event()
    release = trio.Event()
    ran: list[str] = []

    async def gated(job: Job[Any]) -> str:
        ran.append(job.id)
        started.set()
        await release.wait()
        return "finished"

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("first", 1), ("second", 2), ("third", 3)])
        consumer = Queue(storage, name=queue_name, handler=gated, concurrency=1, prefetch=2, **FAST)
        handed_back: list[str] = []
        both_back = trio.Event()

        def on_requeued(ev: QueueEvent) -> None:
            handed_back.append(ev.job_id)
            if len(handed_back) == 2:
                both_back.set()

        producer.on("requeued", on_requeued)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                await started.wait()
                consumer.stop()  # graceful: prefetched jobs go back, "first" still finishes
                await both_back.wait()
                release.set()
        assert ran == ["first"]
        assert (await producer.get_status("first")).state is JobState.COMPLETED
        for jid in ("second", "third"):
            status = await producer.get_status(jid)
            assert status.state is JobState.QUEUED and status.attempts == 0
        assert await storage.held_jobs(queue_name, consumer.worker_id) == []
        assert consumer.worker_id not in await storage.workers(queue_name)


def gated() -> tuple[Any, trio.Event, trio.Event]:
    """A handler that returns each job's id at once, but for job ``gate``: that one
    signals its start, then waits for ``release``."""
    gate_started, release = trio.Event(), trio.Event()

    async def handler(job: Job[Any]) -> str:
        if job.id == "gate":
            gate_started.set()
            await release.wait()
        return job.id

    return handler, gate_started, release


@pytest.mark.parametrize("stop", ["graceful", "forced"])
async def test_claims_started_ahead_by_the_pace_are_refunded_at_stop(
    storage: Storage, queue_name: str, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """Once workers settle jobs fast, the consumer starts new claims at claim time (their
    handlers then never wait for a start round trip); a stop, graceful or forced, hands
    back the ones that never ran with their attempts taken back."""
    import trioqueue._supervision._consumer as consumer_module

    monkeypatch.setattr(consumer_module, "PACE_WINDOW", 0.0)  # a pace after the first settlement
    monkeypatch.setattr(consumer_module, "PACE_HORIZON", 3600.0)  # every claim is "about to begin"
    handler, gate_started, release = gated()

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([(f"fast{i}", i) for i in range(200)])
        await producer.enqueue("gate", 0)
        await producer.enqueue_many([(f"late{i}", i) for i in range(20)])
        consumer = Queue(storage, name=queue_name, handler=handler, concurrency=1, prefetch=20, **FAST)
        late = {f"late{i}" for i in range(20)}
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                await gate_started.wait()
                # late jobs are claimed behind the gate (no event tells when: poll, bounded)
                while not (held := late & set(await storage.held_jobs(queue_name, consumer.worker_id))):
                    await trio.sleep(0.005)
                # ... with their attempts counted at claim time
                assert {(await producer.get_status(j)).attempts for j in held} == {1}
                if stop == "graceful":
                    consumer.stop()  # the gate finishes, the late jobs go back
                    while set(await storage.held_jobs(queue_name, consumer.worker_id)) != {"gate"}:
                        await trio.sleep(0.005)  # (no event says when all went back: poll, bounded)
                    release.set()
                else:
                    nursery.cancel_scope.cancel()  # the gate goes back too
        gate = await producer.get_status("gate")
        assert gate.state is (JobState.COMPLETED if stop == "graceful" else JobState.QUEUED)
        assert gate.attempts == 1
        for jid in sorted(late):
            status = await producer.get_status(jid)
            assert status.state is JobState.QUEUED and status.attempts == 0, jid


async def test_claims_landing_after_a_graceful_stop_go_back_at_once() -> None:
    """A claim in flight when ``stop()`` came landed in the buffer after stop had given
    the buffer back: its jobs stayed held (neither run nor returned) until the last
    running handler finished, however long that took."""
    from trioqueue.storage import MemoryStorage

    class HeldClaims(MemoryStorage):
        """MemoryStorage whose armed claim, once it took its jobs, waits for ``land``
        before returning (uncancellable, as a claim whose request was sent)."""

        def __init__(self) -> None:
            super().__init__()
            self.armed = False
            self.in_flight, self.land = trio.Event(), trio.Event()

        async def dequeue(self, *args: Any, **kwargs: Any) -> Any:
            claims = await super().dequeue(*args, **kwargs)
            if self.armed and claims:
                self.in_flight.set()
                with trio.CancelScope(shield=True):
                    await self.land.wait()
            return claims

    storage = HeldClaims()
    handler, gate_started, release = gated()

    late = {f"late{i}" for i in range(5)}
    async with storage, Queue(storage, name="q") as producer:
        consumer = Queue(storage, name="q", handler=handler, concurrency=1, prefetch=10, **FAST)
        await producer.enqueue("gate", 0)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                await gate_started.wait()
                storage.armed = True
                await producer.enqueue_many([(j, 0) for j in sorted(late)])
                await storage.in_flight.wait()  # the late jobs are claimed, the reply not in
                consumer.stop()
                await trio.testing.wait_all_tasks_blocked()  # the stop has done what it does at once
                storage.land.set()
                while set(await storage.held_jobs("q", consumer.worker_id)) != {"gate"}:
                    await trio.sleep(0.005)  # (no event says when they went back: poll, bounded)
                release.set()
        for jid in sorted(late):
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.QUEUED and status.attempts == 0, (jid, status)


def never_finishing() -> tuple[Any, trio.Event]:
    """A handler that signals its start and then runs until cancelled."""
    started = trio.Event()

    async def forever(job: Job[Any]) -> None:
        started.set()
        await trio.sleep_forever()

    return forever, started


async def test_forced_stop_returns_running_job_to_the_queue(storage: Storage, queue_name: str) -> None:
    forever, started = never_finishing()

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("stuck", 1)
        with trio.fail_after(10):
            with trio.CancelScope() as scope:
                async with Queue(storage, name=queue_name, handler=forever, **FAST):
                    await started.wait()
                    scope.cancel()
            status = await producer.get_status("stuck")
            # back in the queue; the interrupted attempt stays counted (never goes down)
            assert status.state is JobState.QUEUED and status.attempts == 1

            async with Queue(storage, name=queue_name, handler=echo, **FAST) as again:
                assert await again.enqueue_and_wait("stuck", 1) == {"echo": 1, "attempt": 2}


async def test_reaper_recovers_job_of_dead_worker(storage: Storage, queue_name: str) -> None:
    # A worker that claimed a job and died: it registered, claimed, and never renewed.
    await storage.heartbeat(queue_name, "dead-worker", 0.3, [], 0.3)
    await storage.enqueue(queue_name, [_raw_job("orphan")])
    [c] = await storage.dequeue(queue_name, "dead-worker", 1, 1.0, 0.3)
    assert c.id == "orphan"
    stalled = Recorder()
    q = Queue(storage, name=queue_name, handler=echo, visibility_timeout=1.0, **FAST)
    q.on("stalled", stalled)
    async with q:
        with trio.fail_after(15):
            result = await q.enqueue_and_wait("orphan", None)
            await stalled.wait_for("stalled")
        assert result["attempt"] == 2
    stalled = stalled.events  # type: ignore[assignment]
    assert stalled[0].job_id == "orphan" and stalled[0].data["worker_id"] == "dead-worker"


async def test_long_job_of_live_worker_is_not_recovered(storage: Storage, queue_name: str) -> None:
    runs = Counter[str]()
    stalled: list[QueueEvent] = []

    async def long(job: Job[Any]) -> str:
        runs[job.id] += 1
        await trio.sleep(1.2)  # four visibility timeouts
        return "done"

    q = Queue(storage, name=queue_name, handler=long, visibility_timeout=0.3, **FAST)
    q.on("stalled", stalled.append)
    async with q:
        with trio.fail_after(15):
            assert await q.enqueue_and_wait("long", None) == "done"
    assert runs == {"long": 1} and stalled == []


async def test_reaper_leader_election_fails_over(storage: Storage, queue_name: str) -> None:
    election = LeaderElection(lock_ttl=0.5, renewal_interval=0.15, acquire_retry_interval=0.1)
    recorder = Recorder()
    a = Reaper(storage, name=queue_name, leader_election=election, owner_id="A")
    b = Reaper(storage, name=queue_name, leader_election=election, owner_id="B")
    for r in (a, b):
        r.on("leadership_acquired", recorder)
        r.on("leadership_lost", recorder)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            async with a:
                await recorder.wait_for("leadership_acquired")
                assert a.is_leader
                await nursery.start(b.run)
                await trio.sleep(0.7)  # longer than the lock TTL: a must keep renewing it
                assert a.is_leader and not b.is_leader
            # a stopped (released its lock): b takes over
            await recorder.wait_for("leadership_acquired", count=2)
            assert b.is_leader
            nursery.cancel_scope.cancel()
    owners = [(e.name, e.data["owner"]) for e in recorder.events]
    assert owners[:2] == [("leadership_acquired", "A"), ("leadership_acquired", "B")]


async def test_reaper_takes_over_after_leader_dies_without_release(storage: Storage, queue_name: str) -> None:
    election = LeaderElection(lock_ttl=0.4, renewal_interval=0.1, acquire_retry_interval=0.05)
    # A leader that died holding the lock: it was taken and never renewed or released.
    assert await storage.acquire_lock(f"{queue_name}:reaper", "ghost", 0.4)
    b = Reaper(storage, name=queue_name, leader_election=election, owner_id="B")
    recorder = Recorder()
    b.on("leadership_acquired", recorder)
    with trio.fail_after(10):
        async with b:
            assert not b.is_leader
            await recorder.wait_for("leadership_acquired")
            assert b.is_leader


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


def _raw_job(job_id: str) -> NewJob:
    from trioqueue._core import encode_envelope

    return NewJob(job_id, encode_envelope(job_id, b"null", 0, 0, 3, 60_000), 3, 60.0)


async def test_body_exception_propagates_unwrapped_and_jobs_go_back(storage: Storage, queue_name: str) -> None:
    forever, started = never_finishing()

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("j", 1)
        with pytest.raises(KeyError, match="app bug"):
            async with Queue(storage, name=queue_name, handler=forever, **FAST):
                with trio.fail_after(10):
                    await started.wait()
                raise KeyError("app bug")
        status = await producer.get_status("j")
        assert status is not None and status.state is JobState.QUEUED and status.attempts == 1


async def test_run_as_a_service_with_nursery_start(storage: Storage, queue_name: str) -> None:
    q = Queue(storage, name=queue_name, handler=echo, **FAST)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            assert q.running
            assert await q.enqueue_and_wait("svc", 5) == {"echo": 5, "attempt": 1}
            with pytest.raises(TrioQueueError, match="already running"):
                await q.run()
            q.stop()
    assert not q.running


async def test_unserializable_result_fails_the_attempt(storage: Storage, queue_name: str) -> None:
    async def bad_result(job: Job[Any]) -> Any:
        return {1, 2}  # not JSON

    async with Queue(storage, name=queue_name, handler=bad_result, max_attempts=1, **FAST) as q:
        with trio.fail_after(10), pytest.raises(JobFailedError) as info:
            await q.enqueue_and_wait("r", None)
        assert "result of job 'r' cannot be encoded by JsonSerde" in info.value.error.message


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
