"""MemoryStorage's structures: job records, queues, and the waiters and subscribers that
cross threads through each Trio run's token (all used with the storage's lock held)."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from itertools import count

import trio

from ..._core import ObjectQueue, format_state
from ..._model._types import MAX_PRIORITY, EnqueueStatus, JobError
from .._base import WAITING_CHILDREN, EnqueueOutcome, NewJob, StorageEvent, select_events, waiting_state
from ._index import StateIndex
from .._flowstate import FlowState

from .._base import DELAYED as _DELAYED
from .._base import FAILING as _FAILING
from .._base import PROCESSING as _PROCESSING
from .._base import QUEUED as _QUEUED

_QUEUED_OUTCOME = EnqueueOutcome(EnqueueStatus.QUEUED)


class _Rec:
    __slots__ = (
        "id",
        "_kind",
        "index",
        "iseq",
        "ts_ms",
        "worker",
        "attempts",
        "max_attempts",
        "result_ttl",
        "envelope",
        "created_at_ms",
        "result",
        "error",
        "expires_at",
        "lease_deadline",
        "run_at",
        "token",
        "claim",
        "claims",
        "started",
        "progress",
        "cancel_requested",
        "priority",
        "parent",
        "flow",
    )

    def __init__(self, job: NewJob, now_ms: int, index: StateIndex) -> None:
        self.id = job.id
        self._kind = _QUEUED
        self.index = index  # the queue's per-state index, told of every state change
        self.iseq = 0
        self.ts_ms = now_ms
        self.worker: str | None = None
        self.attempts = 0
        self.max_attempts = job.max_attempts
        self.result_ttl = job.result_ttl
        self.envelope = job.envelope
        self.created_at_ms = now_ms
        self.result: bytes | None = None
        self.error: bytes | None = None
        self.expires_at = math.inf
        self.lease_deadline = math.inf
        self.run_at = math.inf
        self.token = job.token  # the incarnation
        self.claim: str | None = None  # the current (or last settled) claim's token
        self.claims = 0  # claims of this incarnation so far
        self.started = False  # the current claim's attempt is counted
        self.progress: bytes | None = None
        self.cancel_requested = False  # cancel() reached it while it was processing
        self.priority = job.priority  # its lane of the ready list, for life
        self.parent: tuple[str, _Rec] | None = None  # a child of a tree: (queue, parent)
        self.flow: _Flow | None = None  # a parent: its children
        index.enter(self, None, _QUEUED)

    @property
    def kind(self) -> str:
        return self._kind

    @kind.setter
    def kind(self, new: str) -> None:
        old = self._kind
        self._kind = new
        self.index.enter(self, old, new)

    def state(self) -> str:
        if self.kind == _PROCESSING:
            return format_state(_PROCESSING, self.ts_ms, self.worker)
        if self.kind == _FAILING:
            return format_state(_FAILING, self.ts_ms, self.attempts)
        if self.kind == _DELAYED:
            return format_state(_DELAYED, self.ts_ms, int(self.run_at * 1000))
        if self.kind == WAITING_CHILDREN:
            return waiting_state(self.ts_ms)
        return format_state(self.kind, self.ts_ms)


class _Flow:
    """A parent's side of a tree: its ``on_child_failure`` policy, its children
    ``(queue, record)``, how many have not ended, and the failed ones ``(id, error)``."""

    __slots__ = ("policy", "children", "pending", "failures")

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.children: list[tuple[str, _Rec]] = []
        self.pending = 0
        self.failures: list[tuple[str, bytes]] = []


class _Waiter:
    """A Trio task parked in one thread, woken from any thread."""

    __slots__ = ("thread", "token", "event")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.token = trio.lowlevel.current_trio_token()
        self.event = trio.Event()

    def wake(self) -> None:
        if self.thread == threading.get_ident():
            self.event.set()
        else:
            try:
                self.token.run_sync_soon(self.event.set)
            except trio.RunFinishedError:
                pass


class _Subscriber:
    __slots__ = ("thread", "token", "send", "kinds")

    def __init__(self, send: trio.MemorySendChannel[list[StorageEvent]], kinds: frozenset[str] | None = None) -> None:
        self.thread = threading.get_ident()
        self.token = trio.lowlevel.current_trio_token()
        self.send = send
        self.kinds = kinds  # the kinds it asked for (None: all); see Storage.subscribe

    def deliver(self, events: list[StorageEvent]) -> None:
        if self.kinds is not None:
            events = select_events(events, self.kinds)
            if not events:
                return
        if self.thread == threading.get_ident():
            _send_quietly(self.send, events)
        else:
            try:
                self.token.run_sync_soon(_send_quietly, self.send, events)
            except trio.RunFinishedError:
                pass


def _send_quietly(send: trio.MemorySendChannel[list[StorageEvent]], events: list[StorageEvent]) -> None:
    try:
        send.send_nowait(events)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


class _Lanes:
    """The ready list: one lock-free FIFO per priority (0 first), each with a front deque
    of released jobs claimed before it. A claim scans the 10 lanes: O(1) in the number of
    queued jobs. Entries are the job records themselves (no id to parse, no table to look
    up at claim time); a stale one (its job cancelled, or forgotten: ``iseq`` 0) is
    skipped at claim time."""

    __slots__ = ("lanes", "fronts")

    def __init__(self) -> None:
        self.lanes: list[ObjectQueue[_Rec]] = [ObjectQueue() for _ in range(MAX_PRIORITY + 1)]
        self.fronts: list[deque[_Rec]] = [deque() for _ in range(MAX_PRIORITY + 1)]

    def push(self, recs: list[_Rec]) -> None:
        """Append the jobs to their lanes, in order (batch calls: where the Rust queue
        beats a deque)."""
        if not recs:
            return
        first = recs[0].priority
        if all(r.priority == first for r in recs):
            self.lanes[first].push_many(recs)
            return
        by: dict[int, list[_Rec]] = {}
        for r in recs:
            by.setdefault(r.priority, []).append(r)
        for p, part in by.items():
            self.lanes[p].push_many(part)

    def push_front(self, recs: list[_Rec]) -> None:
        """Put the jobs before everything else of their lanes, in the order given."""
        for r in reversed(recs):
            self.fronts[r.priority].appendleft(r)

    def pop(self, want: int) -> list[_Rec]:
        """Up to ``want`` entries: lane 0 first, each lane's front before its FIFO."""
        out: list[_Rec] = []
        for p in range(MAX_PRIORITY + 1):
            front = self.fronts[p]
            while front and len(out) < want:
                out.append(front.popleft())
            if len(out) < want:
                out.extend(self.lanes[p].pop_many(want - len(out)))
            if len(out) >= want:
                break
        return out

    def __len__(self) -> int:
        return sum(len(x) for x in self.lanes) + sum(len(f) for f in self.fronts)


