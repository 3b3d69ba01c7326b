"""Debounce and deduplication windows (``enqueue(..., debounce=, max_wait=)`` and
``dedup_window=``), conformance on every backend: a burst of enqueues of one id runs once,
with the last payload, ``debounce`` seconds after the last enqueue (never later than
``max_wait`` after the first); an id stays a duplicate for ``dedup_window`` seconds after
its job ended, whatever its result TTL."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import EnqueueStatus, Job, JobState, Queue, Storage, ValidationError
from support import Recorder

FAST: dict[str, Any] = {"retry_delay": 0, "block_timeout": 0.2}


def runner() -> tuple[Any, list[tuple[str, Any, float]]]:
    runs: list[tuple[str, Any, float]] = []

    async def handler(job: Job[Any]) -> Any:
        runs.append((job.id, job.payload, time.time()))
        return job.payload

    return handler, runs


@pytest.mark.capability("Debounce")
async def test_a_burst_of_enqueues_runs_once_with_the_last_payload_after_the_last_enqueue(
    storage: Storage, queue_name: str
) -> None:
    handler, runs = runner()
    events = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        q.on("completed", events)
        statuses = []
        with trio.fail_after(10):
            for i in range(50):  # (each within 1 s of the last, however loaded the machine)
                last = time.time()  # (before the call: the storage's now is later)
                statuses.append((await q.enqueue("doc-1", {"edit": i}, debounce=1.0)).status)
            await events.wait_for("completed", "doc-1")
        assert statuses[0] is EnqueueStatus.QUEUED and set(statuses[1:]) == {EnqueueStatus.DEBOUNCED}
        assert [(jid, payload) for jid, payload, _ in runs] == [("doc-1", {"edit": 49})]
        assert runs[0][2] >= last + 1.0 - 0.005  # (storage clocks keep milliseconds)
        status = await q.get_status("doc-1")
        assert status is not None and status.state is JobState.COMPLETED and status.result == {"edit": 49}
        assert status.attempts == 1


@pytest.mark.capability("Debounce")
async def test_max_wait_bounds_how_long_a_debounced_job_waits(storage: Storage, queue_name: str) -> None:
    handler, runs = runner()
    events = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        q.on("completed", events)
        with trio.fail_after(10):
            first = time.time()
            await q.enqueue("feed", 0, debounce=0.4, max_wait=0.6)
            i = 0
            while not runs:  # enqueues every 0.1 s: without max_wait it would never run
                i += 1
                assert (await q.enqueue("feed", i, debounce=0.4, max_wait=0.6)).status in (
                    EnqueueStatus.DEBOUNCED,
                    EnqueueStatus.DUPLICATE,  # (claimed already: the run began)
                )
                await trio.sleep(0.1)  # the producer's pace is what is tested
            await events.wait_for("completed", "feed")
        assert len(runs) == 1 and first + 0.6 - 0.005 <= runs[0][2] < first + 0.6 + 2.0
        assert runs[0][1] >= 4  # it took the payloads enqueued until it was due


@pytest.mark.capability("Debounce")
async def test_a_debounced_enqueue_of_a_queued_job_replaces_its_payload(storage: Storage, queue_name: str) -> None:
    """Due already (no worker yet): the waiting job takes the new payload and stays
    queued; a job that is running is not waiting: the enqueue is a duplicate."""
    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("q", "first")
        result = await producer.enqueue("q", "second", debounce=5.0)
        assert result.status is EnqueueStatus.DEBOUNCED and result.existing_state is JobState.QUEUED
        started, release = trio.Event(), trio.Event()

        async def gated(job: Job[Any]) -> Any:
            started.set()
            await release.wait()
            return job.payload

        worker = Queue(storage, name=queue_name, handler=gated, **FAST)
        events = Recorder()
        worker.on("completed", events)
        async with worker:
            with trio.fail_after(10):
                await started.wait()
                assert (await producer.enqueue("q", "third", debounce=5.0)).status is EnqueueStatus.DUPLICATE
                release.set()
                await events.wait_for("completed", "q")
        status = await producer.get_status("q")
        assert status is not None and status.result == "second"


@pytest.mark.capability("Debounce")
async def test_enqueue_and_wait_with_debounce_joins_the_waiting_job(storage: Storage, queue_name: str) -> None:
    handler, runs = runner()
    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        results: list[Any] = []

        async def wait() -> None:
            results.append(await q.enqueue_and_wait("w", "the waiter's", debounce=0.5, timeout=10))

        with trio.fail_after(10):
            assert (await q.enqueue("w", "first", debounce=0.5)).status is EnqueueStatus.QUEUED
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                while b"the waiter's" not in (await storage.get_envelope(queue_name, "w") or b""):
                    await trio.sleep(0.01)  # (its enqueue landed: no event says so)
                assert (await q.enqueue("w", "last", debounce=0.5)).status is EnqueueStatus.DEBOUNCED
        assert results == ["last"] and [payload for _, payload, _ in runs] == ["last"]


@pytest.mark.capability("Debounce")
async def test_the_storage_debounces_each_job_of_a_batch_in_order(storage: Storage, queue_name: str) -> None:
    """Storage level: the same id twice in one call, the second debounces the first."""
    from storage_helpers import job

    out = await storage.debounce(queue_name, [job("a", b'{"v":1}'), job("b"), job("a", b'{"v":2}')], 30.0, None)
    assert [o.status for o in out] == [EnqueueStatus.QUEUED, EnqueueStatus.QUEUED, EnqueueStatus.DEBOUNCED]
    rec = await storage.get_job(queue_name, "a")
    assert rec is not None and rec.state.startswith("delayed:") and rec.token == out[2].token == "t-a"
    envelope = await storage.get_envelope(queue_name, "a")
    assert envelope is not None and b'{"v":2}' in envelope


async def test_an_id_stays_a_duplicate_for_its_dedup_window_after_it_ended(storage: Storage, queue_name: str) -> None:
    handler, runs = runner()
    events = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("t", 1, result_ttl=0.05, dedup_window=60.0)
            await events.wait_for("completed", "t")
        again = await q.enqueue("t", 2, result_ttl=0.05, dedup_window=60.0)
        assert again.status is EnqueueStatus.COMPLETED and again.result == 1  # not run again
        assert len(runs) == 1
        # without a window, a result TTL this short forgets the id at once
        with trio.fail_after(10):
            await q.enqueue("u", 1, result_ttl=0.05)
            await events.wait_for("completed", "u")
            while (await q.enqueue("u", 2, result_ttl=0.05)).status is not EnqueueStatus.QUEUED:
                await trio.sleep(0.02)  # (until its TTL ran out: a timer is what is tested)
            await events.wait_for("completed", "u", count=2)


@pytest.mark.capability("Debounce")
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"debounce": 0}, "debounce must be finite and > 0, got 0.0 (job 'x')"),
        ({"max_wait": 5}, "max_wait needs debounce (job 'x')"),
        ({"debounce": 1, "max_wait": -1}, "max_wait must be finite and > 0"),
        ({"debounce": 1, "delay": 5}, "debounce cannot be combined with delay, at, children or depends_on (job 'x')"),
        ({"dedup_window": "1m"}, "dedup_window must be a number of seconds, got str (job 'x')"),
    ],
)
async def test_debounce_options_are_validated_and_nothing_is_written(
    storage_free_memory: Storage, options: dict[str, Any], message: str
) -> None:
    async with Queue(storage_free_memory, name="q") as q:
        with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            await q.enqueue("x", 1, **options)
        assert await q.get_status("x") is None



@pytest.mark.capability("Debounce", "Groups")
async def test_a_debounced_job_of_a_group_runs_in_its_group(storage: Storage, queue_name: str) -> None:
    """Debounce and groups together: the debounced job enters its group's lane when due
    (Redis: the debounce script lacked the groups' fragment, and failed on a group)."""
    handler, runs = runner()
    events = Recorder()
    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        q.on("completed", events)
        with trio.fail_after(10):
            assert (await q.enqueue("d", 1, debounce=0.2, group="tenant")).status is EnqueueStatus.QUEUED
            assert (await q.enqueue("d", 2, debounce=0.2, group="tenant")).status is EnqueueStatus.DEBOUNCED
            await events.wait_for("completed", "d")
        status = await q.get_status("d")
        assert status is not None and status.group == "tenant" and status.result == 2
        assert [payload for _, payload, _ in runs] == [2]


@pytest.mark.capability("Debounce")
async def test_concurrent_debounces_of_a_new_id_create_it_once_and_debounce_it(storage: Storage, queue_name: str) -> None:
    """Storage level: producers debouncing the same new id at the same moment (their
    calls in flight together, on connections of their own where the backend has them):
    one creates the job, every other debounces it (none is told ``duplicate``: its
    payload would be dropped), and the job keeps one of their payloads."""
    from storage_helpers import job

    for r in range(4):
        jid = f"n{r}"
        outs: list[Any] = []

        async def debounce(i: int, jid: str = jid, outs: list[Any] = outs) -> None:
            (out,) = await storage.debounce(queue_name, [job(jid, b'{"v":%d}' % i, token=f"t{i}")], 30.0, None)
            outs.append(out)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(debounce, i)
        statuses = sorted(o.status.value for o in outs)
        assert statuses == ["debounced"] * 5 + ["queued"], (jid, statuses)
        rec = await storage.get_job(queue_name, jid)
        assert rec is not None and rec.state.startswith("delayed:")
        assert {o.token for o in outs if o.status is EnqueueStatus.DEBOUNCED} == {rec.token}


@pytest.mark.capability("Debounce")
async def test_a_debounce_racing_an_uncommitted_insert_of_its_id_debounces_it(pg: Any, queue_name: str) -> None:
    """PostgreSQL, the race made certain: another transaction has inserted the id, not yet
    committed, when a debounce of it starts. The debounce waits for it and, once it
    commits, debounces the job it created (its payload kept), instead of answering
    ``duplicate`` and dropping its payload."""
    from postgres_server import wait_for_lock_wait
    from storage_helpers import job

    outs: list[Any] = []

    async def debounce() -> None:
        outs.extend(await pg.debounce(queue_name, [job("d", b'{"v":"second"}', token="t2")], 30.0, None))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:
                first = job("d", b'{"v":"first"}', token="t1")._replace(run_at=time.time() + 30)
                await pg.enqueue_in_transaction(queue_name, [first], tx)
                nursery.start_soon(debounce)
                await wait_for_lock_wait(pg)  # (the debounce waits on the uncommitted row)
    assert [o.status for o in outs] == [EnqueueStatus.DEBOUNCED] and outs[0].token == "t1"
    envelope = await pg.get_envelope(queue_name, "d")
    assert envelope is not None and b'"second"' in envelope
