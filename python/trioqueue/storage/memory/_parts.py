"""MemoryStorage's structures: job records, queues (with the steps on one queue that its
operations share), and the waiters and subscribers that cross threads through each Trio
run's token (all used with the storage's lock held)."""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from collections.abc import Callable
from itertools import count

import trio

from ..._core import ObjectQueue
from ..._model._types import MAX_PRIORITY, EnqueueStatus
from .._base import Claim, ClaimLimits, EnqueueOutcome, NewJob, StorageEvent, select_events
from .. import _rules as R
from .._rules import Rec
from ._index import StateIndex
from .._flowstate import FlowState

from .._rules import DELAYED as _DELAYED
from .._rules import PROCESSING as _PROCESSING
from .._rules import QUEUED as _QUEUED

QUEUED_OUTCOME = EnqueueOutcome(EnqueueStatus.QUEUED)
_PROMOTED = (R.FAILING, _DELAYED, R.WAITING_SIGNAL)  # the kinds the delayed heap promotes


class MemRec(Rec):
    """The lifecycle's record (:class:`~.._rules.Rec`), and where MemoryStorage files it:
    ``iseq``, its entry in the queue's per-state index (0: forgotten); ``run_at``, its
    due time in the delayed heap; ``up``, a child's parent record; ``flow``, a parent's
    (or a dependent's) children and dependencies records and counts; ``waiters``, the
    records of the jobs that depend on it (``depends_on``). Whoever changes ``kind`` (a rule of ``_rules``) tells
    the index (:meth:`QueueState.refile`)."""

    __slots__ = ("iseq", "run_at", "up", "flow", "waiters")

    def __init__(self, job: NewJob, now_ms: int, index: StateIndex | None, kind: str = _QUEUED) -> None:
        Rec.__init__(
            self, job.id, kind, now_ms, 0, job.max_attempts, job.result_ttl, now_ms, job.envelope, job.token,
            job.priority, job.group,
        )  # fmt: skip
        self.iseq = 0
        self.run_at = math.inf
        self.up: MemRec | None = None  # a child of a tree: its parent's record
        self.flow: Flow | None = None  # a parent: its children
        self.waiters: list[tuple[str, MemRec]] | None = None  # a dependency: its dependents
        if index is not None:  # (None: the caller files a batch of new records at once, StateIndex.add)
            index.enter(self, None, kind)

    def state(self, due_ms: int | None = None) -> str:
        if due_ms is None and self.kind == _DELAYED:
            due_ms = int(self.run_at * 1000)
        return Rec.state(self, due_ms)


class Flow:
    """A parent's side of a tree: its children ``(queue, record)``, its dependencies
    ``(queue, record)``, how many of both have not ended, and the failed ones ``(id,
    error)``."""

    __slots__ = ("children", "deps", "pending", "failures")

    def __init__(self) -> None:
        self.children: list[tuple[str, MemRec]] = []
        self.deps: list[tuple[str, MemRec]] = []
        self.pending = 0
        self.failures: list[tuple[str, bytes]] = []


class Hand:
    """What a claim parked by :meth:`~trioqueue.storage.MemoryStorage.dequeue_into`
    needs so that an enqueue in its Trio run can claim for it and hand the claims over."""

    __slots__ = ("worker_id", "lease", "limits", "wanted", "take")

    def __init__(
        self,
        worker_id: str,
        lease: float,
        limits: ClaimLimits | None,
        wanted: Callable[[], tuple[int, int] | None],
        take: Callable[[list[Claim]], None],
    ) -> None:
        self.worker_id = worker_id
        self.lease = lease
        self.limits = limits
        self.wanted = wanted
        self.take = take


class Waiter:
    """A Trio task parked in one thread, woken from any thread (a parked
    ``dequeue_into`` also has its :class:`Hand`)."""

    __slots__ = ("thread", "token", "event", "hand")

    def __init__(self, hand: Hand | None = None) -> None:
        self.thread = threading.get_ident()
        self.token = trio.lowlevel.current_trio_token()
        self.event = trio.Event()
        self.hand = hand

    def wake(self) -> None:
        if self.thread == threading.get_ident():
            self.event.set()
        else:
            try:
                self.token.run_sync_soon(self.event.set)
            except trio.RunFinishedError:
                pass


