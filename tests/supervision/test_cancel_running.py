"""Cancelling a running job through the Queue API (conformance: every backend)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from trioqueue import CancelStatus, Job, JobCancelledError, JobState, Queue, Storage
from trioqueue.storage import NonBlockingStart
from trioqueue.testing import FaultyStorage

from support import Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_cancel_reaches_the_running_handler_of_another_process_queue(storage: Storage, queue_name: str) -> None:
    started = trio.Event()
    calls = 0
    cleaned_up = trio.Event()

    async def handler(job: Job[Any]) -> None:
        nonlocal calls
        calls += 1
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):  # cleanup may be shielded, as Trio allows
                await trio.sleep(0.01)
                cleaned_up.set()

    async with (
        Queue(storage, name=queue_name, **FAST) as producer,
        Queue(storage, name=queue_name, handler=handler, max_attempts=5, **FAST) as worker,
    ):
        cancelled = Recorder()
        worker.on("cancelled", cancelled)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def waiter() -> None:
                    with pytest.raises(JobCancelledError):
                        await producer.enqueue_and_wait("long", None)

                nursery.start_soon(waiter)
                await started.wait()
                assert (await producer.cancel("long")).status is CancelStatus.CANCELLED
            await cancelled.wait_for("cancelled", "long")
        assert cleaned_up.is_set() and calls == 1  # not retried
        status = await producer.get_status("long")
        assert status is not None and status.state is JobState.CANCELLED


async def test_a_worker_that_missed_the_cancel_event_learns_it_from_its_heartbeat(
    storage: Storage, queue_name: str
) -> None:
    real_subscribe = storage.subscribe

    @asynccontextmanager
    async def without_cancel_requests(queue: str, kinds: Any = None) -> AsyncIterator[Any]:
        async with real_subscribe(queue, kinds) as receive:
            send, filtered = trio.open_memory_channel[Any](100)

            async def pump() -> None:
                async for batch in receive:
                    await send.send([e for e in batch if e.kind != "cancel_requested"])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                yield filtered
                nursery.cancel_scope.cancel()

    storage.subscribe = without_cancel_requests  # type: ignore[method-assign]
    started = trio.Event()

    async def handler(job: Job[Any]) -> None:
        started.set()
        await trio.sleep_forever()

    async with Queue(storage, name=queue_name, handler=handler, visibility_timeout=0.3, **FAST) as q:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def waiter() -> None:
                    with pytest.raises(JobCancelledError):
                        await q.enqueue_and_wait("deaf", None)

                nursery.start_soon(waiter)
                await started.wait()
                await q.cancel("deaf")


async def test_after_a_cancelled_job_the_same_worker_runs_the_next_jobs_normally(storage: Storage, queue_name: str) -> None:
    """A worker runs many jobs under one cancel scope and replaces it after a cancel():
    the cancel reaches only its job, whether the handler was cancelled at a checkpoint or
    ended on its own after the request (its scope cancelled too late to matter)."""
    started: dict[str, trio.Event] = {jid: trio.Event() for jid in ("blocked", "shielded")}
    release_shielded = trio.Event()
    outcomes: dict[str, str] = {}

    async def handler(job: Job[Any]) -> str:
        if job.id == "blocked":
            started["blocked"].set()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                outcomes["blocked"] = "cancelled"
                raise
        if job.id == "shielded":
            started["shielded"].set()
            with trio.CancelScope(shield=True):
                await release_shielded.wait()  # the cancel arrives here: too late to interrupt
            outcomes["shielded"] = "returned"
            return "ignored"
        await trio.sleep(0)  # a checkpoint: a leftover cancellation would hit it
        return f"ok-{job.id}"

    async with Queue(storage, name=queue_name, handler=handler, concurrency=1, prefetch=1, **FAST) as q:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def wait_cancelled(jid: str) -> None:
                    with pytest.raises(JobCancelledError):
                        await q.enqueue_and_wait(jid, None)

                nursery.start_soon(wait_cancelled, "blocked")
                await started["blocked"].wait()
                await q.cancel("blocked")
            assert await q.enqueue_and_wait("after-1", None) == "ok-after-1"
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_cancelled, "shielded")
                await started["shielded"].wait()
                cancelled = Recorder()
                q.on("cancel_requested", cancelled)
                await q.cancel("shielded")
                await cancelled.wait_for("cancel_requested", "shielded")
                release_shielded.set()
            results = [await q.enqueue_and_wait(f"after-{i}", None) for i in range(2, 5)]
            for jid in ("blocked", "shielded"):
                status = await q.get_status(jid)
                assert status is not None and status.state is JobState.CANCELLED
    assert outcomes == {"blocked": "cancelled", "shielded": "returned"}
    assert results == ["ok-after-2", "ok-after-3", "ok-after-4"]


async def test_a_cancel_during_a_reserved_claims_start_does_not_reach_the_next_incarnation(
    storage: Storage, queue_name: str
) -> None:
    """A prefetched (reserved) job is cancelled while its worker's start call is under
    way: it ends cancelled (the storage refuses the start), and the request stays with
    that claim: the same id enqueued again, and claimed by the worker before the refusal
    reaches it, runs. (The start is held by wrapping the storage's own; MemoryStorage,
    which counts a start without I/O where there is no such moment, is made to take the
    batched start() too: the storage is wrapped in a FaultyStorage, which withholds
    NonBlockingStart.)"""
    reserved = [trio.Event(), trio.Event()]  # r's first and second incarnations claimed, reserved
    starting, go, reply = trio.Event(), trio.Event(), trio.Event()

    class Held(FaultyStorage):
        """A pass-through (no faults planned) that holds r's start. Like every
        FaultyStorage it has no start_nowait (NonBlockingStart): a Queue on it takes the
        batched start() whatever it wraps."""

        async def dequeue(self, *args: Any, **kwargs: Any) -> Any:
            claims = await super().dequeue(*args, **kwargs)
            if any(c.id == "r" and not c.started for c in claims):
                (reserved[1] if reserved[0].is_set() else reserved[0]).set()
            return claims

        async def start(self, queue: str, worker_id: str, claims: Any) -> list[bool]:
            if any(job_id == "r" for job_id, _ in claims) and not go.is_set():
                starting.set()
                await go.wait()
                out: list[bool] = await super().start(queue, worker_id, claims)
                await reply.wait()
                return out
            return await super().start(queue, worker_id, claims)  # type: ignore[no-any-return]

    held = Held(storage)
    assert not isinstance(held, NonBlockingStart)
    release = trio.Event()
    ran: list[str] = []

    async def handler(job: Job[Any]) -> str:
        if job.id == "busy":
            await release.wait()
        ran.append(job.id)
        return f"ok-{job.id}"

    async with Queue(held, name=queue_name, handler=handler, concurrency=1, prefetch=1, **FAST) as q:
        seen = Recorder()
        for name in ("cancel_requested", "cancelled", "completed"):
            q.on(name, seen)
        with trio.fail_after(20):
            await q.enqueue("busy", None)  # the only worker runs it...
            await q.enqueue("r", None)  # ... so r is claimed reserved, in the buffer
            await reserved[0].wait()
            release.set()
            await starting.wait()  # the worker's start call for r is under way
            assert (await q.cancel("r")).status is CancelStatus.CANCELLED
            await seen.wait_for("cancel_requested", "r")  # the worker has the request
            go.set()
            await seen.wait_for("cancelled", "r")  # the storage refused the start: cancelled
            status = await q.get_status("r")
            assert status is not None and status.state is JobState.CANCELLED
            # the same id again, a new incarnation: the worker claims it (reserved) before
            # the refusal reaches it; the old request must not touch it
            assert (await q.enqueue("r", None)).status.value == "queued"
            await reserved[1].wait()
            reply.set()
            await seen.wait_until(lambda evs: len([e for e in evs if e.job_id == "r" and e.name != "cancel_requested"]) > 1)
            assert [e.name for e in seen.events if e.job_id == "r"] == ["cancel_requested", "cancelled", "completed"]
            assert await q.get_result("r") == "ok-r"
    assert ran == ["busy", "r"]
