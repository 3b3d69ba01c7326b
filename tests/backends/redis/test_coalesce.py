"""The enqueue coalescer of RedisStorage (``storage/_coalesce.py``), on its own: the
batching policy, free of I/O (its cancellation behaviour against a real server is in
``test_storage.py::test_cancelled_concurrent_enqueues_never_wedge_the_others``)."""

from __future__ import annotations

import trio
import trio.testing

from trioqueue import EnqueueStatus
from trioqueue.storage import EnqueueOutcome, NewJob
from trioqueue.storage._coalesce import PIPELINE, Coalescer, Slot


class FakeServer:
    """Answers each batch after ``latency`` seconds of (mock) time, one batch at a time in
    the order sent, as a Redis connection does; records what it saw."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.batches: list[list[str]] = []
        self.inflight = 0
        self.max_inflight = 0
        self._lock = trio.StrictFIFOLock()

    async def flush(self, batch: list[Slot]) -> None:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        ids = [job.id for slot in batch for job in slot.jobs]
        try:
            async with self._lock:
                await trio.sleep(self.latency)
                self.batches.append(ids)
        finally:
            self.inflight -= 1
        for slot in batch:
            slot.result = [EnqueueOutcome(EnqueueStatus.DUPLICATE, "queued:" + job.id) for job in slot.jobs]
            slot.wake()


def _job(job_id: str) -> NewJob:
    return NewJob(job_id, b"e", 1, 1.0)


async def test_concurrent_producers_fill_two_even_batches_in_flight(autojump_clock: trio.testing.MockClock) -> None:
    """Issue 11 (A-100): with one batch at a time, client and server took turns; with two
    in flight, the batches must even out (a lone first call must not leave the other
    producers in one big batch for good), and every call gets its own jobs' outcomes."""
    server = FakeServer(latency=0.001)
    co = Coalescer(server.flush)
    producers, rounds = 100, 20

    async def producer(p: int) -> None:
        for r in range(rounds):
            ids = [f"p{p}-r{r}-{k}" for k in range(1 + p % 2)]  # calls of one and two jobs
            outcomes = await co.submit([_job(i) for i in ids])
            assert [o.state for o in outcomes] == ["queued:" + i for i in ids]

    async with trio.open_nursery() as nursery:
        for p in range(producers):
            nursery.start_soon(producer, p)
    sent = [i for batch in server.batches for i in batch]
    assert len(sent) == len(set(sent)) == 150 * rounds  # every job once
    assert server.max_inflight == PIPELINE
    sizes = [len(b) for b in server.batches]
    # after the first rounds have split the producers, and before the last ones finish:
    # no batch holds most of the jobs (one at a time: 1 and 149, for good), and the
    # typical batch carries a good share of them (not a trickle of small ones)
    steady = sorted(sizes[3:-6])
    assert steady[-1] <= 0.6 * 150, sizes
    assert steady[len(steady) // 2] >= 0.2 * 150, sizes
    assert co.inflight == 0 and not co.pending


async def test_a_lone_caller_sends_at_once_and_alone() -> None:
    """A-seq: one caller at a time is never held back for company: not even by a
    schedule point before its batch goes out (a yield costs a scheduler trip)."""
    ticks = 0
    sent_at: list[int] = []
    server = FakeServer(latency=0.001)

    async def flush(batch: list[Slot]) -> None:
        sent_at.append(ticks)
        await server.flush(batch)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    co = Coalescer(flush)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        for k in range(5):
            before = ticks
            await co.submit([_job(f"j{k}")])
            assert sent_at[-1] == before, "the call yielded before sending"
        nursery.cancel_scope.cancel()
    assert server.batches == [[f"j{k}"] for k in range(5)]