class Subscriber:
    """A subscription: its events go to the channel ``send`` or, for
    :meth:`~trioqueue.storage.MemoryStorage.subscribe_nowait`, to the plain call ``call``
    (in the publishing step when the subscriber's Trio run made it, else soon after in
    that run)."""

    __slots__ = ("thread", "token", "send", "kinds", "call")

    def __init__(
        self,
        send: trio.MemorySendChannel[list[StorageEvent]] | None,
        kinds: frozenset[str] | None = None,
        call: Callable[[list[StorageEvent]], None] | None = None,
    ) -> None:
        self.thread = threading.get_ident()
        self.token = trio.lowlevel.current_trio_token()
        self.send = send
        self.kinds = kinds  # the kinds it asked for (None: all); see Storage.subscribe
        self.call = call

    def deliver(self, events: list[StorageEvent]) -> None:
        if self.kinds is not None:
            events = select_events(events, self.kinds)
            if not events:
                return
        if self.call is not None:
            if self.thread == threading.get_ident():
                self.call(events)
            else:
                try:
                    self.token.run_sync_soon(self.call, events)
                except trio.RunFinishedError:
                    pass
            return
        assert self.send is not None
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


class Lanes:
    """The ready list: per priority (0 first), the lane of the jobs without a group (a
    lock-free FIFO with a front deque of released jobs claimed before it) and one deque
    per group with ready jobs; and per priority the *ring* of the groups with ready jobs
    (``None``: the ungrouped lane), served round-robin: a claim takes one job of the
    ring's first group and moves the group to the end. A priority whose ring is empty has
    only ungrouped jobs: claims take them in batches as before groups existed. A claim
    costs O(1) in the number of queued jobs and of groups. Entries are the job records
    themselves; a stale one (its job cancelled, or forgotten: ``iseq`` 0) is skipped at
    claim time."""

    __slots__ = ("lanes", "sizes", "fronts", "glanes", "rings", "ringed")

    def __init__(self) -> None:
        self.lanes: list[ObjectQueue[MemRec]] = [ObjectQueue() for _ in range(MAX_PRIORITY + 1)]
        # the entries in each FIFO (kept here: a claim skips the empty priorities without
        # a call into the Rust queue per priority)
        self.sizes: list[int] = [0] * (MAX_PRIORITY + 1)
        self.fronts: list[deque[MemRec]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        self.glanes: dict[tuple[int, str], deque[MemRec]] = {}  # (priority, group) -> its ready jobs
        self.rings: list[deque[str | None]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        self.ringed: list[set[str | None]] = [set() for _ in range(MAX_PRIORITY + 1)]  # the rings' members

    def _ring(self, p: int, group: str | None) -> None:
        if group not in self.ringed[p]:
            self.ringed[p].add(group)
            self.rings[p].append(group)

    def push(self, recs: list[MemRec]) -> None:
        """Append the jobs to their lanes, in order (batch calls: where the Rust queue
        beats a deque)."""
        if not recs:
            return
        first = recs[0].priority
        for r in recs:  # (a loop, not all() of a generator: no frame per job)
            if r.priority != first or r.group is not None:
                break
        else:
            self.lanes[first].push_many(recs)
            self.sizes[first] += len(recs)
            return
        by: dict[int, list[MemRec]] = {}
        for r in recs:
            if r.group is None:
                by.setdefault(r.priority, []).append(r)
            else:
                self._gpush(r, False)
        for p, part in by.items():
            self.lanes[p].push_many(part)
            self.sizes[p] += len(part)

    def _gpush(self, r: MemRec, front: bool) -> None:
        key = (r.priority, r.group)
        lane = self.glanes.get(key)  # type: ignore[arg-type]
        if lane is None:
            lane = self.glanes[key] = deque()  # type: ignore[index]
        if front:
            lane.appendleft(r)
        else:
            lane.append(r)
        self._ring(r.priority, r.group)

    def push_front(self, recs: list[MemRec]) -> None:
        """Put the jobs before everything else of their lanes, in the order given."""
        for r in reversed(recs):
            if r.group is None:
                self.fronts[r.priority].appendleft(r)
            else:
                self._gpush(r, True)

    def requeue_group(self, group: str) -> None:
        """Put ``group`` back in the ring of each priority where it has ready jobs (it left
        them while paused or at its concurrency limit)."""
        for p in range(MAX_PRIORITY + 1):
            if self.glanes.get((p, group)):
                self._ring(p, group)

    def pop(self, want: int, blocked: Blocked | None = None) -> list[MemRec]:
        """Up to ``want`` entries: priority 0 first; within a priority, round-robin across
        its ring (see the class docstring), each lane's front before its FIFO. Entries of
        a group ``blocked`` refuses leave the ring (not taken)."""
        out: list[MemRec] = []
        rings, fronts, sizes = self.rings, self.fronts, self.sizes
        for p in range(MAX_PRIORITY + 1):
            if rings[p]:
                self._pop_ring(p, want, out, blocked)
            elif sizes[p] or fronts[p]:
                front = fronts[p]
                while front and len(out) < want:
                    out.append(front.popleft())
                if sizes[p] and len(out) < want:
                    got = self.lanes[p].pop_many(want - len(out))
                    sizes[p] -= len(got)
                    out.extend(got)
            else:
                continue
            if len(out) >= want:
                break
        return out

    def _pop_ring(self, p: int, want: int, out: list[MemRec], blocked: Blocked | None) -> None:
        ring, ringed, front, lane, sizes = self.rings[p], self.ringed[p], self.fronts[p], self.lanes[p], self.sizes
        if None not in ringed and (front or sizes[p]):
            ringed.add(None)  # ungrouped jobs arrived while groups were ready: their turn comes
            ring.append(None)
        while ring and len(out) < want:
            group = ring.popleft()
            if group is None:
                while True:
                    if front:
                        rec = front.popleft()
                    elif sizes[p]:
                        [rec] = lane.pop_many(1)
                        sizes[p] -= 1
                    else:
                        rec = None
                    if rec is None or (rec.kind == _QUEUED and rec.iseq):
                        break  # (stale entries are dropped without using the turn)
                if rec is not None:
                    out.append(rec)
                if rec is not None and (front or sizes[p]):
                    ring.append(None)
                else:
                    ringed.discard(None)
                continue
            if blocked is not None and not blocked.allows(group):
                ringed.discard(group)  # back when resumed, or when a slot of it is freed
                continue
            glane = self.glanes[(p, group)]
            while glane:
                rec = glane.popleft()
                if rec.kind == _QUEUED and rec.iseq:
                    out.append(rec)
                    if blocked is not None:
                        blocked.took(group)
                    break
            if glane:
                ring.append(group)
            else:
                ringed.discard(group)
                del self.glanes[(p, group)]

    def empty(self) -> bool:
        """Nothing ready, in any lane (cheaper than ``len``: no sum)."""
        return not (any(self.sizes) or any(self.fronts) or self.glanes)

    def __len__(self) -> int:
        return sum(self.sizes) + sum(len(f) for f in self.fronts) + sum(map(len, self.glanes.values()))


class Blocked:
    """What a claim may not take: the paused groups, the groups at their concurrency
    limit (``running``: the queue's claimed jobs per group, counted as the claim takes)
    and the groups over their rate (``logs``: each group's claim times within the last
    ``per`` seconds; ``sleeping``: ``(when its next token is due, group)`` of those)."""

    __slots__ = ("paused", "limit", "running", "hit", "rate", "per", "now", "logs", "sleeping")

    def __init__(
        self, paused: set[str], limit: int, running: dict[str, int], rate: int = 0, per: float = 1.0,
        now: float = 0.0, logs: dict[str, deque[float]] | None = None,
    ) -> None:  # fmt: skip
        self.paused = paused
        self.limit = limit
        self.running = running
        self.hit: set[str] = set()  # groups refused for their limit
        self.rate, self.per, self.now = rate, per, now
        self.logs: dict[str, deque[float]] = {} if logs is None else logs
        self.sleeping: list[tuple[float, str]] = []

    def allows(self, group: str) -> bool:
        if group in self.paused:
            return False
        if self.limit and self.running.get(group, 0) >= self.limit:
            self.hit.add(group)
            return False
        if self.rate:
            log = self.logs.get(group)
            while log and log[0] <= self.now - self.per:
                log.popleft()
            if log is not None and len(log) >= self.rate:
                self.sleeping.append((log[0] + self.per, group))
                return False
        return True

    def took(self, group: str) -> None:
        self.running[group] = self.running.get(group, 0) + 1
        if self.rate:
            log = self.logs.get(group)
            if log is None:
                log = self.logs[group] = deque()
            log.append(self.now)


class QueueState:
    """The structures of one queue name, and the steps on them that the storage's
    operations share (each called with the storage's lock held)."""

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
        "paused_groups",
        "running",
        "gblocked",
        "glogs",
        "gsleep",
        "seq",
    )

    def __init__(self) -> None:
        self.ready = Lanes()
        self.jobs: dict[str, MemRec] = {}
        self.processing: dict[str, dict[str, MemRec]] = {}
        self.delayed: list[tuple[float, int, MemRec]] = []  # (run_at, seq, rec)
        # (expires_at, seq, rec or [recs]): a list for the jobs of one settle call that
        # expire at once (one entry, not one per job); an entry counts for a record while
        # the record's own exp is still the entry's.
        self.expiry: list[tuple[float, int, MemRec | list[MemRec]]] = []
        self.waiters: set[Waiter] = set()
        self.subscribers: list[Subscriber] = []
        self.workers: dict[str, float] = {}
        self.paused = False
        self.schedules: dict[str, tuple[bytes, float | None]] = {}
        self.index = StateIndex()
        self.flow = FlowState()  # rate limit log, RateLimited hold, slot waiters
        self.paused_groups: set[str] = set()
        self.running: dict[str, int] = {}  # group -> its jobs claimed now (processing)
        self.gblocked: set[str] = set()  # groups out of the rings for their concurrency limit
        self.glogs: dict[str, deque[float]] = {}  # group -> its claim times (group_rate)
        self.gsleep: list[tuple[float, str]] = []  # heap (next token due, group) of groups over their rate
        self.seq = count()  # the tie-breaker of the heaps' entries

    def clear(self, schedules: bool) -> int:
        """Forget every job of the queue, whatever its state, at once (fresh structures: a
        worker's claim finds no processing entry, its settlement is fenced); how many."""
        n = len(self.jobs)
        self.ready, self.jobs, self.processing, self.delayed, self.expiry = Lanes(), {}, {}, [], []
        self.index = StateIndex()
        self.flow = FlowState()
        # ... and its groups' state: the cleared claims' slots, the groups out of the
        # rings for their limit, the claim logs of group_rate (paused groups are kept,
        # as the pause flag is)
        self.running, self.gblocked, self.glogs, self.gsleep = {}, set(), {}, []
        if schedules:
            self.schedules = {}
        return n

    def expire(self, now: float) -> None:
        """Forget the ended jobs whose time to be kept is over."""
        heap = self.expiry
        while heap and heap[0][0] <= now:
            expires_at, _, item = heapq.heappop(heap)
            for rec in item if isinstance(item, list) else (item,):
                if rec.exp == expires_at and self.jobs.get(rec.id) is rec:
                    del self.jobs[rec.id]
                    self.index.drop(rec)

    def file_end(self, rec: MemRec, old: str) -> None:
        """A rule just ended ``rec`` (it left kind ``old``): filed under its terminal kind,
        its expiry indexed."""
        self.index.enter(rec, old, rec.kind)
        assert rec.exp is not None
        heapq.heappush(self.expiry, (rec.exp, next(self.seq), rec))

    def keep_for(self, rec: MemRec, expires_at: float) -> None:
        """Keep the ended ``rec`` until ``expires_at``."""
        rec.exp = expires_at
        heapq.heappush(self.expiry, (expires_at, next(self.seq), rec))

    def keep_newest(self, kind: str, keep: int) -> int:
        """Count-based retention (:attr:`Settlement.keep`): forget the oldest jobs of
        terminal state ``kind`` beyond the newest ``keep`` (jobs of trees go by their TTL)."""
        return self.index.trim(kind, keep, self.forget, R.in_tree)

    def forget(self, rec: MemRec) -> None:
        """Forget the job ``rec`` (purged, trimmed)."""
        del self.jobs[rec.id]
        self.index.drop(rec)

    def front(self, recs: list[MemRec], worker_id: str, events: list[StorageEvent]) -> None:
        """Claimed jobs a rule queued again (out of their processing lists) go before
        everything else of their lanes, in order."""
        for rec in recs:
            self.index.enter(rec, _PROCESSING, _QUEUED)
            events.append(StorageEvent("requeued", rec.id, worker_id, token=rec.token))
        self.ready.push_front(recs)

    def delay(self, rec: MemRec, run_at: float, events: list[StorageEvent]) -> None:
        """Put ``rec`` in the delayed set, due at ``run_at``; publish ``due`` (see
        :data:`~trioqueue.storage.NOTICE_KINDS`) when nothing pending was due earlier."""
        if not self.delayed or run_at < self.delayed[0][0]:
            events.append(StorageEvent("due", "", result=due_ms(run_at)))
        rec.run_at = run_at
        heapq.heappush(self.delayed, (run_at, next(self.seq), rec))

    def promote(self, now: float, events: list[StorageEvent]) -> None:
        """Delayed and failing jobs due by ``now`` join their lanes."""
        heap = self.delayed
        due: list[MemRec] = []
        while heap and heap[0][0] <= now:
            run_at, _, rec = heapq.heappop(heap)
            if rec.kind in _PROMOTED and rec.run_at == run_at and self.jobs.get(rec.id) is rec:
                old = rec.kind
                kind = R.promote(rec, int(now * 1000))
                self.refile(rec, old)
                rec.run_at = math.inf
                due.append(rec)
                events.append(StorageEvent(kind, rec.id, token=rec.token))
        self.ready.push(due)

    def publish(self, events: list[StorageEvent]) -> None:
        if events:
            for sub in self.subscribers:
                sub.deliver(events)

    def wake(self) -> None:
        """Wake the claims waiting on the queue (they claim, or recompute their wake-up)."""
        for w in self.waiters:
            w.wake()

    def refile(self, rec: MemRec, old: str) -> None:
        """``rec`` moved from kind ``old`` to its kind now (a rule changed it): its index entry follows."""
        self.index.enter(rec, old, rec.kind)

    def wake_groups(self, now: float) -> None:
        """Groups over their rate whose next token is due go back in the rings."""
        while self.gsleep and self.gsleep[0][0] <= now:
            _, group = heapq.heappop(self.gsleep)
            self.ready.requeue_group(group)

    def group_wake(self) -> float:
        """When the first group over its rate may be claimed again (``inf``: none)."""
        return self.gsleep[0][0] if self.gsleep else math.inf

    def group_left(self, rec: MemRec) -> None:
        """A claimed job of a group left processing (settled, released, recovered): its
        slot is free, and a group that was out of the rings for its limit is back."""
        group = rec.group
        if group is None:
            return
        n = self.running.get(group, 0) - 1
        if n > 0:
            self.running[group] = n
        else:
            self.running.pop(group, None)
        if group in self.gblocked:
            self.gblocked.discard(group)
            self.ready.requeue_group(group)
            self.flow.slot_wait = True  # (the caller's freed() wakes the claimers)


def due_ms(at: float) -> bytes:
    """A ``due`` event's time (its ``result``): milliseconds since the epoch, as text."""
    return b"%d" % math.ceil(at * 1000)


class MemoryQueues:
    """What every part of :class:`~trioqueue.storage.MemoryStorage` shares: the lock that
    makes each operation one step, and the queues by name."""

    __slots__ = ("lock", "queues")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, QueueState] = {}

    def q(self, name: str) -> QueueState:
        """The structures of queue ``name`` (created empty on first use); lock held."""
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState()
        return q
