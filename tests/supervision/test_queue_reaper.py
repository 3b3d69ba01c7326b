"""Storage conformance suite, part 2 (continued): stalled jobs and the reaper.

The job of a dead worker is recovered and runs again, the long job of a live worker is
not, and the reaper's leader election fails over (when the leader stops, and when it died
holding the lock). Every backend.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
import trio

from trioqueue import Job, LeaderElection, Queue, QueueEvent, Reaper, Storage
from trioqueue.storage import NewJob

from queue_helpers import FAST, echo
from support import Recorder


def _raw_job(job_id: str) -> NewJob:
    from trioqueue._core import encode_envelope

    return NewJob(job_id, encode_envelope(job_id, b"null", 0, 0, 3, 60_000), 3, 60.0)


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


async def test_the_reaper_logs_the_jobs_it_recovers(storage: Storage, queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """A worker recovering expired jobs says so in its log: how many, of which queue."""
    caplog.set_level(logging.INFO, logger="trioqueue")
    await storage.heartbeat(queue_name, "dead-worker", 0.3, [], 0.3)
    await storage.enqueue(queue_name, [_raw_job("orphan")])
    await storage.dequeue(queue_name, "dead-worker", 1, 1.0, 0.3)
    async with Queue(storage, name=queue_name, handler=echo, visibility_timeout=1.0, **FAST) as q:
        with trio.fail_after(15):
            await q.enqueue_and_wait("orphan", None)
    [record] = [r for r in caplog.records if "stalled" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"recovered 1 stalled job of queue {queue_name!r} (a lease or a worker's heartbeat expired): 1 requeued"
    )


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
