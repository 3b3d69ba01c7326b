"""The event dispatcher (``trioqueue._supervision._emitter.Emitter``): order, bursts, cancellation."""

from __future__ import annotations

import trio

from trioqueue._supervision._emitter import Emitter
from trioqueue._model._types import QueueEvent


async def test_a_burst_of_events_is_delivered_in_order_and_drained_after_close() -> None:
    emitter = Emitter("q")
    seen: list[str | None] = []
    emitter.on("completed", lambda e: seen.append(e.job_id))

    async def slow(e: QueueEvent) -> None:
        await trio.sleep(0)
        seen.append(f"async-{e.job_id}")

    emitter.on("failed", slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(emitter.run)
        for i in range(5000):
            emitter.emit("completed" if i % 100 else "failed", f"j{i}")
        emitter.close()  # run() delivers what is queued, then returns
    assert seen == [f"j{i}" if i % 100 else f"async-j{i}" for i in range(5000)]


async def test_an_endless_flood_of_events_neither_starves_other_tasks_nor_blocks_cancellation() -> None:
    emitter = Emitter("q")
    delivered = [0]

    def again(e: QueueEvent) -> None:  # every event emits the next: the channel never drains
        delivered[0] += 1
        emitter.emit("completed", e.job_id)

    emitter.on("completed", again)
    others_ran = trio.Event()

    async def other() -> None:
        for _ in range(3):
            await trio.sleep(0)
        others_ran.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(emitter.run)
            emitter.emit("completed", "j")
            nursery.start_soon(other)
            await others_ran.wait()
            nursery.cancel_scope.cancel()
    assert delivered[0] > 3
