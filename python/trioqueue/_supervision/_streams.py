"""Events as async iterators: ``Queue.events()`` and ``Queue.watch()``.

A stream is fed by the queue's :class:`~trioqueue._supervision._emitter.Emitter` (every event a callback
could get) without ever blocking it: each stream has a bounded buffer, and when a slow
reader lets it fill up, further events are dropped and counted (:attr:`EventStream.dropped`);
the reader then gets one ``resync`` event, in order, before the events that came after
the gap — its cue to re-read what it tracks (``get_status``). Memory stays bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING, Any

import trio

from .._model._errors import ValidationError
from .._model._types import EVENT_NAMES, QueueEvent

if TYPE_CHECKING:
    from .._model._types import JobStatus

__all__ = ["EventStream", "watch"]


class EventStream:
    """An async iterator of :class:`QueueEvent`, filtered by event names and job ids."""

    def __init__(self, queue: str, kinds: Collection[str] | None, job_ids: Collection[str] | None, buffer: int) -> None:
        if kinds is not None:
            unknown = set(kinds) - EVENT_NAMES
            if unknown:
                raise ValidationError(f"unknown event names {sorted(unknown)}; expected some of {sorted(EVENT_NAMES)}")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ValidationError(f"buffer must be a positive int, got {buffer!r}")
        self.queue = queue
        self.kinds = frozenset(kinds) if kinds is not None else None
        self.job_ids = frozenset(job_ids) if job_ids is not None else None
        self.buffer = buffer
        self.dropped = 0  # events lost because the reader fell behind
        self._items: deque[QueueEvent] = deque()
        self._gap = False
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def wants(self, name: str) -> bool:
        return self.kinds is None or name in self.kinds or name == "resync"

    def push(self, event: QueueEvent) -> None:
        """Called by the emitter: never blocks, never raises."""
        if self._closed or not self.wants(event.name):
            return
        if self.job_ids is not None and event.job_id is not None and event.job_id not in self.job_ids:
            return
        if len(self._items) >= self.buffer:
            self.dropped += 1
            self._gap = True
            return
        if self._gap:
            self._gap = False
            self._items.append(QueueEvent("resync", self.queue, None, {"dropped": self.dropped}))
        self._items.append(event)
        self._lot.unpark()

    def close(self) -> None:
        self._closed = True
        self._lot.unpark_all()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> QueueEvent:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            await self._lot.park()
        await trio.lowlevel.checkpoint()
        return self._items.popleft()


async def watch(queue: Any, job_id: str) -> AsyncIterator[JobStatus | None]:
    """Yield ``job_id``'s status each time its state or progress changes, starting with the
    current one, until it is terminal (the terminal status is the last item) or unknown
    (``None``, the last item)."""
    async with queue.events(job_ids=[job_id]) as stream:
        last: tuple[Any, ...] | None = None
        while True:
            status = await queue.get_status(job_id)
            if status is None:
                yield None
                return
            key = (status.state, status.attempts, repr(status.progress))
            if key != last:
                last = key
                yield status
            if status.state.terminal:
                return
            await stream.__anext__()  # the next event about the job (or a resync)
