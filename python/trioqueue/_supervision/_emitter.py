"""Event callbacks: registration and a dispatcher task that runs them in order."""

from __future__ import annotations

import inspect
import logging
import math
from time import perf_counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._model._errors import ValidationError
from .._model._types import EVENT_NAMES, QueueEvent

__all__ = ["EventCallback", "Emitter"]

logger = logging.getLogger("trioqueue")

# How long the dispatcher may deliver queued events back to back before it lets the
# other tasks run (and checks for cancellation).
DISPATCH_SLICE = 0.001

EventCallback = Callable[[QueueEvent], Awaitable[None] | None]


class Emitter:
    """Holds ``on()`` callbacks and delivers events to them from one dispatcher task.

    Emitting never blocks and never raises: events go into an unbounded channel that the
    dispatcher (started with :meth:`run` in the owner's nursery) drains, awaiting async
    callbacks one at a time. A callback that raises is logged and reported as an
    ``error`` event (an ``error`` callback that raises is only logged).
    """

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._callbacks: dict[str, list[EventCallback]] = {}
        self._send: trio.MemorySendChannel[QueueEvent] | None = None
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
        if self.streams:
            event = QueueEvent(name, self.queue, job_id, data)
            for stream in self.streams:
                stream.push(event)
        if name not in self._callbacks:
            if name == "error":
                logger.warning("trioqueue[%s] error: %s", self.queue, data.get("error") or data)
            return
        if self._send is None:
            return
        try:
            self._send.send_nowait(QueueEvent(name, self.queue, job_id, data))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver events until :meth:`close`; then drain what is left and return.

        Events already queued are delivered back to back, with a schedule point (and a
        cancellation check) at least every :data:`DISPATCH_SLICE` seconds rather than one
        per event: a burst of events costs one trip through the scheduler, not one each."""
        send, receive = trio.open_memory_channel[QueueEvent](math.inf)
        self._send = send
        task_status.started()
        async with receive:
            yield_at = 0.0
            while True:
                try:
                    event = receive.receive_nowait()
                except trio.WouldBlock:
                    try:
                        event = await receive.receive()
                    except trio.EndOfChannel:
                        return
                    yield_at = perf_counter() + DISPATCH_SLICE
                except trio.EndOfChannel:
                    return
                for callback in self._callbacks.get(event.name, ()):
                    try:
                        ret = callback(event)
                        if inspect.isawaitable(ret):
                            await ret
                    except Exception as exc:
                        logger.exception("trioqueue[%s] %s callback %r failed", self.queue, event.name, callback)
                        if event.name != "error":
                            self.emit("error", event.job_id, error=exc, where=f"{event.name} callback")
                if perf_counter() >= yield_at:
                    await trio.lowlevel.checkpoint()
                    yield_at = perf_counter() + DISPATCH_SLICE

    def close(self) -> None:
        """Stop accepting events; :meth:`run` returns once it has delivered the rest."""
        if self._send is not None:
            self._send.close()
            self._send = None
