"""Batch handlers (``Queue(batch_handler=..., batch_size=..., batch_wait=...)``),
conformance on every backend: a handler takes a list of jobs, each job is settled on its
own (a partial failure retries only the failed jobs), and cancellation, progress and a
lost lease still work per job."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import (
    BatchOutcome,
    CancelStatus,
    Job,
    JobState,
    Queue,
    Retry,
    Storage,
    ValidationError,
)
from trioqueue.testing import FaultyStorage

from support import Recorder

FAST: dict[str, Any] = {"retry_delay": 0, "block_timeout": 0.2}


async def wait_all(q: Queue[Any, Any], ids: list[str], events: Recorder) -> None:
    """Until every job of ``ids`` ended (completed, failed or cancelled events)."""
    ended = {"completed", "failed", "cancelled"}
    await events.wait_until(lambda evs: set(ids) <= {e.job_id for e in evs if e.name in ended})


def recorded(q: Queue[Any, Any]) -> Recorder:
    events = Recorder()
    for name in ("completed", "failed", "cancelled"):
        q.on(name, events)
    return events


async def test_a_batch_handler_gets_up_to_batch_size_jobs_and_settles_each(storage: Storage, queue_name: str) -> None:
    sizes: list[int] = []

    async def double(jobs: list[Job[int]]) -> list[int]:
        sizes.append(len(jobs))
        return [job.payload * 2 for job in jobs]

    ids = [f"j{i}" for i in range(250)]
    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([(j, i) for i, j in enumerate(ids)])
        worker = Queue(storage, name=queue_name, batch_handler=double, batch_size=100, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(20):
                await wait_all(worker, ids, events)
        assert sum(sizes) == 250 and max(sizes) == 100 and len(sizes) >= 3, sizes
        for i in (0, 7, 249):
            status = await producer.get_status(f"j{i}")
            assert status is not None and status.state is JobState.COMPLETED and status.result == 2 * i
            assert status.attempts == 1


async def test_a_partial_failure_retries_only_the_failed_jobs(storage: Storage, queue_name: str) -> None:
    runs: list[tuple[str, int]] = []

    async def half_fail(jobs: list[Job[int]]) -> BatchOutcome:
        outcome = BatchOutcome()
        for job in jobs:
            runs.append((job.id, job.attempts))
            if job.payload % 2 and job.attempts == 1:
                outcome.fail(job, ValueError(f"odd {job.id}"))
            elif job.payload == 4:
                outcome.fail(job.id, Retry("later", delay=0))  # a Retry counts as an attempt
            else:
                outcome.complete(job, f"ok {job.id} on attempt {job.attempts}")
        return outcome

    ids = [f"j{i}" for i in range(6)]
    async with Queue(storage, name=queue_name, max_attempts=2) as producer:  # (the producer's: per job)
        await producer.enqueue_many([(j, i) for i, j in enumerate(ids)])
        worker = Queue(storage, name=queue_name, batch_handler=half_fail, batch_size=10, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(20):
                await wait_all(worker, ids, events)
        for i, jid in enumerate(ids):
            status = await producer.get_status(jid)
            assert status is not None, jid
            if i == 4:  # retried by its Retry until its attempts ran out
                assert status.state is JobState.FAILED and status.attempts == 2 and "later" in str(status.error)
                continue
            attempts = 2 if i % 2 else 1
            assert status.state is JobState.COMPLETED and status.attempts == attempts, (jid, status)
            assert status.result == f"ok {jid} on attempt {attempts}"
        assert sorted(runs) == sorted([(j, 1) for j in ids] + [("j1", 2), ("j3", 2), ("j4", 2), ("j5", 2)])


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        (lambda jobs: [1], "returned 1 results for 3 jobs (job 'a')"),
        (lambda jobs: {"a": 1}, "must return a list of results or a BatchOutcome, got dict (job 'a')"),
        (lambda jobs: BatchOutcome(results={"a": 1, "b": 2}), "gave job 'c' no outcome"),
    ],
)
async def test_outcomes_that_do_not_fit_the_batch_fail_its_jobs_naming_them(
    storage_free_memory: Storage, returns: Any, message: str
) -> None:
    async def handler(jobs: list[Job[Any]]) -> Any:
        return returns(jobs)

    async with Queue(storage_free_memory, name="q", max_attempts=1) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0), ("c", 0)])
        worker = Queue(storage_free_memory, name="q", batch_handler=handler, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await wait_all(worker, ["a", "b", "c"], events)
        failed = {jid: await producer.get_status(jid) for jid in "abc"}
        expect = {"c"} if "no outcome" in message else {"a", "b", "c"}
        for jid, status in failed.items():
            assert status is not None
            if jid in expect:
                assert status.state is JobState.FAILED and message.replace("'a'", f"'{jid}'") in str(status.error), status
            else:
                assert status.state is JobState.COMPLETED


async def test_a_batch_handler_that_raises_fails_every_job_of_the_batch(storage_free_memory: Storage) -> None:
    def broken(jobs: list[Job[Any]]) -> list[Any]:  # a sync handler: it runs in a thread
        raise RuntimeError(f"database down ({len(jobs)} jobs)")

    async with Queue(storage_free_memory, name="q", max_attempts=2) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0)])
        worker = Queue(storage_free_memory, name="q", batch_handler=broken, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await wait_all(worker, ["a", "b"], events)
        for jid in "ab":
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.FAILED and status.attempts == 2
            assert status.error is not None and status.error.type == "RuntimeError" and "database down" in status.error.message


class CancelSeen(FaultyStorage):
    """A pass-through that tells when a heartbeat reply named a job as cancel-requested
    (the worker acts on the reply before its next schedule point)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.seen: dict[str, trio.Event] = {}

    async def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        reply = await super().heartbeat(*args, **kwargs)
        for job_id in reply.cancel_requested:
            self.seen.setdefault(job_id, trio.Event()).set()
        return reply

    async def wait_seen(self, job_id: str) -> None:
        await self.seen.setdefault(job_id, trio.Event()).wait()


