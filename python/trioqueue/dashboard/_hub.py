"""The dashboard's live core: one event subscription per queue for the whole process,
fanned out to every browser.

For each queue the hub runs a producer-only :class:`~trioqueue.Queue` (no handler: it
only subscribes and serves the admin calls), reads ``queue.events()``, keeps per-second
throughput counters for the chart, re-reads the queue's counts (at most every
``counts_interval`` seconds, only after events) and sends small JSON messages to the
subscribed browsers: ``counts``, and ``jobs`` gathering the job events of up to
``batch_interval`` seconds (kinds counted, up to 200 ids, and the results of the
completed ones among them, each previewed as at most 200 characters of JSON), so a busy
queue costs each browser a few messages a second, not one per event. A browser that falls behind loses messages and gets ``resync`` (it
reloads); memory stays bounded.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from .._supervision._queue import Queue
from ..storage._base import Storage
from ..storage._capabilities import Administration, require

__all__ = ["Hub", "Subscriber"]

logger = logging.getLogger("trioqueue.dashboard")

HISTORY_SECONDS = 600  # the throughput chart's window
CHART_KINDS = ("enqueued", "completed", "failed")
_COUNT_EVENTS = frozenset(
    {"enqueued", "completed", "failed", "failing", "requeued", "cancelled", "stalled", "promoted", "resync", "removed", "cleared"}
)
_FORWARDED = _COUNT_EVENTS | {"progress", "cancel_requested", "paused", "resumed", "removed"}


class Subscriber:
    """One browser's stream of messages ``(event_name, data)``, bounded."""

    def __init__(self, queues: frozenset[str] | None, limit: int = 500) -> None:
        self.queues = queues
        self.limit = limit
        self.dropped = 0
        self._items: deque[tuple[str, dict[str, Any]]] = deque()
        self._gap = False
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def push(self, name: str, data: dict[str, Any]) -> None:
        if self._closed:
            return
        queue = data.get("queue")
        if self.queues is not None and queue is not None and queue not in self.queues:
            return
        if len(self._items) >= self.limit:
            self.dropped += 1
            self._gap = True
            return
        if self._gap:
            self._gap = False
            self._items.append(("resync", {"dropped": self.dropped}))
        self._items.append((name, data))
        self._lot.unpark()

    def close(self) -> None:
        self._closed = True
        self._lot.unpark_all()

    async def get(self) -> tuple[str, dict[str, Any]] | None:
        """The next message; ``None`` once closed."""
        while not self._items:
            if self._closed:
                return None
            await self._lot.park()
        return self._items.popleft()


class _Batch:
    """Job events of one queue gathered for one ``jobs`` message."""

    MAX_IDS = 200
    PREVIEW = 200  # characters of a completed job's result shown

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}
        self.ids: dict[str, None] = {}  # an ordered set
        self.results: dict[str, str] = {}  # completed job id -> its result's preview
        self.more = False  # ids were left out: pages interested in any job re-read
        self.ready = trio.Event()

    def add(self, kind: str, job_id: str | None, data: dict[str, Any] | None = None) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if job_id:
            if len(self.ids) < self.MAX_IDS:
                self.ids[job_id] = None
                if kind == "completed" and data is not None:
                    self.results[job_id] = preview(data.get("result"), self.PREVIEW)
            else:
                self.more = True
        self.ready.set()


