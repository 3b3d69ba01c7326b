"""Flow control (conformance, every backend): the global rate limit, ``RateLimited`` and
global concurrency, at the storage level and through Queues sharing one storage.

Waits are driven by blocking claims and events. A rate limit is checked by counting the
recorded claim/start times in every window, never by how long a run took.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from trioqueue import Job, JobState, Queue, RateLimit, RateLimited, Storage, ValidationError
from trioqueue._core import parse_state
from trioqueue.storage import ClaimLimits, SettleKind, Settlement

from support import Recorder
from storage_helpers import LEASE, W1, W2, job

# Slack for the gap between a claim (the storage's clock) and the moment a handler
# records its start: a window shorter than ``per`` by this much holds at most N starts.
JITTER = 0.15


def max_in_window(times: list[float], per: float) -> int:
    """The most timestamps within any half-open span of ``per`` seconds."""
    times = sorted(times)
    best = j = 0
    for i, t in enumerate(times):
        while times[j] <= t - per:
            j += 1
        best = max(best, i - j + 1)
    return best


# -- the storage interface ------------------------------------------------------------


async def test_rate_limit_caps_claims_and_blocking_claim_waits_for_the_next_token(
    storage: Storage, queue_name: str
) -> None:
    limits = ClaimLimits(rate=2, per=0.6)
    await storage.enqueue(queue_name, [job(f"r{i}") for i in range(5)])
    t0 = time.time()
    first = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert [c.id for c in first] == ["r0", "r1"]  # two tokens, though five jobs wait
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits) == []  # no token left
    # A blocking claim sleeps until the next token, then takes what it allows.
    with trio.fail_after(10):
        second = await storage.dequeue(queue_name, W2, 10, 5.0, LEASE, None, limits)
    assert [c.id for c in second] == ["r2", "r3"]
    assert time.time() >= t0 + 0.6 - 0.05  # not before the window let go of a token
    # Without limits the same queue is not throttled (the log is only the limiter's).
    rest = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE)
    assert [c.id for c in rest] == ["r4"]


async def test_rate_limit_counts_reserved_claims(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(rate=3, per=30.0)
    await storage.enqueue(queue_name, [job(f"p{i}") for i in range(6)])
    claims = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, 1, limits)  # 1 started, 2 reserved
    assert [c.started for c in claims] == [True, False, False]
    assert await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits) == []


async def test_rate_limited_settlement_puts_back_without_an_attempt_and_holds_the_queue(
    storage: Storage, queue_name: str
) -> None:
    await storage.enqueue(queue_name, [job("429"), job("other")])
    [c] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert c.attempts == 1
    t0 = time.time()
    [ok] = await storage.settle(queue_name, W1, [Settlement(SettleKind.RATE_LIMITED, "429", b"", delay=0.6, token=c.token)])
    assert ok
    rec = await storage.get_job(queue_name, "429")
    assert rec is not None and parse_state(rec.state)[0] == "delayed" and rec.attempts == 0
    # the registry queries see it where it is (Redis keeps a per-state index)
    assert (await storage.counts(queue_name))["delayed"] == 1
    assert [r.id for r in (await storage.list_jobs(queue_name, "delayed"))[0]] == ["429"]
    # The hold applies to every claimer, with or without limits, though a job waits.
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE) == []
    with trio.fail_after(10):
        claims = await storage.dequeue(queue_name, W2, 10, 5.0, LEASE)
    assert time.time() >= t0 + 0.6 - 0.05
    got = {c.id: c for c in claims}
    if "429" not in got:  # "other" came first; the put-back job follows once due
        with trio.fail_after(10):
            got.update({c.id: c for c in await storage.dequeue(queue_name, W2, 10, 5.0, LEASE)})
    assert set(got) == {"429", "other"}
    assert got["429"].attempts == 1  # the rate-limited attempt did not count
    # A reserved claim that is rate limited costs nothing either.
    [ok] = await storage.settle(
        queue_name, W2, [Settlement(SettleKind.RATE_LIMITED, "429", b"", delay=0.01, token=got["429"].token)]
    )
    rec = await storage.get_job(queue_name, "429")
    assert ok and rec is not None and rec.attempts == 0


async def test_global_concurrency_caps_claims_and_a_settlement_wakes_a_waiting_claim(
    storage: Storage, queue_name: str
) -> None:
    limits = ClaimLimits(concurrency=2)
    await storage.enqueue(queue_name, [job(f"c{i}") for i in range(4)])
    held = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert [c.id for c in held] == ["c0", "c1"]
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits) == []
    got: list[str] = []
    waiting = trio.Event()

    async def waiter() -> None:
        waiting.set()
        got.extend(c.id for c in await storage.dequeue(queue_name, W2, 10, 20.0, LEASE, None, limits))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await waiting.wait()
            await trio.sleep(0.1)  # let it block (not needed for correctness: it claims either way)
            assert got == []
            await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "c0", b"1", ttl=60, token=held[0].token)])
    assert got == ["c2"]  # one slot freed, one job claimed
    # A release frees its slot too.
    assert await storage.release(queue_name, W1, ["c1"]) == 1
    again = await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)
    assert [c.id for c in again] == ["c1"]


async def test_reaper_frees_the_slots_of_a_dead_worker(storage: Storage, queue_name: str) -> None:
    limits = ClaimLimits(concurrency=2)
    await storage.heartbeat(queue_name, W1, 0.2, [], LEASE)  # dies holding both slots
    await storage.enqueue(queue_name, [job(f"d{i}") for i in range(3)])
    assert len(await storage.dequeue(queue_name, W1, 10, 0.05, LEASE, None, limits)) == 2
    assert await storage.dequeue(queue_name, W2, 10, 0.0, LEASE, None, limits) == []
    await trio.sleep(0.3)  # the heartbeat runs out: nothing announces that
    recovered, _ = await storage.recover_stalled(queue_name)
    assert sorted(recovered) == [("d0", "requeued"), ("d1", "requeued")]
    claims = await storage.dequeue(queue_name, W2, 10, 0.05, LEASE, None, limits)
    assert len(claims) == 2


# -- through Queues -------------------------------------------------------------------


def test_flow_settings_are_validated(storage_free_memory: Storage) -> None:
    with pytest.raises(ValidationError, match="RateLimit.limit"):
        RateLimit(0)
    with pytest.raises(ValidationError, match="RateLimit.per"):
        RateLimit(5, per=-1.0)
    with pytest.raises(ValidationError, match="retry_after"):
        RateLimited(retry_after=float("nan"))
    with pytest.raises(ValidationError, match="rate_limit must be"):
        Queue(storage_free_memory, rate_limit=100)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="global_concurrency"):
        Queue(storage_free_memory, global_concurrency=0)
    with pytest.raises(ValidationError, match="prefetch"):
        Queue(storage_free_memory, global_concurrency=2, prefetch=4)
    q: Queue[Any, Any] = Queue(storage_free_memory, rate_limit=RateLimit(10, per=2.0), global_concurrency=3)
    assert q.prefetch == 0 and q.copy().rate_limit == RateLimit(10, per=2.0)


async def test_rate_limit_is_never_exceeded_across_two_workers(storage: Storage, queue_name: str) -> None:
    rate, per, n = 4, 0.5, 14
    starts: list[float] = []
    done = Recorder()

    async def handler(job: Job[Any]) -> None:
        starts.append(time.time())

    settings: dict[str, Any] = {"name": queue_name, "handler": handler, "concurrency": 3, "block_timeout": 1.0}
    limit = RateLimit(rate, per=per)
    with trio.fail_after(30):
        async with Queue(storage, rate_limit=limit, **settings), Queue(storage, rate_limit=limit, **settings) as q:
            q.on("completed", done)
            await q.enqueue_many((f"j{i}", None) for i in range(n))
            await done.wait_for("completed", count=n)
    assert len(starts) == n
    assert max_in_window(starts, per - JITTER) <= rate


async def test_rate_limited_handler_requeues_without_an_attempt_and_pauses_every_worker(
    storage: Storage, queue_name: str
) -> None:
    calls: list[tuple[str, int, float]] = []
    events = Recorder()

    async def handler(job: Job[Any]) -> str:
        calls.append((job.id, job.attempts, time.time()))
        if job.id == "upstream" and len(calls) == 1:
            raise RateLimited("429 from upstream", retry_after=0.5)
        return job.id

    settings: dict[str, Any] = {"name": queue_name, "handler": handler, "max_attempts": 1, "block_timeout": 1.0}
    with trio.fail_after(20):
        async with Queue(storage, **settings) as q, Queue(storage, **settings):
            q.on("rate_limited", events)
            assert await q.enqueue_and_wait("upstream", None) == "upstream"
            await events.wait_for("rate_limited", "upstream")
            limited_at = calls[0][2]
            status = await q.get_status("upstream")
            assert await q.enqueue_and_wait("after", None) == "after"
    assert status is not None and status.state is JobState.COMPLETED and status.attempts == 1
    # max_attempts=1, yet the job ran again: the 429 cost no attempt.
    assert [(i, a) for i, a, _ in calls] == [("upstream", 1), ("upstream", 1), ("after", 1)]
    assert all(t >= limited_at + 0.5 - 0.05 for _, _, t in calls[1:])


async def test_global_concurrency_is_never_exceeded_across_two_queues(storage: Storage, queue_name: str) -> None:
    running = peak = 0
    full = trio.Event()
    done = Recorder()

    async def handler(job: Job[Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running >= 2:
            full.set()
        with trio.move_on_after(2.0):
            await full.wait()  # hold the slot until the limit was reached once
        await trio.sleep(0.01)
        running -= 1

    settings: dict[str, Any] = {"name": queue_name, "handler": handler, "concurrency": 4, "block_timeout": 1.0}
    with trio.fail_after(30):
        async with Queue(storage, global_concurrency=2, **settings), Queue(
            storage, global_concurrency=2, **settings
        ) as q:
            q.on("completed", done)
            await q.enqueue_many((f"g{i}", None) for i in range(12))
            await done.wait_for("completed", count=12)
    assert peak == 2
