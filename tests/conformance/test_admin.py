"""Storage conformance suite, part 3: job registry queries and administration (counts,
listing with cursors, retry of failed jobs, purge, remove), on every backend, through the
Storage interface and the Queue API. tests/backends/redis/test_redis_cluster.py runs them on a cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from trioqueue import Job, JobPage, JobState, Queue, Storage, ValidationError
from trioqueue._core import parse_state
from trioqueue.storage import NewJob, SettleKind, StorageEvent

from support import Recorder
from storage_helpers import W1, claim, job, kind, settlement

ERR = b'{"type":"ValueError","message":"bad","traceback":""}'
ALL_STATES = {"queued", "delayed", "processing", "failing", "completed", "failed", "cancelled", "waiting_children", "waiting_signal"}


def delayed(job_id: str) -> NewJob:
    return job(job_id)._replace(run_at=time.time() + 3600)


async def list_all(storage: Storage, q: str, state: str, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    for _ in range(1000):
        page, cursor = await storage.list_jobs(q, state, limit=limit, cursor=cursor)
        assert len(page) <= limit
        ids += [r.id for r in page]
        if cursor is None:
            return ids
        assert page, "a page with a next cursor must not be empty"
    raise AssertionError("list_jobs never ended")


async def test_counts_follow_transitions(storage: Storage, queue_name: str) -> None:
    assert await storage.counts(queue_name) == dict.fromkeys(ALL_STATES, 0)
    await storage.enqueue(queue_name, [job("a"), job("b"), job("c"), job("x"), delayed("d")])
    assert await storage.counts(queue_name) == {**dict.fromkeys(ALL_STATES, 0), "queued": 4, "delayed": 1}
    await claim(storage, queue_name, n=3)
    counts = await storage.counts(queue_name)
    assert (counts["queued"], counts["processing"]) == (1, 3)
    await storage.settle(
        queue_name,
        W1,
        [
            settlement(SettleKind.COMPLETE, queue_name, "a", b"1", ttl=60),
            settlement(SettleKind.RETRY, queue_name, "b", ERR, delay=3600),
            settlement(SettleKind.FAIL, queue_name, "c", ERR, ttl=60),
        ],
    )
    await storage.cancel(queue_name, "d")
    assert await storage.counts(queue_name) == {
        "queued": 1,
        "delayed": 0,
        "processing": 0,
        "failing": 1,
        "completed": 1,
        "failed": 1,
        "cancelled": 1,
        "waiting_children": 0,
        "waiting_signal": 0,
    }


async def test_list_jobs_newest_first_paged_and_stable(storage: Storage, queue_name: str) -> None:
    ids = [f"j{i:02}" for i in range(25)]
    for i in range(0, 25, 5):  # several calls: several entry times, ties within each
        await storage.enqueue(queue_name, [job(j) for j in ids[i : i + 5]])
    assert await list_all(storage, queue_name, "queued", 7) == ids[::-1]

    page, cursor = await storage.list_jobs(queue_name, "queued", limit=10)
    assert [r.id for r in page] == ids[::-1][:10]
    assert all(kind(r.state) == "queued" and r.attempts == 0 for r in page)
    # Jobs come and go between pages: new ones are not listed (they are newer than the
    # first page), one that left the state is not, the others are listed once each.
    await storage.enqueue(queue_name, [job("new1"), job("new2")])
    [first] = await claim(storage, queue_name, n=1)  # FIFO: the oldest, j00
    assert first.id == "j00"
    rest: list[str] = []
    while cursor is not None:
        page, cursor = await storage.list_jobs(queue_name, "queued", limit=10, cursor=cursor)
        rest += [r.id for r in page]
    assert rest == ids[::-1][10:24]
    assert (await storage.list_jobs(queue_name, "queued", limit=3))[0][0].id == "new2"
    assert [r.id for r in (await storage.list_jobs(queue_name, "processing"))[0]] == ["j00"]
    assert await storage.list_jobs(queue_name, "failed") == ([], None)


async def test_list_jobs_exact_page_ends_with_none(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("a"), job("b")])
    page, cursor = await storage.list_jobs(queue_name, "queued", limit=2)
    assert [r.id for r in page] == ["b", "a"] and cursor is None


async def test_list_jobs_of_terminal_states_carry_outcomes(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("ok"), job("bad")])
    await claim(storage, queue_name)
    await storage.settle(
        queue_name,
        W1,
        [
            settlement(SettleKind.COMPLETE, queue_name, "ok", b'{"r":1}', ttl=60),
            settlement(SettleKind.FAIL, queue_name, "bad", ERR, ttl=60),
        ],
    )
    [done], _ = await storage.list_jobs(queue_name, "completed")
    assert (done.id, done.result, done.attempts) == ("ok", b'{"r":1}', 1)
    [bad], _ = await storage.list_jobs(queue_name, "failed")
    assert (bad.id, bad.error, bad.token) == ("bad", ERR, "t-bad")


@pytest.mark.capability("Administration")
async def test_retry_job_enqueues_a_failed_job_again(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("f", b'{"n":1}'), job("c")])
    await storage.cancel(queue_name, "c")
    [c] = await claim(storage, queue_name)
    await storage.settle(queue_name, W1, [settlement(SettleKind.FAIL, queue_name, "f", ERR, ttl=60)])
    async with storage.subscribe(queue_name) as events:
        assert await storage.retry_job(queue_name, "f", "t-f2") is True
        with trio.fail_after(10):
            batch = await events.receive()
    assert StorageEvent("enqueued", "f", token="t-f2") in batch
    rec = await storage.get_job(queue_name, "f")
    assert rec is not None and kind(rec.state) == "queued" and rec.attempts == 0 and rec.token == "t-f2"
    assert rec.error is None
    assert await storage.retry_job(queue_name, "f", "t-f3") is False  # queued now
    assert await storage.retry_job(queue_name, "nope", "t") is False
    assert await storage.retry_job(queue_name, "c", "t-c2") is True  # cancelled: also retried
    claims = await claim(storage, queue_name)
    assert [(x.id, x.attempts) for x in claims] == [("f", 1), ("c", 1)]
    assert claims[0].envelope == c.envelope  # the original payload
    assert await claim(storage, queue_name) == []  # no stale copy left behind
    assert (await storage.counts(queue_name))["processing"] == 2


@pytest.mark.capability("Administration")
async def test_purge_by_age(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("old1"), job("old2"), job("new"), job("other")])
    await claim(storage, queue_name)
    done = [settlement(SettleKind.COMPLETE, queue_name, j, b"1", ttl=600) for j in ("old1", "old2")]
    await storage.settle(queue_name, W1, [*done, settlement(SettleKind.FAIL, queue_name, "other", ERR, ttl=600)])
    await trio.sleep(1.0)  # ages apart: nothing announces that time has passed
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "new", b"1", ttl=600)])
    recs = {j: await storage.get_job(queue_name, j) for j in ("old2", "new")}
    ms = {j: parse_state(r.state)[1] for j, r in recs.items() if r is not None}
    middle = (ms["old2"] + ms["new"]) / 2000
    assert await storage.purge(queue_name, "completed", older_than=time.time() - middle) == 2
    assert await storage.get_job(queue_name, "old1") is None and await storage.get_job(queue_name, "old2") is None
    assert await storage.get_job(queue_name, "new") is not None
    assert await storage.purge(queue_name, "completed", older_than=3600) == 0
    assert await storage.purge(queue_name, "completed") == 1
    assert await storage.purge(queue_name, "failed") == 1
    assert await storage.counts(queue_name) == dict.fromkeys(ALL_STATES, 0)
    [again] = await storage.enqueue(queue_name, [job("old1")])  # forgotten: a new job
    assert again.status == "queued"


async def test_expired_jobs_leave_listings_counts_and_lookups(storage: Storage, queue_name: str) -> None:
    """Finished jobs whose TTL ran out are gone from get_job, listings and counts after a
    reaper pass, whatever the order in which their TTLs run out."""
    await storage.enqueue(queue_name, [job("keep"), job("short"), job("bad"), job("x", ttl=0.2)])
    await claim(storage, queue_name, n=3)
    await storage.settle(
        queue_name,
        W1,
        [
            settlement(SettleKind.COMPLETE, queue_name, "keep", b"1", ttl=60),
            settlement(SettleKind.COMPLETE, queue_name, "short", b"2", ttl=0.2),
            settlement(SettleKind.FAIL, queue_name, "bad", ERR, ttl=0.2),
        ],
    )
    assert await storage.cancel(queue_name, "x") == "cancelled"  # kept for the job's own TTL
    counts = await storage.counts(queue_name)
    assert (counts["completed"], counts["failed"], counts["cancelled"]) == (2, 1, 1)
    await trio.sleep(0.35)  # the short TTLs run out: nothing announces it
    await storage.recover_stalled(queue_name)  # a reaper pass (sweeps what expired)
    assert [r.id for r in (await storage.list_jobs(queue_name, "completed"))[0]] == ["keep"]
    assert await storage.list_jobs(queue_name, "failed") == ([], None)
    assert await storage.list_jobs(queue_name, "cancelled") == ([], None)
    assert await storage.counts(queue_name) == {**dict.fromkeys(ALL_STATES, 0), "completed": 1}
    for gone in ("short", "bad", "x"):
        assert await storage.get_job(queue_name, gone) is None
    rec = await storage.get_job(queue_name, "keep")
    assert rec is not None and rec.result == b"1" and rec.token == "t-keep" and rec.attempts == 1


@pytest.mark.capability("Administration")
async def test_purge_by_age_with_mixed_ttls(storage: Storage, queue_name: str) -> None:
    """An older job that is kept longer than a newer one is still the one purged by age."""
    await storage.enqueue(queue_name, [job("old"), job("new")])
    await claim(storage, queue_name)
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "old", b"1", ttl=600)])
    await trio.sleep(0.05)  # ms apart: nothing announces that time has passed
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "new", b"1", ttl=30)])
    recs = {j: await storage.get_job(queue_name, j) for j in ("old", "new")}
    ms = {j: parse_state(r.state)[1] for j, r in recs.items() if r is not None}
    assert await storage.purge(queue_name, "completed", older_than=time.time() - (ms["old"] + ms["new"]) / 2000) == 1
    assert await storage.get_job(queue_name, "old") is None and await storage.get_job(queue_name, "new") is not None


@pytest.mark.capability("Administration")
async def test_purge_many_in_slices(storage: Storage, queue_name: str) -> None:
    n = 1200
    await storage.enqueue(queue_name, [job(f"p{i}") for i in range(n)])
    claims = await claim(storage, queue_name, n=n)
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, c.id, b"1", ttl=600) for c in claims])
    assert await storage.purge(queue_name, "completed") == n
    assert (await storage.counts(queue_name))["completed"] == 0
    assert await storage.list_jobs(queue_name, "completed") == ([], None)


@pytest.mark.capability("Administration")
async def test_remove_job(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("q1"), job("q2"), job("run"), job("retry"), delayed("later")])
    assert await storage.remove_job(queue_name, "q1") is True
    [r] = await claim(storage, queue_name, n=1)
    assert r.id == "q2"
    await claim(storage, queue_name, n=2)  # run, retry
    await storage.settle(queue_name, W1, [settlement(SettleKind.RETRY, queue_name, "retry", ERR, delay=0)])
    assert await storage.remove_job(queue_name, "run") is False  # processing
    assert await storage.remove_job(queue_name, "nope") is False
    async with storage.subscribe(queue_name) as events:
        assert await storage.remove_job(queue_name, "retry") is True  # failing, due at once
        with trio.fail_after(10):
            batch = await events.receive()
    assert [e.kind for e in batch if e.job_id == "retry"] == ["removed"]
    assert await storage.remove_job(queue_name, "later") is True
    for jid in ("q1", "retry", "later"):
        assert await storage.get_job(queue_name, jid) is None
    assert await claim(storage, queue_name) == []  # none of them is ever claimed
    await storage.settle(queue_name, W1, [settlement(SettleKind.COMPLETE, queue_name, "q2", b"1", ttl=60)])
    assert await storage.remove_job(queue_name, "q2") is True  # a terminal one too
    counts = await storage.counts(queue_name)
    assert counts == {**dict.fromkeys(ALL_STATES, 0), "processing": 1}
    [again] = await storage.enqueue(queue_name, [job("q1")])
    assert again.status == "queued"


@pytest.mark.capability("Administration")
async def test_queue_names(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name + "-a", [job("x")])
    await storage.enqueue(queue_name + "-b", [job("x")])
    names = await storage.queue_names()
    assert {queue_name + "-a", queue_name + "-b"} <= set(names)
    assert names == sorted(names)


# -- the Queue API -------------------------------------------------------------------------


@pytest.mark.capability("Administration")
async def test_queue_retry_reruns_a_failed_job_end_to_end(storage: Storage, queue_name: str) -> None:
    runs: list[int] = []

    async def handler(job: Job[Any]) -> Any:
        runs.append(job.attempts)
        if len(runs) == 1:
            raise ValueError("first run fails")
        return {"n": job.payload["n"], "attempt": job.attempts}

    recorder = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, max_attempts=1, block_timeout=0.5) as q:
        q.on("failed", recorder)
        q.on("completed", recorder)
        await q.enqueue("j", {"n": 7})
        with trio.fail_after(10):
            await recorder.wait_for("failed", "j")
        page = await q.list_jobs("failed")
        assert isinstance(page, JobPage) and page.cursor is None
        [status] = page.jobs
        assert status.id == "j" and status.state is JobState.FAILED and status.error is not None
        assert status.error.message == "first run fails"
        assert (await q.counts())[JobState.FAILED] == 1
        assert await q.retry("j") is True
        with trio.fail_after(10):
            await recorder.wait_for("completed", "j")
        assert await q.get_result("j") == {"n": 7, "attempt": 1}  # attempts reset
        assert await q.retry("j") is False  # completed
        counts = await q.counts()
        assert set(counts) == set(JobState) and counts[JobState.COMPLETED] == 1 and counts[JobState.FAILED] == 0
        assert await q.purge(JobState.COMPLETED) == 1
        assert await q.get_status("j") is None


@pytest.mark.capability("Administration")
async def test_queue_list_remove_and_validation(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as q:  # a producer: nothing runs
        for i in range(5):
            await q.enqueue(f"k{i}", i)
        page = await q.list_jobs(JobState.QUEUED, limit=2)
        assert [s.id for s in page.jobs] == ["k4", "k3"] and page.cursor is not None
        page = await q.list_jobs("queued", limit=2, cursor=page.cursor)
        assert [s.id for s in page.jobs] == ["k2", "k1"]
        assert all(s.state is JobState.QUEUED and s.attempts == 0 for s in page.jobs)
        assert await q.remove("k4") is True
        assert await q.remove("k4") is False
        assert [s.id for s in (await q.list_jobs("queued")).jobs] == ["k3", "k2", "k1", "k0"]
        with pytest.raises(ValidationError, match="unknown state 'done'.*queued, processing"):
            await q.list_jobs("done")
        with pytest.raises(ValidationError, match="unknown state 'queued'.*completed, failed, cancelled"):
            await q.purge("queued")
        with pytest.raises(ValidationError, match="limit"):
            await q.list_jobs("queued", limit=0)
        with pytest.raises(ValidationError, match="older_than"):
            await q.purge("failed", older_than=-1)
        with pytest.raises(ValidationError, match="cursor"):
            await q.list_jobs("queued", cursor="not a cursor")


async def test_bad_state_or_cursor_is_refused(storage: Storage, queue_name: str) -> None:
    await storage.enqueue(queue_name, [job("a")])
    with pytest.raises(ValueError, match="unknown state 'done'"):
        await storage.list_jobs(queue_name, "done")
    with pytest.raises(ValueError, match="unknown state 'queued'"):
        await storage.purge(queue_name, "queued")
    with pytest.raises(ValueError, match="invalid cursor"):
        await storage.list_jobs(queue_name, "queued", cursor="garbage")
    assert (await storage.counts(queue_name))["queued"] == 1


async def test_memory_state_index_stays_proportional_to_live_jobs() -> None:
    """MemoryStorage's per-state logs drop their stale entries (no growth with churn)."""
    from trioqueue import MemoryStorage
    from trioqueue.storage.memory._index import _SLACK

    storage = MemoryStorage()
    async with storage:
        for round_ in range(4):
            ids = [f"r{round_}-{i}" for i in range(1500)]
            await storage.enqueue("q", [job(j, ttl=0.001) for j in ids])
            claims = await claim(storage, "q", n=1500)
            await storage.settle("q", W1, [settlement(SettleKind.COMPLETE, "q", c.id, b"1", ttl=0.001) for c in claims])
            await trio.sleep(0.01)  # the results expire
        counts = await storage.counts("q")
        assert counts == dict.fromkeys(ALL_STATES, 0)
        index = storage._queues.queues["q"].index
        assert all(len(log) <= _SLACK for log in index.logs.values()), {k: len(v) for k, v in index.logs.items()}


@pytest.mark.capability("Administration")
async def test_removing_a_waited_job_wakes_its_waiter(storage: Storage, queue_name: str) -> None:
    """``enqueue_and_wait`` on a job that is then removed must not wait out its timeout: the
    job will never run, so the waiter hears so at once (JobCancelledError saying removed)."""
    from trioqueue import JobCancelledError

    async with Queue(storage, name=queue_name) as q:
        outcome: list[BaseException] = []

        async def waiter() -> None:
            try:
                await q.enqueue_and_wait("w", {"n": 1}, timeout=3600)
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                outcome.append(exc)

        async with q.events("enqueued", job_ids=["w"]) as stream:
            with trio.fail_after(10):  # the nursery waits for the waiter to return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter)
                    async for _ in stream:
                        break
                    assert await q.remove("w")
    assert isinstance(outcome[0], JobCancelledError) and "removed" in str(outcome[0])