def preview(value: Any, limit: int) -> str:
    """``value`` as JSON (``repr`` for what JSON cannot say), cut to ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # (circular containers...)
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Throughput:
    """Events per second over the last ``HISTORY_SECONDS``, per kind."""

    def __init__(self) -> None:
        self.start = math.floor(time.time())
        self.series = {kind: deque([0] * HISTORY_SECONDS, maxlen=HISTORY_SECONDS) for kind in CHART_KINDS}

    def _advance(self, now: int) -> None:
        last = self.start + HISTORY_SECONDS - 1
        for _ in range(min(now - last, HISTORY_SECONDS)):
            for series in self.series.values():
                series.append(0)
        if now > last:
            self.start = now - HISTORY_SECONDS + 1

    def add(self, kind: str, at: float) -> None:
        second = math.floor(at)
        self._advance(second)
        index = second - self.start
        if 0 <= index < HISTORY_SECONDS:
            self.series[kind][index] += 1

    def snapshot(self) -> dict[str, Any]:
        self._advance(math.floor(time.time()))
        return {"end": self.start + HISTORY_SECONDS, "series": {k: list(v) for k, v in self.series.items()}}


class Hub:
    """Queues of one storage, their live events and counts. ``await nursery.start(hub.run)``."""

    def __init__(
        self,
        storage: Storage,
        *,
        names: Sequence[str] | None = None,
        discover_interval: float = 5.0,
        counts_interval: float = 0.25,
        batch_interval: float = 0.2,
    ) -> None:
        self.storage = storage
        self.fixed_names = list(names) if names else None
        self.discover_interval = discover_interval
        self.counts_interval = counts_interval
        self.batch_interval = batch_interval
        self._batches: dict[str, _Batch] = {}
        self.queues: dict[str, Queue[Any, Any]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.paused: dict[str, bool] = {}
        self.throughput: dict[str, _Throughput] = {}
        self.last_event: dict[str, float] = {}  # when the hub last got an event of each queue
        self.subscribers: set[Subscriber] = set()
        self._dirty: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._starting: dict[str, trio.Event] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the queues until cancelled; reports started once the known queues are
        subscribed. On exit every browser stream is closed."""
        try:
            async with self.storage, trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.discover()
                task_status.started()
                while True:
                    await trio.sleep(self.discover_interval)
                    try:
                        await self.discover()
                    except Exception:  # noqa: BLE001 - a storage hiccup: try again later
                        logger.warning("dashboard: listing the queues failed", exc_info=True)
        finally:
            self._nursery = None
            for sub in list(self.subscribers):
                sub.close()

    async def discover(self) -> None:
        """Start watching queues that appeared in the storage (or the fixed names)."""
        if self.fixed_names is not None:
            names = self.fixed_names
        else:
            storage = require(self.storage, Administration, "the dashboard without queue names (it lists the storage's)")
            names = list(await storage.queue_names())
        for name in names:
            await self.ensure(name)

    async def ensure(self, name: str) -> Queue[Any, Any]:
        """The running Queue named ``name`` (started on first use)."""
        while name not in self.queues:
            if self._nursery is None:
                raise RuntimeError("the dashboard hub is not running")
            starting = self._starting.get(name)
            if starting is not None:
                await starting.wait()
                continue
            starting = self._starting[name] = trio.Event()
            try:
                await self._nursery.start(self._watch, name)
            finally:
                del self._starting[name]
                starting.set()
        return self.queues[name]

    def stop(self) -> None:
        """Close every browser stream (the server can then shut down gracefully)."""
        for sub in list(self.subscribers):
            sub.close()

    @asynccontextmanager
    async def subscribe(self, queues: frozenset[str] | None = None) -> AsyncIterator[Subscriber]:
        sub = Subscriber(queues)
        self.subscribers.add(sub)
        try:
            yield sub
        finally:
            sub.close()
            self.subscribers.discard(sub)

    def snapshot(self, queues: frozenset[str] | None = None) -> dict[str, Any]:
        """What a browser gets first: counts, paused flags, throughput history, and when
        each queue last had an event (a page rendered before that re-reads itself: it may
        have missed an event that came before its stream was subscribed)."""
        names = sorted(n for n in self.queues if queues is None or n in queues)
        return {
            "now": time.time(),
            "counts": {n: self.counts.get(n, {}) for n in names},
            "paused": {n: self.paused.get(n, False) for n in names},
            "throughput": {n: self.throughput[n].snapshot() for n in names},
            "last_event": {n: self.last_event.get(n, 0.0) for n in names},
        }

    def _broadcast(self, name: str, data: dict[str, Any]) -> None:
        for sub in list(self.subscribers):
            sub.push(name, data)

    async def _watch(self, name: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        queue: Queue[Any, Any] = Queue(self.storage, name=name, reaper=False)
        self.throughput[name] = _Throughput()
        self._dirty[name] = trio.Event()
        self._batches[name] = _Batch()
        async with queue:
            async with queue.events(buffer=10_000) as stream, trio.open_nursery() as nursery:
                self.queues[name] = queue
                try:
                    await self._refresh(name)
                except Exception:  # noqa: BLE001 - read again by the loop
                    logger.warning("dashboard: reading the counts of %r failed", name, exc_info=True)
                    self._dirty[name].set()
                nursery.start_soon(self._counts_loop, name)
                nursery.start_soon(self._jobs_loop, name)
                task_status.started()
                async for event in stream:
                    if event.name not in _FORWARDED:
                        continue
                    now = self.last_event[name] = time.time()
                    if event.name in CHART_KINDS:
                        self.throughput[name].add(event.name, now)
                    if event.name in _COUNT_EVENTS or event.name in ("paused", "resumed"):
                        self._dirty[name].set()
                    self._batches[name].add(event.name, event.job_id, event.data)

    async def _jobs_loop(self, name: str) -> None:
        """One ``jobs`` message per queue every ``batch_interval`` at most, whatever the
        rate of events: what happened (kinds counted) and to which jobs."""
        while True:
            await self._batches[name].ready.wait()
            await trio.sleep(self.batch_interval)
            batch, self._batches[name] = self._batches[name], _Batch()
            self._broadcast(
                "jobs",
                {
                    "queue": name,
                    "t": time.time(),
                    "kinds": batch.kinds,
                    "ids": list(batch.ids),
                    "results": batch.results,
                    "more": batch.more,
                },
            )

    async def _counts_loop(self, name: str) -> None:
        while True:
            await self._dirty[name].wait()
            self._dirty[name] = trio.Event()
            try:
                await self._refresh(name)
            except Exception:  # noqa: BLE001 - shown stale until the next event
                logger.warning("dashboard: reading the counts of %r failed", name, exc_info=True)
            await trio.sleep(self.counts_interval)

    async def _refresh(self, name: str) -> None:
        queue = self.queues[name]
        self.counts[name] = {str(k): v for k, v in (await queue.counts()).items()}
        self.paused[name] = await queue.is_paused()
        self._broadcast("counts", {"queue": name, "counts": self.counts[name], "paused": self.paused[name]})

    def touch(self, name: str) -> None:
        """Re-read a queue's counts soon (after an action of this dashboard)."""
        if name in self._dirty:
            self._dirty[name].set()