class _Q:
    """The structures of one queue name."""

    __slots__ = (
        "ready",
        "jobs",
        "processing",
        "delayed",
        "expiry",
        "waiters",
        "subscribers",
        "workers",
        "paused",
        "schedules",
        "index",
        "flow",
    )

    def __init__(self) -> None:
        self.ready = _Lanes()
        self.jobs: dict[str, _Rec] = {}
        self.processing: dict[str, dict[str, _Rec]] = {}
        self.delayed: list[tuple[float, int, _Rec]] = []  # (run_at, seq, rec)
        # (expires_at, seq, rec or [recs]): a list for the jobs of one settle call that
        # expire at once (one entry, not one per job); an entry counts for a record while
        # the record's own expires_at is still the entry's.
        self.expiry: list[tuple[float, int, _Rec | list[_Rec]]] = []
        self.waiters: set[_Waiter] = set()
        self.subscribers: list[_Subscriber] = []
        self.workers: dict[str, float] = {}
        self.paused = False
        self.schedules: dict[str, tuple[bytes, float | None]] = {}
        self.index = StateIndex()
        self.flow = FlowState()  # rate limit log, RateLimited hold, slot waiters


def _due_ms(at: float) -> bytes:
    """A ``due`` event's time (its ``result``): milliseconds since the epoch, as text."""
    return b"%d" % math.ceil(at * 1000)


def _stalled_error(job_id: str, worker_id: str, attempts: int) -> JobError:
    return JobError(
        "StalledJobError",
        f"job {job_id!r} stalled on worker {worker_id!r} (lease expired or worker died) "
        f"and has used all {attempts} attempts",
    )


class _MemoryPart:
    """What every part (mixin) of :class:`~trioqueue.storage.MemoryStorage` may use of
    it: the lock, the queues, and the helpers it defines (called with the lock held).
    Declared once here; the storage class overrides each."""

    _lock: threading.Lock
    _queues: dict[str, _Q]
    _seq: count[int]

    def _q(self, name: str) -> _Q:
        raise NotImplementedError

    def _expire(self, q: _Q, now: float) -> None:
        raise NotImplementedError

    def _publish(self, q: _Q, events: list[StorageEvent]) -> None:
        raise NotImplementedError

    def _wake(self, q: _Q) -> None:
        raise NotImplementedError

    def _delay(self, q: _Q, rec: _Rec, run_at: float, events: list[StorageEvent]) -> None:
        raise NotImplementedError

    def _promote(self, q: _Q, now: float, events: list[StorageEvent]) -> None:
        raise NotImplementedError

    def _set_terminal(self, q: _Q, rec: _Rec, kind: str, now: float, ttl: float) -> None:
        raise NotImplementedError

    def _cancel_claimed(self, q: _Q, rec: _Rec, now: float, worker_id: str, events: list[StorageEvent]) -> None:
        raise NotImplementedError

    def _enqueue_locked(self, q: _Q, jobs: Sequence[NewJob], now: float) -> list[EnqueueOutcome]:
        raise NotImplementedError