async def test_cancelling_one_job_of_a_running_batch_cancels_that_job_only(storage: Storage, queue_name: str) -> None:
    started, gate = trio.Event(), trio.Event()
    handler_cancelled = False

    async def gated(jobs: list[Job[Any]]) -> list[str]:
        nonlocal handler_cancelled
        started.set()
        try:
            await gate.wait()
        except trio.Cancelled:
            handler_cancelled = True
            raise
        return [f"done {job.id}" for job in jobs]

    seen = CancelSeen(storage)
    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0), ("c", 0)])
        worker = Queue(seen, name=queue_name, batch_handler=gated, visibility_timeout=0.5, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await started.wait()
                assert (await producer.cancel("b")).status is CancelStatus.CANCELLED
                await seen.wait_seen("b")
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
                await wait_all(worker, ["a", "b", "c"], events)
        assert not handler_cancelled
        states = {jid: (await producer.get_status(jid)) for jid in "abc"}
        assert states["b"] is not None and states["b"].state is JobState.CANCELLED
        for jid in "ac":
            status = states[jid]
            assert status is not None and status.state is JobState.COMPLETED and status.result == f"done {jid}"


async def test_cancelling_every_job_of_a_running_batch_cancels_the_handler(storage: Storage, queue_name: str) -> None:
    started, cancelled = trio.Event(), trio.Event()

    async def forever(jobs: list[Job[Any]]) -> list[Any]:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0)])
        worker = Queue(storage, name=queue_name, batch_handler=forever, visibility_timeout=0.5, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await started.wait()
                for jid in "ab":
                    assert (await producer.cancel(jid)).status is CancelStatus.CANCELLED
                await cancelled.wait()
                await wait_all(worker, ["a", "b"], events)
        for jid in "ab":
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.CANCELLED


async def test_each_job_of_a_batch_reports_its_own_progress(storage: Storage, queue_name: str) -> None:
    async def report(jobs: list[Job[int]]) -> list[None]:
        for job in jobs:
            await job.report_progress({"done": job.payload})
            assert job.lease_deadline is not None
        return [None] * len(jobs)

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("a", 1), ("b", 2)])
        worker = Queue(storage, name=queue_name, batch_handler=report, **FAST)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await wait_all(worker, ["a", "b"], events)
        for jid, n in (("a", 1), ("b", 2)):
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.COMPLETED and status.progress == {"done": n}


async def test_a_batch_whose_leases_were_lost_stores_nothing_and_runs_again(storage: Storage, queue_name: str) -> None:
    """The worker is presumed dead and its jobs recovered while its batch runs: the
    heartbeat says so, the handler is cancelled and nothing is stored for its jobs; they
    run again, and complete on their second attempt."""
    first, cancelled = trio.Event(), trio.Event()
    lost = Recorder()

    async def handler(jobs: list[Job[Any]]) -> list[str]:
        if jobs[0].attempts == 1:
            first.set()
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()
        return [f"{job.id} attempt {job.attempts}" for job in jobs]

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0)])
        worker = Queue(storage, name=queue_name, batch_handler=handler, reaper=False, visibility_timeout=0.5, **FAST)
        worker.on("lease_lost", lost)
        events = recorded(worker)
        async with worker:
            with trio.fail_after(10):
                await first.wait()
                recovered: list[tuple[str, str]] = []
                while len(recovered) < 2:  # (a heartbeat may register it again in between)
                    await storage.unregister_worker(queue_name, worker.worker_id)
                    recovered += (await storage.recover_stalled(queue_name))[0]
                await cancelled.wait()
                await lost.wait_for("lease_lost", count=2)
                await wait_all(worker, ["a", "b"], events)
        for jid in "ab":
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.COMPLETED and status.result == f"{jid} attempt 2"


async def test_a_forced_stop_during_a_batch_puts_its_jobs_back_with_their_attempts(storage: Storage, queue_name: str) -> None:
    started = trio.Event()

    async def forever(jobs: list[Job[Any]]) -> list[Any]:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue_many([("a", 0), ("b", 0)])
        with trio.fail_after(10), trio.CancelScope() as scope:
            async with Queue(storage, name=queue_name, batch_handler=forever, batch_wait=0, **FAST):
                await started.wait()
                scope.cancel()
        for jid in "ab":
            status = await producer.get_status(jid)
            assert status is not None and status.state is JobState.QUEUED and status.attempts == 1, status


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"handler": lambda job: None}, "a handler or a batch_handler, not both"),
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"batch_wait": -1}, "batch_wait"),
        ({"executor": "process"}, 'batch_handler cannot run with executor="process"'),
    ],
)
def test_batch_options_are_validated(storage_free_memory: Storage, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Queue(storage_free_memory, batch_handler=lambda jobs: [], **options)
