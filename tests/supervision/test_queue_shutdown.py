"""Storage conformance suite, part 2 (continued): stopping a Queue.

Graceful and forced stops (running jobs finish or go back; prefetched claims, and claims
started ahead by the pace, are handed back with their attempts refunded; claims landing
after a stop go back at once), an exception raised in the ``async with`` body, and a
Queue run as a service with ``nursery.start``. Every backend.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, JobState, Queue, QueueEvent, Storage, TrioQueueError

from queue_helpers import FAST, echo


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


@pytest.mark.parametrize("reply", ["uncancellable", "cancellable"])
async def test_claims_landing_after_a_graceful_stop_go_back_at_once(reply: str) -> None:
    """A claim in flight when ``stop()`` came landed in the buffer after stop had given
    the buffer back: its jobs stayed held (neither run nor returned) until the last
    running handler finished, however long that took. And a graceful stop cancelled the
    claim call in flight: on a server, one whose request was served (the jobs moved to
    this worker) and whose reply was on its way left them held, unseen, as long (seen on
    Postgres in CI). The call is let finish; its jobs go back at once."""
    from trioqueue.storage import MemoryStorage
    from trioqueue.testing import FaultyStorage

    class SlowReplies(FaultyStorage):
        """MemoryStorage (wrapped, without its claims handed over in process:
        FaultyStorage withholds NonBlockingStart) whose armed claim, once it took its
        jobs, waits for ``land`` before returning: uncancellable (a request sent), or
        cancellable (a reply on its way, lost if the call is cancelled)."""

        def __init__(self) -> None:
            super().__init__(MemoryStorage())
            self.armed = False
            self.in_flight, self.land = trio.Event(), trio.Event()

        async def dequeue(self, *args: Any, **kwargs: Any) -> Any:
            claims = await super().dequeue(*args, **kwargs)
            if self.armed and claims:
                self.in_flight.set()
                with trio.CancelScope(shield=reply == "uncancellable"):
                    await self.land.wait()
            return claims

    storage = SlowReplies()
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


async def test_a_claim_cancelled_in_flight_by_a_forced_stop_gives_its_attempts_back() -> None:
    """A forced stop that cancels a claim whose request was served (the server moved and
    started the jobs; the reply never reached the worker, as a Postgres or Redis claim
    cancelled mid-flight): none of those jobs reached a handler, so they go back with
    their attempts taken back, as the buffered ones do. (They went back with one attempt
    spent: seen on Postgres in CI.)"""
    from trioqueue.storage import MemoryStorage
    from trioqueue.testing import FaultyStorage

    class LostReplies(FaultyStorage):
        """MemoryStorage (wrapped, without its claims handed over in process:
        FaultyStorage withholds NonBlockingStart) whose armed claim, once a call that
        starts its claims is waiting, takes its jobs, then waits (cancellably) for a reply
        that never comes."""

        def __init__(self) -> None:
            super().__init__(MemoryStorage())
            self.armed = False
            self.starting, self.in_flight = trio.Event(), trio.Event()

        async def dequeue(self, queue: str, worker_id: str, max_jobs: int, *args: Any) -> Any:
            timeout, lease, start, limits = args
            if self.armed and start:
                self.starting.set()
            claims = await super().dequeue(queue, worker_id, max_jobs, timeout, lease, start, limits)
            if self.armed and start and claims:
                self.in_flight.set()
                await trio.sleep_forever()
            return claims

    storage = LostReplies()
    forever, started = never_finishing()
    async with storage, Queue(storage, name="q") as producer:
        await producer.enqueue("running", 0)
        consumer = Queue(storage, name="q", handler=forever, concurrency=2, prefetch=1, **FAST)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.run)
                await started.wait()
                storage.armed = True
                await storage.starting.wait()  # the idle worker's claim, waiting for a job
                await producer.enqueue("unseen", 0)
                await storage.in_flight.wait()  # moved and started; the reply never comes
                assert (await producer.get_status("unseen")).attempts == 1
                nursery.cancel_scope.cancel()
        unseen = await producer.get_status("unseen")
        assert unseen.state is JobState.QUEUED and unseen.attempts == 0, unseen
        running = await producer.get_status("running")  # its handler ran: the attempt stays
        assert running.state is JobState.QUEUED and running.attempts == 1, running


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
