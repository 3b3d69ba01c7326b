"""Event callbacks: registration and a dispatcher task that runs them in order."""

from __future__ import annotations

import inspect
import logging
from collections import deque
from time import perf_counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._model._errors import ValidationError
from .._model._types import EVENT_NAMES, QueueEvent, queue_event

__all__ = ["EventCallback", "Emitter"]

logger = logging.getLogger("trioqueue")

# How long the dispatcher may deliver queued events back to back before it lets the
# other tasks run (and checks for cancellation).
DISPATCH_SLICE = 0.001

EventCallback = Callable[[QueueEvent], Awaitable[None] | None]


class Emitter:
    """Holds ``on()`` callbacks and delivers events to them from one dispatcher task.

    Emitting never blocks and never raises: events go into an unbounded queue that the
    dispatcher (started with :meth:`run` in the owner's nursery) drains, awaiting async
    callbacks one at a time. A callback that raises is logged and reported as an
    ``error`` event (an ``error`` callback that raises is only logged). Events emitted
    while no dispatcher runs (before :meth:`run`, after :meth:`close`) reach no callback.
    """

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._callbacks: dict[str, list[EventCallback]] = {}
        # the events for the dispatcher (a deque and a parking lot, not a memory channel:
        # this is the per-job path of a queue with a callback), and whether it takes them
        self._pending: deque[QueueEvent] = deque()
        self._open = False
        self._wakeup = trio.lowlevel.ParkingLot()
        self.streams: list[Any] = []  # EventStream readers (``Queue.events()``)

    def on(self, name: str, callback: EventCallback) -> EventCallback:
        if name not in EVENT_NAMES:
            raise ValidationError(f"unknown event {name!r}; expected one of {sorted(EVENT_NAMES)}")
        if not callable(callback):
            raise ValidationError(f"callback for {name!r} must be callable, got {callback!r}")
        self._callbacks.setdefault(name, []).append(callback)
        return callback

    def callbacks(self) -> dict[str, list[EventCallback]]:
        """The registered callbacks by event name (a copy)."""
        return {name: list(cbs) for name, cbs in self._callbacks.items()}

    def listening(self) -> bool:
        """Whether any callback or event stream is registered (else no event is wanted)."""
        return bool(self._callbacks) or bool(self.streams)

    def wants(self, name: str) -> bool:
        if name in self._callbacks:
            return True
        streams = self.streams
        return bool(streams) and any(s.wants(name) for s in streams)

    def emit(self, name: str, job_id: str | None = None, **data: Any) -> None:
        if self.streams or name in self._callbacks or name == "error":
            self.emit_data(name, job_id, data)

    def emit_data(self, name: str, job_id: str | None, data: dict[str, Any]) -> None:
        """:meth:`emit` of the event's ``data`` dict as it is (not copied: the listener's
        lazily decoded ``completed`` data)."""
        event = None
        if self.streams:
            event = queue_event(name, self.queue, job_id, data)
            for stream in self.streams:
                stream.push(event)
        if name not in self._callbacks:
            if name == "error":
                logger.warning("trioqueue[%s] error: %s", self.queue, data.get("error") or data)
            return
        if not self._open:
            return
        pending = self._pending
        pending.append(queue_event(name, self.queue, job_id, data) if event is None else event)
        if len(pending) == 1:  # else the dispatcher was woken already (or runs)
            self._wakeup.unpark()

    def emit_each(self, name: str, job_ids: list[str | None], datas: list[dict[str, Any]]) -> None:
        """:meth:`emit_data` of each job id of ``job_ids`` with its data in ``datas``, in
        order, with the checks made once for the batch (a batch of settlements'
        ``completed`` events). ``name`` is a job event's, never ``error``."""
        streams = self.streams
        wanted = self._open and name in self._callbacks
        if not streams and not wanted:
            return
        queue = self.queue
        pending = self._pending
        idle = not pending
        append = pending.append
        for job_id, data in zip(job_ids, datas, strict=True):
            event = queue_event(name, queue, job_id, data)
            for stream in streams:
                stream.push(event)
            if wanted:
                append(event)
        if idle and pending:  # else the dispatcher was woken already (or runs)
            self._wakeup.unpark()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver events until :meth:`close`; then drain what is left and return.

        Events already queued are delivered back to back, with a schedule point (and a
        cancellation check) at least every :data:`DISPATCH_SLICE` seconds rather than one
        per event: a burst of events costs one trip through the scheduler, not one each."""
        pending = self._pending
        callbacks = self._callbacks
        self._open = True
        task_status.started()
        try:
            yield_at = 0.0
            while True:
                if not pending:
                    if not self._open:
                        return
                    await self._wakeup.park()
                    yield_at = perf_counter() + DISPATCH_SLICE
                    continue
                event = pending.popleft()
                for callback in callbacks.get(event.name, ()):
                    try:
                        ret = callback(event)
                        if ret is not None and inspect.isawaitable(ret):
                            await ret
                    except Exception as exc:
                        logger.exception("trioqueue[%s] %s callback %r failed", self.queue, event.name, callback)
                        if event.name != "error":
                            self.emit("error", event.job_id, error=exc, where=f"{event.name} callback")
                if perf_counter() >= yield_at:
                    await trio.lowlevel.checkpoint()
                    yield_at = perf_counter() + DISPATCH_SLICE
        finally:
            self._open = False  # (cancelled: what is left is dropped, as is what comes)
            pending.clear()

    def close(self) -> None:
        """Stop accepting events; :meth:`run` returns once it has delivered the rest."""
        self._open = False
        self._wakeup.unpark_all()
