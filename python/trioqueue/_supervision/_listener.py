"""The Queue's subscription to its storage events, opened by need.

A Queue subscribes only to what something in it uses (issue 11: route events by need):

- ``NONE``: a pure producer (``enqueue`` only, no handler, no job-event callback or
  stream) does not subscribe at all, so it never receives (or decodes) the ``enqueued``
  events of its own enqueues;
- ``NOTICES``: waiters of ``enqueue_and_wait`` (terminal outcomes), a consumer (cancel
  requests, fenced settlements) and callbacks/streams of notice kinds only
  (``completed``, ``failed``...): ``subscribe(queue, kinds=NOTICE_KINDS)``, which Redis
  serves from the queue's notices channel;
- ``ALL``: a callback or stream that wants other job events (``enqueued``, ``progress``,
  ``Queue.watch``...): every event.

The level only goes up while the queue runs (the first waiter, an ``events()`` stream
or an ``on()`` callback may raise it). Raising it opens the wider subscription, waits
until it is live, and only then drops the narrower one; events still in flight on the
old one are dropped rather than risking duplicates, so waiters re-read the registry and
callbacks and streams get a ``resync`` (the documented cue: events may have been lost).
Each subscriber still sees its events in publication order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._model._types import STORAGE_EVENT_NAMES
from .._model._serde import Serde, decode_error
from ._waiters import Waiters
from ..storage._base import NOTICE_KINDS, Storage, StorageEvent
from ..storage._capabilities import NonBlockingStart

if TYPE_CHECKING:
    from ._emitter import Emitter

__all__ = ["ALL", "NONE", "NOTICES", "CompletedData", "ConsumerLink", "Listener", "level_for"]

NONE, NOTICES, ALL = 0, 1, 2
_RESULT = attrgetter("result")
_TERMINAL_EVENTS = frozenset({"completed", "failed", "cancelled", "removed"})
# Queue event names fed by the storage's event stream (the others are the queue's own:
# started, stopped, leadership_*, and error/resync, which need no subscription by
# themselves: a queue that subscribes to nothing loses no event).
_STORAGE_FED = STORAGE_EVENT_NAMES | {"progress", "cancel_requested"}


class ConsumerLink(Protocol):
    """What the listener tells a worker's consumer (the cancel requests for its worker
    id, the queue's pause notices) and what its Queue asks of it (:meth:`pause`: a pause
    made by this queue hands its prefetched claims back before it returns)."""

    @property
    def worker_id(self) -> str: ...

    def request_cancel(self, job_id: str) -> None: ...

    def paused(self) -> None: ...

    async def pause(self) -> None: ...


class CompletedData(dict[str, Any]):
    """The ``data`` of a ``completed`` event: ``worker_id``, and, filled when it is first
    read, not before (a callback that only counts completions never decodes a result),
    ``error`` if the event has one and the job's ``result`` decoded by the queue's
    ``result_serde`` (``None`` when it is no longer stored; one that cannot be decoded is
    ``None`` too, and ``result_error`` says why). Reads and writes see it filled; a copy
    or a pickle is a plain dict."""

    __slots__ = ("_pending", "_serde")
    _pending: StorageEvent | None  # the event whose result and error are still to read
    _serde: Serde

    @staticmethod
    def of(ev: StorageEvent, serde: Serde) -> CompletedData:
        """The data of ``ev`` (a ``completed`` event), its result to decode by ``serde``."""
        # worker_id now (by dict's own __init__: no frame), the rest when first read;
        # never empty, so that json.dumps (which skips an empty dict's items()) fills it
        data = CompletedData(worker_id=ev.worker_id)
        data._pending = ev
        data._serde = serde
        return data

    def _fill(self) -> None:
        try:
            ev = self._pending
        except AttributeError:  # made empty, not by of()
            ev = None
        if ev is None:
            return
        self._pending = None
        serde = self._serde
        put = dict.__setitem__
        if ev.error is not None:
            put(self, "error", decode_error(ev.error))
        put(self, "result", None)
        if ev.result is not None:
            try:
                put(self, "result", serde.loads(ev.result))
            except Exception as exc:  # noqa: BLE001 - told in the event, not raised
                put(self, "result_error", f"result of job {ev.job_id!r} cannot be decoded: {exc}")

    def __eq__(self, other: object) -> bool:
        self._fill()
        if isinstance(other, CompletedData):
            other._fill()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._fill()
        return (dict, (dict(self.items()),))


def _filling(name: str) -> Any:
    method = getattr(dict, name)

    def filled(self: CompletedData, *args: Any, **kwargs: Any) -> Any:
        self._fill()
        return method(self, *args, **kwargs)

    filled.__name__ = filled.__qualname__ = name
    return filled


for _name in (
    "__contains__", "__delitem__", "__getitem__", "__ior__", "__iter__", "__len__", "__or__", "__repr__",
    "__reversed__", "__ror__", "__setitem__", "clear", "copy", "get", "items", "keys", "pop", "popitem",
    "setdefault", "update", "values",
):
    setattr(CompletedData, _name, _filling(_name))


def _missing_results(batch: list[StorageEvent]) -> bool:
    """Whether a ``completed`` event of ``batch`` came without its result (see
    :meth:`Listener._with_results`)."""
    if None not in map(_RESULT, batch):
        return False
    return any(ev.result is None and ev.kind == "completed" and ev.job_id for ev in batch)


def level_for(kinds: Collection[str] | None) -> int:
    """The subscription level a callback or stream of event names ``kinds`` (``None``:
    every name) needs."""
    if kinds is None:
        return ALL
    fed = set(kinds) & _STORAGE_FED
    if not fed:
        return NONE
    return NOTICES if fed <= NOTICE_KINDS else ALL


class Listener:
    """Holds the queue's one live subscription (see the module docstring) and dispatches
    its events to waiters, the consumers, callbacks and streams.

    ``storage`` and ``queue`` say where to subscribe; ``events`` holds the callbacks and
    streams and emits to them; ``waiters`` are the queue's ``enqueue_and_wait`` callers;
    ``result_serde`` decodes progress values. Each Worker consuming the queue in this
    process attaches its consumer (cancel requests for its worker id and pauses go to it)
    and its reaper's ``notice_due`` (told of each ``due`` notice) while it runs
    (:meth:`attach`)."""

    def __init__(self, storage: Storage, queue: str, events: Emitter, waiters: Waiters, result_serde: Serde) -> None:
        self.storage = storage
        self.queue = queue
        self.events = events
        self.waiters = waiters
        self.result_serde = result_serde
        self.consumers: list[ConsumerLink] = []  # attached: they need the notices
        self.level = NONE  # of the live subscription
        self._scope: trio.CancelScope | None = None  # the live subscription's follower
        self._closed: trio.Event | None = None  # set once it has unsubscribed
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()
        self.pending = NONE  # a level want() asked for
        # The reapers of the attached workers, told of each ``due`` notice (epoch seconds;
        # 0.0 after a resync: look now), so that they promote delayed jobs on time.
        self.due: list[Callable[[float], None]] = []

    async def attach(self, consumer: ConsumerLink, on_due: Callable[[float], None] | None = None) -> None:
        """A worker's ``consumer`` (and its reaper's ``on_due``) from now on; returns once
        the subscription carries the notices it needs (the queue must be running)."""
        self.consumers.append(consumer)
        if on_due is not None:
            self.due.append(on_due)
        await self.ensure(NOTICES)

    def detach(self, consumer: ConsumerLink, on_due: Callable[[float], None] | None = None) -> None:
        """Undo :meth:`attach` (the worker stopped)."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if on_due is not None and on_due in self.due:
            self.due.remove(on_due)

    def needed(self) -> int:
        """The level the queue's consumer, callbacks and streams need now."""
        level = NOTICES if self.consumers or self.waiters else NONE
        for name in self.events.callbacks():
            level = max(level, level_for((name,)))
        for stream in self.events.streams:
            level = max(level, level_for(stream.kinds))
        return level

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe at the level needed at start; reports started once it is live; then
        serve :meth:`ensure` until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.ensure(self.needed())
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._scope = self._closed = None
            self.level = self.pending = NONE

    async def ensure(self, level: int) -> None:
        """Return once the live subscription is at ``level`` or above (at once when it
        is: the common case costs a comparison). Raises what subscribing raised."""
        if self.level >= level:
            return
        async with self._lock:
            if self.level >= level or self._nursery is None:
                return
            narrower = self._closed
            await self._nursery.start(self._follow, level)
            if narrower is not None:
                await narrower.wait()  # unsubscribed: one subscription at a time

    def want(self, level: int) -> None:
        """Raise the level in the background (``on()`` called while running); the queue's
        next storage call that publishes events waits for it (:meth:`caught_up`), so a
        callback registered before an ``enqueue`` hears of that job."""
        if self.level >= level or self._nursery is None:
            return
        self.pending = max(self.pending, level)

        async def raise_level() -> None:
            try:
                await self.ensure(level)
            except Exception as exc:  # noqa: BLE001 - reported, the queue keeps running
                self.events.emit("error", error=exc, where="subscribing to events")

        self._nursery.start_soon(raise_level)

    async def caught_up(self) -> None:
        """Wait for a level :meth:`want` asked for (nothing to do, no checkpoint, when
        none is pending: the producer's fast path)."""
        if self.pending > self.level:
            await self.ensure(self.pending)

    async def _follow(self, level: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        kinds = None if level >= ALL else NOTICE_KINDS
        closed = trio.Event()
        try:
            await self._subscribed(level, kinds, closed, task_status)
        finally:
            closed.set()

    async def _subscribed(
        self, level: int, kinds: frozenset[str] | None, closed: trio.Event, task_status: trio.TaskStatus[None]
    ) -> None:
        if isinstance(self.storage, NonBlockingStart):
            await self._subscribed_nowait(self.storage, level, kinds, closed, task_status)
            return
        with trio.CancelScope() as scope:
            async with self.storage.subscribe(self.queue, kinds) as receive:
                # Live: from now on every event reaches this subscription.
                self._take_over(scope, closed, level)
                task_status.started()
                async for batch in receive:
                    if self._scope is not scope:
                        return  # superseded (the cancellation is on its way)
                    if self.events.wants("completed"):
                        batch = await self._with_results(batch)
                    self._dispatch(batch)

    def _take_over(self, scope: trio.CancelScope, closed: trio.Event, level: int) -> None:
        """A subscription at ``level``, live now, takes over from the narrower one: what
        that one still had in flight is dropped (a resync)."""
        old, self._scope, self._closed = self._scope, scope, closed
        had = self.level
        self.level = level
        if old is not None:
            old.cancel()
        if had > NONE:
            self._resync()

    async def _subscribed_nowait(
        self,
        storage: NonBlockingStart,
        level: int,
        kinds: frozenset[str] | None,
        closed: trio.Event,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """:meth:`_subscribed` on a storage that hands its events over as a plain call
        (:meth:`NonBlockingStart.subscribe_nowait`): each batch is dispatched as it is
        published, with no trip through the scheduler to this task, but a batch whose
        ``completed`` events need their results read back (and every batch after it,
        to keep the order) goes through this task."""
        backlog, later = trio.open_memory_channel[list[StorageEvent]](math.inf)
        waiting = [0]  # batches in the backlog
        with trio.CancelScope() as scope:

            def deliver(batch: list[StorageEvent]) -> None:
                if self._scope is not scope:
                    return  # superseded (the cancellation is on its way)
                if waiting[0] or (self.events.wants("completed") and _missing_results(batch)):
                    waiting[0] += 1
                    backlog.send_nowait(batch)
                    return
                try:
                    self._dispatch(batch)
                except Exception as exc:  # noqa: BLE001 - not the publishing step's failure
                    self.events.emit("error", error=exc, where="dispatching storage events")

            with storage.subscribe_nowait(self.queue, kinds, deliver):
                self._take_over(scope, closed, level)
                task_status.started()
                async for batch in later:
                    if self._scope is not scope:
                        return
                    self._dispatch(await self._with_results(batch))
                    waiting[0] -= 1

    async def _with_results(self, batch: list[StorageEvent]) -> list[StorageEvent]:
        """``batch`` with the result of each ``completed`` event that came without it
        (too large to ride along: over 64 KiB on Redis, 7000 bytes on PostgreSQL) read
        back from the registry, for the callbacks and streams that get the result. Only
        then: a waiter reads it back by itself, and a batch whose events all carry their
        results costs a scan."""
        if None not in map(_RESULT, batch):  # (a scan in C: the common case costs no bytecode an event)
            return batch
        missing = [i for i, ev in enumerate(batch) if ev.result is None and ev.kind == "completed" and ev.job_id]
        if not missing:
            return batch
        batch = list(batch)
        for i in missing:
            ev = batch[i]
            try:
                record = await self.storage.get_job(self.queue, ev.job_id)
            except Exception:  # noqa: BLE001 - the event goes without its result
                continue
            if record is not None and record.result is not None and (ev.token is None or record.token == ev.token):
                batch[i] = ev._replace(result=record.result)
        return batch

    def _resync(self) -> None:
        self.waiters.wake_all()
        for on_due in self.due:
            on_due(0.0)
        self.events.emit("resync")

    def _dispatch(self, batch: list[StorageEvent]) -> None:
        events = self.events
        waiters = self.waiters
        consumers = self.consumers
        # (once a batch: no waiter comes or goes, no callback is registered, while it is dispatched)
        waiting = bool(waiters)
        wants_completed = events.wants("completed")
        serde = self.result_serde
        # the completed events' job ids and data, emitted in runs (two lists: no tuple a job)
        done_ids: list[str | None] = []
        done: list[dict[str, Any]] = []
        for ev in batch:
            kind = ev.kind
            if kind == "completed":  # the most frequent kind first: what the branches below do with it
                if waiting:
                    waiters.offer(ev)
                if wants_completed:  # its result is decoded when a callback reads it
                    completed = CompletedData(worker_id=ev.worker_id)  # (CompletedData.of, inline)
                    completed._pending = ev
                    completed._serde = serde
                    done_ids.append(ev.job_id or None)
                    done.append(completed)
                continue
            if done:  # the run of completed events before this one goes first (in order)
                events.emit_each("completed", done_ids, done)
                done_ids, done = [], []
            if waiting:
                if kind in _TERMINAL_EVENTS:
                    waiters.offer(ev)
                elif kind == "resync" or kind == "cleared":  # re-read: a cleared job is gone
                    waiters.wake_all()
            if kind == "resync":
                for on_due in self.due:
                    on_due(0.0)
                events.emit("resync")
                continue
            if kind == "due":
                if ev.result:
                    for on_due in self.due:
                        on_due(int(ev.result) / 1000)
                continue
            if kind == "paused":
                for consumer in consumers:
                    consumer.paused()
            if kind == "cancel_requested":
                for consumer in consumers:
                    if ev.worker_id == consumer.worker_id:
                        consumer.request_cancel(ev.job_id)
                events.emit(kind, ev.job_id, worker_id=ev.worker_id)
                continue
            if kind == "progress":
                if events.wants(kind) and ev.result is not None:
                    try:
                        value = self.result_serde.loads(ev.result)
                    except Exception as exc:
                        events.emit("error", ev.job_id, error=exc, where="decoding a progress event")
                    else:
                        events.emit(kind, ev.job_id, worker_id=ev.worker_id, progress=value)
                continue
            if kind in STORAGE_EVENT_NAMES:
                if events.wants(kind):
                    data: dict[str, Any] = {"worker_id": ev.worker_id}
                    if ev.error is not None:
                        data["error"] = decode_error(ev.error)
                    events.emit(kind, ev.job_id or None, **data)
            elif kind == "fenced":
                events.emit(
                    "error",
                    ev.job_id,
                    worker_id=ev.worker_id,
                    error=f"settlement of job {ev.job_id!r} by worker {ev.worker_id!r} refused: "
                    "the worker no longer held it (it was recovered as stalled)",
                )
            elif kind == "error":
                events.emit("error", ev.job_id or None, error=ev.error.decode() if ev.error else "storage error")
        if done:
            events.emit_each("completed", done_ids, done)
