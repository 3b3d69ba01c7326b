"""MemoryStorage specifics: one instance shared by Trio runs in different OS threads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import trio
import trio.testing

from trioqueue import Job, MemoryStorage, Queue, UpdateTTLStatus
from trioqueue.storage import NonBlockingStart, Settlement, SettleKind

from support import Recorder


def test_two_trio_runs_in_two_threads_share_one_storage() -> None:
    storage = MemoryStorage()
    total = 2000
    executed = Counter[str]()
    results: dict[str, Any] = {}
    consumer_ready = threading.Event()
    producer_done = threading.Event()
    errors: list[BaseException] = []

    async def handler(job: Job[Any]) -> int:
        executed[job.id] += 1
        return job.payload * 2

    async def consumer() -> None:
        async with Queue(storage, name="shared", handler=handler, concurrency=20, block_timeout=0.2):
            consumer_ready.set()
            await trio.to_thread.run_sync(producer_done.wait)

    async def producer() -> None:
        await trio.to_thread.run_sync(consumer_ready.wait)
        completed = Recorder()
        async with Queue(storage, name="shared") as q:
            q.on("completed", completed)
            await q.enqueue_many([(f"bulk-{i}", i) for i in range(total)])
            # request/response across threads: notifications cross via TrioTokens
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(50):

                        async def wait_one(i: int = i) -> None:
                            results[f"rr-{i}"] = await q.enqueue_and_wait(f"rr-{i}", i)

                        nursery.start_soon(wait_one)
                await completed.wait_until(lambda evs: len(evs) >= total + 50)

    def run(fn: Any) -> None:
        try:
            trio.run(fn)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            producer_done.set()
            consumer_ready.set()

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (consumer, producer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results == {f"rr-{i}": i * 2 for i in range(50)}
    assert len(executed) == total + 50 and set(executed.values()) == {1}


def test_concurrent_claims_from_many_threads_never_duplicate() -> None:
    storage = MemoryStorage()
    from storage_helpers import job

    trio.run(storage.enqueue, "q", [job(f"j{i}") for i in range(5000)])
    claimed: list[list[str]] = [[] for _ in range(4)]

    def consume(slot: int) -> None:
        async def main() -> None:
            while claims := await storage.dequeue("q", f"w{slot}", 7, 0.05, 30.0):
                claimed[slot].extend(c.id for c in claims)

        trio.run(main)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [j for part in claimed for j in part]
    assert len(everything) == 5000 and len(set(everything)) == 5000


async def test_start_nowait_counts_a_reserved_claim_like_start() -> None:
    """The consumer's plain-call start (no batch, no checkpoint) fences like start():
    counted once, refused for a forged or stale token, and a job whose cancel() came
    while it was reserved is cancelled instead of run."""
    from storage_helpers import W1, job

    storage = MemoryStorage()
    assert isinstance(storage, NonBlockingStart)
    await storage.heartbeat("q", W1, 30.0, [], 30.0)
    await storage.enqueue("q", [job("a"), job("b"), job("c")])
    a, b, c = await storage.dequeue("q", W1, 3, 0.05, 0.2, 0)
    assert not (a.started or b.started or c.started)
    assert storage.start_nowait("q", W1, "a", a.token) and storage.start_nowait("q", W1, "a", a.token)
    assert not storage.start_nowait("q", W1, "b", "forged")
    rec = await storage.get_job("q", "a")
    assert rec is not None and rec.attempts == 1
    async with storage.subscribe("q") as events:
        await storage.cancel("q", "b")
        assert not storage.start_nowait("q", W1, "b", b.token)
        seen = [(e.kind, e.job_id) for e in await events.receive()]
        seen += [(e.kind, e.job_id) for e in await events.receive()]
    assert seen == [("cancel_requested", "b"), ("cancelled", "b")]
    rec = await storage.get_job("q", "b")
    assert rec is not None and rec.state.startswith("cancelled") and rec.attempts == 0
    await trio.sleep(0.25)  # c's lease runs out: the reaper takes it back
    assert await storage.recover_stalled("q") == ([("a", "requeued"), ("c", "requeued")], None)
    assert not storage.start_nowait("q", W1, "c", c.token)


async def test_settle_nowait_settles_and_fences_like_settle() -> None:
    """The consumer's plain-call settle (no checkpoint) stores like settle(): the job
    completes once with its result and event; a forged token is refused (a ``fenced``
    event), and the same settlement sent again is answered True without a second event."""
    from storage_helpers import W1, job

    storage = MemoryStorage()
    assert isinstance(storage, NonBlockingStart)
    await storage.heartbeat("q", W1, 30.0, [], 30.0)
    await storage.enqueue("q", [job("a"), job("b")])
    a, b = await storage.dequeue("q", W1, 2, 0.05, 30.0)
    done = Settlement(SettleKind.COMPLETE, "a", b"1", ttl=60.0, token=a.token)
    async with storage.subscribe("q") as events:
        assert storage.settle_nowait("q", W1, [done, Settlement(SettleKind.COMPLETE, "b", b"2", ttl=60.0, token="forged")]) == [
            True,
            False,
        ]
        assert storage.settle_nowait("q", W1, [done]) == [True]
        seen = [(e.kind, e.job_id, e.result) for e in await events.receive()]
    assert seen == [("completed", "a", b"1"), ("fenced", "b", None)]
    rec = await storage.get_job("q", "a")
    assert rec is not None and rec.state.startswith("completed") and rec.result == b"1" and rec.attempts == 1
    rec = await storage.get_job("q", "b")
    assert rec is not None and rec.state.startswith("processing")


async def test_a_worker_about_to_idle_settles_without_the_settler() -> None:
    """A worker whose buffer is empty after a job stores the settlements itself (a plain
    call): with the storage's async settle() failing, the jobs still complete, once, and
    nothing stays held."""
    storage = MemoryStorage()

    async def broken_settle(*args: Any) -> list[bool]:
        raise AssertionError("settled through the settler task")

    storage.settle = broken_settle  # type: ignore[method-assign]

    async def handler(job: Job[Any]) -> int:
        return job.payload + 1

    async with Queue(storage, name="inline", handler=handler, concurrency=4) as q:
        for i in range(20):
            assert await q.enqueue_and_wait(f"j{i}", i, timeout=10) == i + 1
    assert await storage.held_jobs("inline", "x") == []
    counts = await storage.counts("inline")
    assert counts["completed"] == 20 and counts["processing"] == 0


async def test_awaited_enqueues_are_cancellation_points_and_yield_within_a_slice() -> None:
    """An enqueue is a cancellation point every call (a cancelled scope writes nothing)
    and lets the run's other tasks go first at least every ENQUEUE_SLICE seconds: a loop
    of enqueues never starves a task that waits for its turn."""
    from storage_helpers import job

    from trioqueue.storage.memory._storage import ENQUEUE_SLICE

    storage = MemoryStorage()
    with trio.CancelScope() as scope:
        scope.cancel()
        await storage.enqueue("q", [job("never")])
    assert await storage.get_job("q", "never") is None

    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        before = turns
        deadline = time.perf_counter() + 20 * ENQUEUE_SLICE
        i = 0
        while time.perf_counter() < deadline:
            await storage.enqueue("q", [job(f"j{i}")])
            i += 1
        assert turns > before  # the other task ran while this one only enqueued
        nursery.cancel_scope.cancel()


async def test_results_of_one_settle_call_expire_by_their_own_ttl() -> None:
    """Jobs settled together share expiry entries by TTL; each still expires on its own
    terms (a TTL updated later keeps its job)."""
    from storage_helpers import W1, job

    storage = MemoryStorage()
    await storage.enqueue("q", [job(f"j{i}") for i in range(4)])
    claims = await storage.dequeue("q", W1, 4, 0.05, 30.0)
    ttls = [0.05, 0.05, 30.0, 0.05]
    await storage.settle(
        "q", W1, [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=t, token=c.token) for c, t in zip(claims, ttls)]
    )
    assert await storage.update_result_ttl("q", "j1", 30.0) is UpdateTTLStatus.UPDATED
    await trio.sleep(0.1)  # the short TTLs run out
    assert [await storage.get_job("q", f"j{i}") is not None for i in range(4)] == [False, True, True, False]
    assert (await storage.counts("q"))["completed"] == 2


async def test_subscribe_nowait_hands_the_events_over_in_the_publishing_step() -> None:
    """The plain-call subscription gets what subscribe() gets, in order: within the
    publishing step in its own Trio run (before the call that published returns), and
    soon after from a publisher in another thread; none once it is left."""
    from storage_helpers import job

    storage = MemoryStorage()
    assert isinstance(storage, NonBlockingStart)
    got: list[tuple[str, str]] = []
    arrived = trio.Event()

    def deliver(batch: list[Any]) -> None:
        got.extend((e.kind, e.job_id) for e in batch)
        if ("enqueued", "t") in got:
            arrived.set()

    async with storage.subscribe("q") as stream:
        with storage.subscribe_nowait("q", None, deliver):
            await storage.enqueue("q", [job("a"), job("b")])
            assert got == [("enqueued", "a"), ("enqueued", "b")]  # before enqueue returned
            await storage.cancel("q", "a")
            assert got[2:] == [("cancelled", "a")]

            def other_thread() -> None:
                trio.run(storage.enqueue, "q", [job("t")])

            await trio.to_thread.run_sync(other_thread)
            with trio.fail_after(10):
                await arrived.wait()
        await storage.enqueue("q", [job("after")])
        seen: list[tuple[str, str]] = []
        while len(seen) < 5:
            seen += [(e.kind, e.job_id) for e in await stream.receive()]
    assert got == seen[:4] and seen[4] == ("enqueued", "after")


async def test_an_enqueue_hands_its_jobs_to_a_parked_dequeue_into_in_the_enqueuing_step() -> None:
    """A ``dequeue_into`` parked in the same Trio run gets the claims of an enqueue's jobs
    before that enqueue returns (no trip through the scheduler to the claiming task), as
    many as ``wanted()`` asks for; jobs left over wake it and it claims them itself. An
    enqueue from another thread wakes it as any claimer."""
    from storage_helpers import W1, job

    storage = MemoryStorage()
    taken: list[str] = []
    room = [1]  # jobs the claimer wants
    returned = trio.Event()

    def wanted() -> tuple[int, int] | None:
        return (room[0], room[0]) if room[0] else None

    def take(claims: list[Any]) -> None:
        assert all(c.started for c in claims)
        taken.extend(c.id for c in claims)
        room[0] -= len(claims)

    async def claimer() -> None:
        await storage.dequeue_into("q", W1, 60.0, 30.0, None, wanted, take)
        returned.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claimer)
            await trio.testing.wait_all_tasks_blocked()
            await storage.enqueue("q", [job("a")])
            assert taken == ["a"]  # in the enqueuing step
            await trio.testing.wait_all_tasks_blocked()
            assert not returned.is_set()  # it goes on waiting, unwoken
            room[0] = 1
            await storage.enqueue("q", [job("b"), job("c")])
            assert taken == ["a", "b"]  # as many as it wanted; "c" is left and wakes it
            room[0] = 1
            await returned.wait()
            assert taken == ["a", "b", "c"]
            room[0] = 1
            nursery.start_soon(claimer)
            await trio.testing.wait_all_tasks_blocked()
            returned = trio.Event()
            await trio.to_thread.run_sync(lambda: trio.run(storage.enqueue, "q", [job("t")]))
            await returned.wait()
            assert taken == ["a", "b", "c", "t"]
    held = await storage.held_jobs("q", W1)
    assert sorted(held) == ["a", "b", "c", "t"]


async def test_a_completed_event_without_its_result_keeps_the_order_of_the_events() -> None:
    """A ``completed`` event that comes without its result (read back from the registry,
    which takes the listener's task) is heard with its result, and the events published
    after it are heard after it."""

    class Stripping(MemoryStorage):
        def subscribe_nowait(self, queue: str, kinds: Any, deliver: Any) -> Any:
            def strip(batch: list[Any]) -> None:
                deliver([e._replace(result=None) if e.kind == "completed" and e.job_id == "big" else e for e in batch])

            return super().subscribe_nowait(queue, kinds, strip)

    storage = Stripping()
    heard: list[tuple[str, str | None, Any]] = []
    done = trio.Event()

    async def handler(job: Job[Any]) -> str:
        return f"r-{job.id}"

    async with Queue(storage, name="strip", handler=handler, concurrency=1) as q:

        @q.on("completed")
        def completed(event: Any) -> None:
            heard.append((event.name, event.job_id, event.data["result"]))
            if event.job_id == "small":
                done.set()

        assert await q.enqueue_and_wait("big", 1, timeout=10) == "r-big"
        await q.enqueue("small", 2)
        with trio.fail_after(10):
            await done.wait()
    assert heard == [("completed", "big", "r-big"), ("completed", "small", "r-small")]
