"""Storage conformance, Queue level (issue 26, section 4): emptying a queue
(``Queue.clear``) and count-based retention (``keep_completed``/``keep_failed``,
``result_ttl=None``), on every backend."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import (
    Job,
    JobCancelledError,
    JobState,
    Queue,
    Storage,
    UnrecoverableError,
    ValidationError,
)

from queue_helpers import FAST
from support import Recorder


# -- 3. clear ----------------------------------------------------------------------------


@pytest.mark.capability("Administration", "Schedules")
async def test_clear_forgets_every_job_in_every_state_and_keeps_schedules(storage: Storage, queue_name: str) -> None:
    started = trio.Event()
    release = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "block":
            started.set()
            await release.wait()
            return "late"
        if job.payload == "fail":
            raise UnrecoverableError("no")
        return job.payload

    events = Recorder()
    waited: list[BaseException] = []
    async with Queue(storage, name=f"{queue_name}-other", **FAST) as other:
        await other.enqueue("kept", 1)  # another queue: not touched
        async with Queue(storage, name=queue_name, handler=handler, max_attempts=1, **FAST) as q:
            for name in ("cleared", "error", "completed", "failed"):
                q.on(name, events)
            await q.schedule("nightly", {"n": 1}, cron="0 3 * * *")
            await q.enqueue_many([("done", 1), ("bad", "fail")])
            with trio.fail_after(20):
                await events.wait_until(lambda evs: {"completed", "failed"} <= {e.name for e in evs})
            await q.enqueue("running", "block")
            with trio.fail_after(20):
                await started.wait()
            await q.enqueue_many([("waiting", 2), ("queued2", 3)])
            await q.enqueue("later", 4, delay=60)
            await q.enqueue("gone", 5, delay=60)
            await q.cancel("gone")
            counts = await q.counts()
            assert sum(counts.values()) == 7 and counts[JobState.PROCESSING] >= 1

            async def wait_later() -> None:
                try:
                    await q.enqueue_and_wait("later", 4, delay=60, timeout=30)
                except JobCancelledError as exc:
                    waited.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_later)
                # it joined the delayed job (the duplicate's incarnation) before the clear
                while not any(w.token for w in q._waiters._by_id.get("later", ())):
                    await trio.testing.wait_all_tasks_blocked()
                assert await q.clear() == 7
            assert len(waited) == 1  # the waiter learnt its job is gone
            ids = ["done", "bad", "running", "waiting", "queued2", "later", "gone"]
            assert await q.get_statuses(ids) == [None] * 7
            assert set((await q.counts()).values()) == {0}
            assert [s.name for s in await q.schedules()] == ["nightly"]
            with trio.fail_after(20):
                await events.wait_for("cleared")
            # the running handler ends: its settlement is refused, the worker goes on
            release.set()
            with trio.fail_after(20):
                await events.wait_until(lambda evs: any(e.name == "error" and e.job_id == "running" for e in evs))
                assert await q.enqueue_and_wait("after", {"ok": True}) == {"ok": True}
            assert await q.get_status("running") is None
            assert await q.clear(schedules=True) == 1
            assert await q.schedules() == []
            with pytest.raises(ValidationError, match="schedules"):
                await q.clear(schedules="yes")  # type: ignore[arg-type]
        assert (await other.get_status("kept")) is not None


# -- 5. count-based retention ---------------------------------------------------------------


async def _complete_or_fail(job: Job[Any]) -> Any:
    if str(job.payload).startswith("f"):
        raise UnrecoverableError(job.payload)
    return job.payload


async def test_keep_completed_and_keep_failed_keep_the_newest(storage: Storage, queue_name: str) -> None:
    if hasattr(storage, "keep_every"):
        storage.keep_every = 4  # FileStorage trims in batches: every 4 settled jobs here
    done = [f"c{i}" for i in range(8)]
    failed = [f"f{i}" for i in range(4)]
    async with Queue(
        storage, name=queue_name, handler=_complete_or_fail, keep_completed=3, keep_failed=2, max_attempts=1, **FAST
    ) as q:
        with trio.fail_after(30):
            for jid in [*done, *failed]:  # one at a time: each ends after the previous one
                try:
                    await q.enqueue_and_wait(jid, jid)
                except Exception:  # noqa: BLE001 - the f* jobs fail, as they should
                    pass
    # (once the worker has stopped, its settle calls, which trim, have all returned)
    async with Queue(storage, name=queue_name) as q:
        counts = await q.counts()
        assert (counts[JobState.COMPLETED], counts[JobState.FAILED]) == (3, 2)
        statuses = await q.get_statuses([*done, *failed])
        kept = [s.id for s in statuses if s is not None]
        assert kept == ["c5", "c6", "c7", "f2", "f3"]  # the newest of each
        assert (await q.get_status("f3")).error.message == "f3"  # type: ignore[union-attr]
        # a job counted out is forgotten: its id is free again
        assert (await q.enqueue("c0", "again")).status.value == "queued"


async def test_keep_zero_keeps_no_completed_job_and_result_ttl_none_keeps_failed_ones(
    storage: Storage, queue_name: str
) -> None:
    from trioqueue._core import decode_envelope
    from trioqueue._model._types import FOREVER_TTL

    options: dict[str, Any] = {"keep_completed": 0, "result_ttl": None, "max_attempts": 1, **FAST}
    async with Queue(storage, name=queue_name, handler=_complete_or_fail, **options) as q:
        assert q.result_ttl == FOREVER_TTL
        with trio.fail_after(30):
            assert await q.enqueue_and_wait("c", "c") == "c"  # the waiter still gets it
    async with Queue(storage, name=queue_name, handler=_complete_or_fail, **options) as q:
        if not hasattr(storage, "keep_every"):  # (FileStorage: at the next batch)
            assert await q.get_status("c") is None
        await q.enqueue("later", "x", delay=3600)
        envelope = await storage.get_envelope(queue_name, "later")
        assert envelope is not None and decode_envelope(envelope)[5] == int(FOREVER_TTL * 1000)
        with pytest.raises(Exception):
            await q.enqueue_and_wait("f", "f")
        await storage.recover_stalled(queue_name)  # (sweeps what expired: not it)
        status = await q.get_status("f")
        assert status is not None and status.state is JobState.FAILED


async def test_keep_completed_zero_still_delivers_a_large_result_to_the_waiter(storage: Storage, queue_name: str) -> None:
    """A result too large to ride along in the event (over 64 KiB on Redis, 7000 bytes on
    PostgreSQL) still reaches ``enqueue_and_wait`` when ``keep_completed=0``: the record
    is not forgotten before its result has been delivered."""
    big = "x" * 100_000

    async def handler(job: Job[Any]) -> Any:
        return job.payload * 100_000

    async with Queue(storage, name=queue_name, handler=handler, keep_completed=0, concurrency=4, **FAST) as q:
        with trio.fail_after(30):
            assert await q.enqueue_and_wait("big", "x") == big
            results = []

            async def wait_one(i: int) -> None:
                results.append(await q.enqueue_and_wait(f"big-{i}", "y"))

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(wait_one, i)
        assert results == ["y" * 100_000] * 6


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("keep_completed", -1, r"keep_completed must be >= 0.*-1"),
        ("keep_failed", True, "keep_failed must be an int"),
        ("keep_completed", "3", "keep_completed must be an int"),
        ("result_ttl", 0, "result_ttl must be finite and > 0"),
    ],
)
def test_bad_retention_settings_are_refused(storage_free_memory: Storage, option: str, value: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        Queue(storage_free_memory, **{option: value})


async def test_settlement_keep_bounds_the_state_when_the_call_returns(storage: Storage, queue_name: str) -> None:
    """Storage level: once a settle call with ``keep`` has returned, the state holds at
    most ``keep`` jobs (FileStorage: with its batch set to 1, every call trims), the
    newest (a batch settled in one call shares its time: ties go by id on every backend)."""
    from trioqueue.storage import SettleKind

    from storage_helpers import W1, claim, job, settlement

    if hasattr(storage, "keep_every"):
        storage.keep_every = 1
    q = queue_name
    ids = [f"j{i}" for i in range(10)]
    await storage.enqueue(q, [job(i) for i in ids])
    await claim(storage, q, n=10)
    done = [settlement(SettleKind.COMPLETE, q, i, b'"r"', ttl=60)._replace(keep=3) for i in ids[:8]]
    assert await storage.settle(q, W1, done) == [True] * 8
    assert (await storage.counts(q))["completed"] == 3
    assert [r is not None for r in await storage.get_jobs(q, ids[:8])] == [False] * 5 + [True] * 3
    error = b'{"type":"E","message":"m","traceback":""}'
    bad = [settlement(SettleKind.FAIL, q, i, error, ttl=60)._replace(keep=1) for i in ids[8:]]
    assert await storage.settle(q, W1, bad) == [True, True]
    counts = await storage.counts(q)
    assert (counts["completed"], counts["failed"]) == (3, 1)
    assert await storage.get_job(q, "j8") is None and await storage.get_job(q, "j9") is not None
    # without keep: nothing is counted out
    await storage.enqueue(q, [job("k1"), job("k2")])
    await claim(storage, q, n=2)
    await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, i, b"1", ttl=60) for i in ("k1", "k2")])
    assert (await storage.counts(q))["completed"] == 5


@pytest.mark.capability("Trees")
async def test_keep_does_not_count_out_the_children_a_parent_still_needs(storage: Storage, queue_name: str) -> None:
    from trioqueue import Child

    if hasattr(storage, "keep_every"):
        storage.keep_every = 1

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "parent":
            return await job.children_results()
        return job.payload

    async with Queue(storage, name=queue_name, handler=handler, keep_completed=0, concurrency=3, **FAST) as q:
        children = [Child(f"kid-{i}", i) for i in range(3)]
        with trio.fail_after(30):
            result = await q.enqueue_and_wait("parent", "parent", children=children)
    assert result == {"kid-0": 0, "kid-1": 1, "kid-2": 2}


async def test_keep_forgets_older_jobs_never_the_one_that_just_completed(storage: Storage, queue_name: str) -> None:
    """A tree of three jobs (kept by their TTL), then three plain jobs, ``keep_completed=2``:
    the count forgets the oldest plain job, never the newest (its id would be free again:
    a producer's retried enqueue would run it twice)."""
    from trioqueue import Child

    if hasattr(storage, "keep_every"):
        storage.keep_every = 1

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "parent":
            return await job.children_results()
        return job.payload

    async with Queue(storage, name=queue_name, handler=handler, keep_completed=2, **FAST) as q:
        with trio.fail_after(30):
            await q.enqueue_and_wait("parent", "parent", children=[Child("kid-0", 0), Child("kid-1", 1)])
            for jid in ("p1", "p2", "p3"):  # one at a time: each ends after the previous one
                assert await q.enqueue_and_wait(jid, jid) == jid
                status = await q.get_status(jid)
                assert status is not None and status.state is JobState.COMPLETED  # the job just completed: kept
                assert (await q.enqueue(jid, "again")).status.value == "completed"  # not run twice
    async with Queue(storage, name=queue_name) as q:
        statuses = await q.get_statuses(["parent", "kid-0", "kid-1", "p1", "p2", "p3"])
        assert [s is not None for s in statuses] == [True, True, True, False, True, True]


@pytest.mark.capability("Administration", "Trees")
async def test_clearing_a_parents_queue_leaves_its_children_elsewhere_working(storage: Storage, queue_name: str) -> None:
    """A tree across queues: the parent's queue is cleared while a child on another
    queue waits; the child still runs and ends, and nothing crashes."""
    from trioqueue import Child

    parents, kids = f"p{{{queue_name}}}", f"k{{{queue_name}}}"  # (one Cluster slot)
    release = trio.Event()

    async def child(job: Job[Any]) -> Any:
        await release.wait()
        return job.payload

    done = Recorder()
    async with Queue(storage, name=kids, handler=child, **FAST) as kq, Queue(storage, name=parents, **FAST) as pq:
        kq.on("completed", done)
        await pq.enqueue("parent", 0, children=[Child("kid", 1, queue=kids)])
        assert await pq.clear() == 1
        release.set()
        with trio.fail_after(20):
            await done.wait_for("completed", "kid")
        assert (await kq.get_status("kid")).state is JobState.COMPLETED  # type: ignore[union-attr]
        assert await pq.get_status("parent") is None
        assert (await kq.enqueue_and_wait("after", 2, timeout=20)) == 2


@pytest.mark.capability("Administration", "Trees")
async def test_clearing_a_queue_settles_parents_and_dependents_on_other_queues(storage: Storage, queue_name: str) -> None:
    """A cleared queue's unfinished jobs count as cancelled for their parents and their
    dependents on other queues, as ``remove`` counts one (they waited in
    ``waiting_children`` for ever on every backend): under the default "cancel" both fail
    with ChildJobFailedError."""
    from trioqueue import Child, JobRef

    parents, kids = f"p{{{queue_name}}}", f"k{{{queue_name}}}"  # (one Cluster slot)
    ended = Recorder()
    async with Queue(storage, name=kids, **FAST) as kq, Queue(storage, name=parents, **FAST) as pq:
        pq.on("failed", ended)
        await pq.enqueue("parent", 0, children=[Child("kid", 1, queue=kids, options={"delay": 3600})])
        await kq.enqueue("dep", 2, delay=3600)
        await pq.enqueue("dependent", 3, depends_on=[JobRef(kids, "dep")])
        assert await kq.clear() == 2
        with trio.fail_after(10):
            await ended.wait_for("failed", "parent")
            await ended.wait_for("failed", "dependent")
        for job_id in ("parent", "dependent"):
            status = await pq.get_status(job_id)
            assert status is not None and status.state is JobState.FAILED, (job_id, status)
            assert status.error is not None and status.error.type == "ChildJobFailedError", status.error
