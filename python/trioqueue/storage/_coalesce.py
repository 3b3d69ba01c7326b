"""Call coalescing for the storages with a server: the concurrent calls of one kind on one
queue ride together in one round trip (a batch), up to two batches in flight. RedisStorage
coalesces ``enqueue`` (one script call a batch) and ``save_step`` (one ``step.lua`` call);
PostgresStorage ``save_step`` (one statement and one commit a batch).

With one batch at a time, client and server took turns: the server ran a batch while the
producers waited for it, then the producers built the next one while the server idled.
With two in flight, the producers fill one batch while the server runs the other; the
batches are kept about even (a one-job batch beside a full one would stay that way).

Cancellation: a call cancelled before its batch is sent withdraws (nothing written); one
cancelled after it was sent lands anyway, only its outcome is lost (as with any cancelled
write); a call handed the carrier's place while being cancelled passes it on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

__all__ = ["Coalescer", "Slot"]

PIPELINE = 2  # batches of one queue in flight at once


class Slot:
    """One call: its items (``jobs``: an enqueue's jobs, a step save's one entry), and their
    outcomes (or error) once its batch is
    answered; :meth:`wake` sets ``event`` then (or when the call is handed the carrier's
    place: ``baton``). Only a call that waits for a carrier has an ``event``: a carrier
    learns its outcome by returning from the flush."""

    __slots__ = ("jobs", "event", "result", "error", "baton")

    def __init__(self, jobs: Sequence[Any]) -> None:
        self.jobs = jobs
        self.event: trio.Event | None = None
        self.result: list[Any] | None = None
        self.error: BaseException | None = None
        self.baton = False

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()


class Coalescer:
    """The calls of one kind on one queue. ``flush(batch)`` sends a batch and fills in every
    slot's ``result`` or ``error`` and wakes it (:meth:`Slot.wake`); it must not raise but for
    cancellation (after doing the same)."""

    __slots__ = ("_flush", "pending", "inflight", "flying", "last")

    def __init__(self, flush: Callable[[list[Slot]], Awaitable[None]]) -> None:
        self._flush = flush
        self.pending: list[Slot] = []  # calls waiting for a carrier (only while inflight == PIPELINE)
        self.inflight = 0  # batches sent and not answered, and carriers about to send
        self.flying = 0  # jobs in the batches sent
        self.last = 0  # calls the last batch carried

    async def submit(self, jobs: Sequence[Any]) -> list[Any]:
        """Send ``jobs`` (items) with whatever other calls are ready to go with them: their
        outcomes, in order."""
        slot = Slot(jobs)
        if self.inflight >= PIPELINE:
            slot.event = event = trio.Event()
            self.pending.append(slot)
            try:
                await event.wait()
            except BaseException:
                if slot in self.pending:
                    self.pending.remove(slot)
                if slot.baton:
                    self._pass_baton()
                raise
            if not slot.baton:
                return _result(slot)
            # handed the place of a finished carrier: carry the next batch
        else:
            self.inflight += 1
            if self.inflight > 1 or self.last > 1:
                # Other producers are about (a batch is at the server, or the last one
                # carried several calls): let those ready to run (woken by the replies to
                # the previous batch) join this one first. A lone caller never waits here.
                await trio.lowlevel.cancel_shielded_checkpoint()
        batch = self._take(slot)
        size = sum(len(s.jobs) for s in batch)
        self.flying += size
        try:
            await self._flush(batch)
        finally:
            self.flying -= size
            self._pass_baton()
        return _result(slot)

    def _take(self, own: Slot) -> list[Slot]:
        """The carrier's batch: its own call, then calls from the front of ``pending``:
        all of them, or with another batch in flight about half the jobs of both."""
        pending = self.pending
        if self.inflight < PIPELINE or not pending:
            self.pending = []
            batch = [own, *pending]
        else:
            jobs = len(own.jobs)
            cap = max(jobs, (jobs + sum(len(s.jobs) for s in pending) + self.flying + 1) // 2)
            n = 0
            while n < len(pending) and jobs + len(pending[n].jobs) <= cap:
                jobs += len(pending[n].jobs)
                n += 1
            batch, self.pending = [own, *pending[:n]], pending[n:]
        self.last = len(batch)
        return batch

    def _pass_baton(self) -> None:
        """A carrier is done: the first waiting call carries the next batch in its place."""
        if self.pending:
            nxt = self.pending.pop(0)
            nxt.baton = True
            nxt.wake()
        else:
            self.inflight -= 1


def _result(slot: Slot) -> list[Any]:
    if slot.error is not None:
        raise slot.error
    assert slot.result is not None, "a batch left a call without an outcome"
    return slot.result
