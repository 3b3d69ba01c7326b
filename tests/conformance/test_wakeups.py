"""Wake-ups on time (conformance: every backend): a claim waiting for work wakes when a
job it could take becomes due, and the reaper promotes a delayed job when it is due even
while no consumer runs.

RedisStorage's blocking claims wait in chunks (``block_chunk``); here they are long
(5 s), so that a wake-up that only came at the end of a chunk shows as a late claim.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from trioqueue import Queue, Reaper, Storage
from trioqueue.storage import NewJob, Settlement, SettleKind

from conftest import _make_storage
from support import Recorder

LEASE = 30.0
DUE = 0.2  # seconds: how far in the future the job becomes due
SLACK = 1.5  # seconds a wake-up may come after the due time (a missed one comes >= 5 s late)


@pytest.fixture
async def chunky(backend: str, request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Storage]:
    """A fresh storage whose blocking claims (Redis) wait in 5 s chunks."""
    if backend in ("redis", "redis7"):
        from trioqueue.storage import RedisStorage

        url = request.getfixturevalue("redis_url" if backend == "redis" else "redis7_url")
        st: Storage = RedisStorage(url, prefix=f"t-{uuid.uuid4().hex[:12]}", block_chunk=5.0)
    else:
        st = _make_storage(backend, request, tmp_path)
    async with st:
        yield st


def _job(job_id: str, run_at: float | None = None) -> NewJob:
    return NewJob(job_id, job_id.encode(), 3, 60.0, f"tok-{job_id}", run_at)


@pytest.mark.parametrize("how", ["retry", "rate_limited", "sleep", "delayed_enqueue"])
async def test_a_waiting_claim_wakes_when_a_job_becomes_due(chunky: Storage, queue_name: str, how: str) -> None:
    st = chunky
    if how != "delayed_enqueue":
        await st.enqueue(queue_name, [_job("j")])
        [claim] = await st.dequeue(queue_name, "w1", 1, 0.05, LEASE)
    got: list[tuple[float, list[str]]] = []

    async def waiting_claim() -> None:
        claims = await st.dequeue(queue_name, "w2", 5, 10.0, LEASE)
        got.append((time.time(), [c.id for c in claims]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_claim)
        await trio.testing.wait_all_tasks_blocked(0.05)  # w2 waits for work
        t0 = time.time()
        if how == "delayed_enqueue":
            await st.enqueue(queue_name, [_job("j", run_at=t0 + DUE)])
        else:
            kind = {"retry": SettleKind.RETRY, "rate_limited": SettleKind.RATE_LIMITED, "sleep": SettleKind.SLEEP}[how]
            [ok] = await st.settle(queue_name, "w1", [Settlement(kind, "j", b"", delay=DUE, token=claim.token)])
            assert ok
    [(claimed_at, ids)] = got
    assert ids == ["j"]
    assert t0 + DUE - 0.05 <= claimed_at < t0 + DUE + SLACK, f"claimed {claimed_at - t0:.2f} s after, due at {DUE}"


async def test_the_reaper_promotes_a_delayed_job_on_time_with_no_consumer(storage: Storage, queue_name: str) -> None:
    promoted = Recorder()
    # visibility_timeout=60: the reaper's periodic rescan comes every 5 s
    async with Reaper(storage, name=queue_name, visibility_timeout=60.0), Queue(storage, name=queue_name) as producer:
        producer.on("promoted", promoted)
        await trio.testing.wait_all_tasks_blocked(0.05)  # the reaper made its first scan and sleeps
        t0 = time.time()
        await producer.enqueue("later", None, delay=DUE)
        with trio.fail_after(10):
            await promoted.wait_for("promoted", "later")
        late = time.time() - (t0 + DUE)
        status = await producer.get_status("later")
    assert status is not None and status.state.value == "queued"
    assert -0.05 <= late < SLACK, f"promoted {late:.2f} s after its due time"
