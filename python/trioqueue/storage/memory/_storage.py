"""MemoryStorage: the in-process backend, on the Rust lock-free queue.

Every mutating operation is one step under a single ``threading.Lock`` (the in-process
equivalent of a Lua script), so one instance may be shared by producers and consumers of
one Trio run *and* by several Trio runs in different OS threads. Wake-ups and events cross
threads through each waiter's own ``TrioToken``.

Nothing survives the process: use :class:`~trioqueue.FileStorage` or
:class:`~trioqueue.RedisStorage` for durability.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from itertools import count

import trio

from ..._model._types import CancelStatus, EnqueueStatus, UpdateTTLStatus
from .._rules import claim, complete
from .._base import (
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    JobRecord,
    NewJob,
    Settlement,
    SettleKind,
    StorageEvent,
    ttl_update_status,
    wanted_kinds,
)

from .. import _rules as R
from .._base import job_record
from .._capabilities import Administration, Debounce, Groups, NonBlockingStart, Schedules, Steps, Trees
from .._steps import decode_steps, encode_step
from .._rules import COMPLETED as _COMPLETED
from .._rules import DELAYED as _DELAYED
from .._rules import PROCESSING as _PROCESSING
from .._rules import QUEUED as _QUEUED
from .._rules import TERMINAL_KINDS as _TERMINAL
from .._rules import WAITING_CHILDREN as _WAITING
from ._admin import MemoryAdmin
from ._control import MemoryControl
from ._debounce import MemoryDebounce
from ._flows import MemoryFlows
from ._recovery import MemoryRecovery
from ._parts import _Q, _QUEUED_OUTCOME, _Blocked, _Rec, _Subscriber, _Waiter, _due_ms

__all__ = ["MemoryStorage"]

_COMPLETE = SettleKind.COMPLETE
_KEPT = R.KEPT  # the settlements Settlement.keep applies to: the kind they enter
# Claims and events by the thousand: built as the tuples they are, without the keyword
# handling of a NamedTuple's constructor.
_new = tuple.__new__

class MemoryStorage(
    MemoryRecovery,
    MemoryFlows,
    MemoryDebounce,
    MemoryAdmin,
    MemoryControl,
    Trees,
    Schedules,
    Groups,
    Debounce,
    Administration,
    NonBlockingStart,
    Steps,
):
    """In-process storage. Fast, thread-safe, and gone when the process exits."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._queues: dict[str, _Q] = {}
        self._locks: dict[str, tuple[str, float]] = {}
        self._seq = count()

    # -- helpers (called with the lock held) -------------------------------------------

    def _q(self, name: str) -> _Q:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Q()
        return q

    def _expire(self, q: _Q, now: float) -> None:
        heap = q.expiry
        while heap and heap[0][0] <= now:
            expires_at, _, item = heapq.heappop(heap)
            for rec in item if isinstance(item, list) else (item,):
                if rec.exp == expires_at and q.jobs.get(rec.id) is rec:
                    del q.jobs[rec.id]
                    q.index.drop(rec)

    def _ended(self, q: _Q, rec: _Rec, old: str, now: float) -> None:
        """A rule just ended ``rec`` (it left kind ``old``): filed under its terminal kind,
        its expiry indexed, and its tree told."""
        q.index.enter(rec, old, rec.kind)
        assert rec.exp is not None
        heapq.heappush(q.expiry, (rec.exp, next(self._seq), rec))
        if rec.parent is not None or rec.flow is not None:
            self._tree_ended(rec, now)

    def _front(self, q: _Q, recs: list[_Rec], worker_id: str, events: list[StorageEvent]) -> None:
        """Claimed jobs a rule queued again (out of their processing lists) go before
        everything else of their lanes, in order."""
        for rec in recs:
            q.index.enter(rec, _PROCESSING, _QUEUED)
            events.append(StorageEvent("requeued", rec.id, worker_id, token=rec.token))
        q.ready.push_front(recs)

    def _delay(self, q: _Q, rec: _Rec, run_at: float, events: list[StorageEvent]) -> None:
        """Put ``rec`` in the delayed set, due at ``run_at``; publish ``due`` (see
        :data:`~trioqueue.storage.NOTICE_KINDS`) when nothing pending was due earlier."""
        if not q.delayed or run_at < q.delayed[0][0]:
            events.append(StorageEvent("due", "", result=_due_ms(run_at)))
        rec.run_at = run_at
        heapq.heappush(q.delayed, (run_at, next(self._seq), rec))

    def _promote(self, q: _Q, now: float, events: list[StorageEvent]) -> None:
        heap = q.delayed
        due: list[_Rec] = []
        while heap and heap[0][0] <= now:
            run_at, _, rec = heapq.heappop(heap)
            if rec.kind in (R.FAILING, _DELAYED) and rec.run_at == run_at and q.jobs.get(rec.id) is rec:
                old = rec.kind
                kind = R.promote(rec, int(now * 1000))
                q.refile(rec, old)
                rec.run_at = math.inf
                due.append(rec)
                events.append(StorageEvent(kind, rec.id, token=rec.token))
        q.ready.push(due)

    def _publish(self, q: _Q, events: list[StorageEvent]) -> None:
        if events:
            for sub in q.subscribers:
                sub.deliver(events)

    def _wake(self, q: _Q) -> None:
        for w in q.waiters:
            w.wake()

    # -- producers ---------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            outcomes = self._enqueue_locked(self._q(queue), jobs, time.time())
        await trio.lowlevel.cancel_shielded_checkpoint()
        return outcomes

    def _enqueue_locked(self, q: _Q, jobs: Sequence[NewJob], now: float) -> list[EnqueueOutcome]:
        """The step of :meth:`enqueue` (lock held); :meth:`tick_schedule` runs it too."""
        now_ms = int(now * 1000)
        outcomes: list[EnqueueOutcome] = []
        events: list[StorageEvent] = []
        envelopes: list[_Rec] = []
        delayed = False
        self._expire(q, now)
        table = q.jobs
        for job in jobs:
            rec = table.get(job.id)
            if rec is None or R.replaceable(rec):
                if rec is not None:
                    q.index.drop(rec)
                kind = R.enqueue_kind(job.run_at, now)
                rec = table[job.id] = _Rec(job, now_ms, q.index, kind)
                events.append(_new(StorageEvent, ("enqueued", job.id, None, None, None, job.token)))
                if kind == _DELAYED:
                    assert job.run_at is not None
                    self._delay(q, rec, job.run_at, events)
                    delayed = True
                else:
                    envelopes.append(rec)
                outcomes.append(_QUEUED_OUTCOME)
            elif (result := R.existing_outcome(rec)) is not None:
                outcomes.append(EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state(), result, rec.token))
            else:
                outcomes.append(EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state(), token=rec.token))
        q.ready.push(envelopes)
        if envelopes or delayed:
            self._publish(q, events)
            self._wake(q)  # claimers take the new jobs, or recompute their wake-up
        return outcomes

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)
            rec = q.jobs.get(job_id)
            old = None if rec is None else rec.kind
            status, event = R.cancel(rec, now)
            if rec is not None and old is not None and event == "cancelled":
                # The envelope may still sit in the ready list or the delayed heap: it is
                # skipped there because the record is no longer queued/failing.
                self._ended(q, rec, old, now)
                self._publish(q, [StorageEvent("cancelled", job_id, token=rec.token)])
            elif rec is not None and rec.kind == _PROCESSING:
                if event is not None:
                    self._publish(q, [StorageEvent(event, job_id, rec.worker, token=rec.token)])
                if rec.flow is not None:
                    self._cancel_children(rec, now)  # its children (dynamic) go with it
        await trio.lowlevel.cancel_shielded_checkpoint()
        return status

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            rec = q.jobs.get(job_id)
            if rec is None:
                return None
            return job_record(rec)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)
            rec = q.jobs.get(job_id)
            refused = ttl_update_status(*((rec.kind, rec.result, rec.error) if rec else (None, None, None)))
            if refused is not None:
                status = refused
            else:
                assert rec is not None
                rec.exp = now + ttl
                heapq.heappush(q.expiry, (rec.exp, next(self._seq), rec))
                status = UpdateTTLStatus.UPDATED
        await trio.lowlevel.cancel_shielded_checkpoint()
        return status

    # -- consumers ---------------------------------------------------------------------

    def _claim(
        self, q: _Q, worker_id: str, max_jobs: int, lease: float, now: float, start: int, limits: ClaimLimits | None
    ) -> list[Claim]:
        events: list[StorageEvent] = []
        self._promote(q, now, events)
        now_ms = int(now * 1000)
        deadline = now + lease
        claims: list[Claim] = []
        held = sum(map(len, q.processing.values())) if limits is not None and limits.concurrency else 0
        max_jobs = q.flow.allowance(limits, now, max_jobs, held)
        if q.paused or not max_jobs:
            self._publish(q, events)
            return claims
        proc = q.processing.get(worker_id)
        if proc is None:
            proc = q.processing[worker_id] = {}
        taken: list[_Rec] = []  # their index entries move in one batch
        append = claims.append
        if limits is None:
            blocked = _Blocked(q.paused_groups, 0, q.running)
        else:
            q.wake_groups(now)
            blocked = _Blocked(
                q.paused_groups, limits.group_concurrency, q.running, limits.group_rate, limits.group_per, now, q.glogs
            )
        while len(claims) < max_jobs:
            entries = q.ready.pop(max_jobs - len(claims), blocked)
            if not entries:
                break
            for rec in entries:
                if rec.kind != _QUEUED or not rec.iseq:
                    continue  # a stale entry: the job was cancelled, or forgotten
                started = len(claims) < start
                attempt = claim(rec, worker_id, now_ms, deadline, started)  # (the index: below, for the batch)
                proc[rec.id] = rec
                taken.append(rec)
                append(_new(Claim, (rec.id, rec.envelope, attempt, rec.claim, started)))
        q.index.move(taken, _QUEUED, _PROCESSING)
        if blocked.hit:
            q.gblocked |= blocked.hit  # back in the rings when a slot of theirs is freed
            q.flow.slot_wait = True
        for entry in blocked.sleeping:
            heapq.heappush(q.gsleep, entry)  # back in the rings when their next token is due
        q.flow.claimed(limits, now, len(claims))
        self._publish(q, events)
        return claims

    async def dequeue(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        timeout: float,
        lease: float,
        start: int | None = None,
        limits: ClaimLimits | None = None,
    ) -> list[Claim]:
        await trio.lowlevel.checkpoint_if_cancelled()
        start = max_jobs if start is None else start
        give_up = trio.current_time() + timeout
        while True:
            waiter = None
            with self._lock:
                q = self._q(queue)
                now = time.time()
                claims = self._claim(q, worker_id, max_jobs, lease, now, start, limits)
                if not claims:
                    waiter = _Waiter()
                    q.waiters.add(waiter)
                    next_due = min(q.delayed[0][0] if q.delayed else math.inf, q.flow.wake, q.group_wake()) - now
            if waiter is None:
                # Claimed: return without a cancellable checkpoint, so the claims are
                # never dropped by a cancellation after the fact.
                await trio.lowlevel.cancel_shielded_checkpoint()
                return claims
            try:
                with trio.move_on_at(min(give_up, trio.current_time() + max(next_due, 0.0))):
                    await waiter.event.wait()
            finally:
                with self._lock:
                    q.waiters.discard(waiter)
            if trio.current_time() >= give_up:
                with self._lock:
                    claims = self._claim(q, worker_id, max_jobs, lease, time.time(), start, limits)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return claims

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        out: list[bool] = []
        events: list[StorageEvent] = []
        retried = False
        now_ms = int(now * 1000)
        completed: list[_Rec] = []  # their index entries move in one batch
        keeps: dict[str, int] = {}  # state kind -> Settlement.keep (the least asked for)
        group_at, group = math.nan, completed  # (no group yet: NaN equals nothing)
        with self._lock:
            q = self._q(queue)
            proc = q.processing.get(worker_id, {})
            for s in settlements:
                skind, sid, data, ttl, delay, token, keep = s
                if keep is not None and skind in _KEPT:
                    keeps[_KEPT[skind]] = min(keep, keeps.get(_KEPT[skind], keep))
                rec = proc.get(sid)
                if rec is not None and rec.claim == token and skind is _COMPLETE and rec.flow is None:
                    # The common case: the rule, and its filing batched (the index below).
                    del proc[sid]
                    out.append(True)
                    if rec.group is not None:
                        q.group_left(rec)
                    complete(rec, data, now, now_ms, ttl)
                    expires_at = now + ttl
                    if expires_at != group_at:  # one expiry entry per run of equal TTLs
                        group_at, group = expires_at, []
                        heapq.heappush(q.expiry, (expires_at, next(self._seq), group))
                    group.append(rec)
                    completed.append(rec)
                    events.append(_new(StorageEvent, ("completed", sid, worker_id, data, None, rec.token)))
                    if rec.parent is not None:
                        self._tree_ended(rec, now)
                    continue
                if rec is None or rec.claim != token:
                    known = q.jobs.get(sid)
                    if R.settled_before(known, token):
                        out.append(True)  # settled by this very claim already: a retried call
                        continue
                    out.append(False)
                    events.append(StorageEvent("fenced", sid, worker_id, token=known.token if known else None))
                    continue
                del proc[sid]
                out.append(True)
                q.group_left(rec)
                flow = rec.flow
                by_children = flow is not None and R.failed_by_children(rec.policy, bool(flow.failures))
                event = R.settle(rec, skind, data, now, ttl, by_children)
                if rec.kind in _TERMINAL:
                    self._ended(q, rec, _PROCESSING, now)
                    result = data if rec.kind == _COMPLETED else None
                    error = rec.error if rec.kind == R.FAILED else None
                    events.append(StorageEvent(rec.kind, sid, worker_id, result, error, rec.token))
                elif rec.kind == _WAITING:
                    q.refile(rec, _PROCESSING)
                    self._parent_check(q, rec, now)
                else:  # failing (a retry) or delayed (rate limited): due after the delay
                    q.refile(rec, _PROCESSING)
                    if rec.kind == _DELAYED:
                        q.flow.hold_until(now + delay)
                    assert event is not None
                    events.append(StorageEvent(event, sid, worker_id, error=rec.error if event == "failing" else None, token=rec.token))
                    self._delay(q, rec, now + delay, events)
                    retried = True
            q.index.move(completed, _PROCESSING, _COMPLETED)
            for kind, keep in keeps.items():  # count-based retention, in the same step
                self._keep_newest(q, kind, keep)
            self._publish(q, events)
            if retried or (any(out) and q.flow.freed()):
                self._wake(q)  # waiters recompute when the next retry is due
        await trio.lowlevel.cancel_shielded_checkpoint()
        return out

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        events: list[StorageEvent] = []
        with self._lock:
            q = self._q(queue)
            proc = q.processing.get(worker_id, {})
            released: list[_Rec] = []
            now = time.time()
            for job_id in job_ids:
                rec = proc.pop(job_id, None)
                if rec is None:
                    continue
                q.group_left(rec)
                if not R.release(rec, now, refund):  # a cancel request: it ends cancelled
                    self._ended(q, rec, _PROCESSING, now)
                    events.append(StorageEvent("cancelled", rec.id, worker_id, token=rec.token))
                    continue
                released.append(rec)
            self._front(q, released, worker_id, events)
            self._publish(q, events)
            if released or (events and q.flow.freed()):
                self._wake(q)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return len(released)

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return list(self._q(queue).processing.get(worker_id, {}))

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        events: list[StorageEvent] = []
        with self._lock:
            q = self._q(queue)
            out = [self._start(q, worker_id, job_id, token, events) for job_id, token in claims]
            self._publish(q, events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return out

    def start_nowait(self, queue: str, worker_id: str, job_id: str, token: str) -> bool:
        with self._lock:
            q = self._queues.get(queue) or self._q(queue)
            proc = q.processing.get(worker_id)
            rec = None if proc is None else proc.get(job_id)
            if rec is not None and rec.claim == token and not rec.cancel_requested and (rec.started or not q.paused):
                return R.start(rec, False, 0.0) == "run"  # the common case: it runs (no clock needed)
            events: list[StorageEvent] = []
            ok = self._start(q, worker_id, job_id, token, events)
            self._publish(q, events)
            return ok

    def _start(self, q: _Q, worker_id: str, job_id: str, token: str, events: list[StorageEvent]) -> bool:
        proc = q.processing.get(worker_id, {})
        rec = proc.get(job_id)
        if rec is None or rec.claim != token:
            return False
        now = time.time()
        verdict = R.start(rec, q.paused, now)
        if verdict == "run":
            return True
        del proc[job_id]
        q.group_left(rec)
        if verdict == R.CANCELLED:  # a reserved claim of a job with a cancel request
            self._ended(q, rec, _PROCESSING, now)
            events.append(StorageEvent("cancelled", rec.id, worker_id, token=rec.token))
        else:  # paused: a prefetched job goes back, its attempt never counted
            self._front(q, [rec], worker_id, events)
        return False

    # -- events ------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        sub = _Subscriber(send, wanted_kinds(kinds))
        with self._lock:
            q = self._q(queue)
            q.subscribers = [*q.subscribers, sub]
        await trio.lowlevel.checkpoint()
        try:
            yield receive
        finally:
            with self._lock:
                q.subscribers = [s for s in q.subscribers if s is not sub]
            send.close()
            receive.close()

    # -- steps (each one step under the lock) ------------------------------------------

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        entry = encode_step(name, value)
        with self._lock:
            ok = R.save_step(self._q(queue).processing.get(worker_id, {}).get(job_id), worker_id, token, entry)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            rec = q.jobs.get(job_id)
            data = None if rec is None else rec.steps
        return decode_steps(data)

    def __repr__(self) -> str:
        return f"MemoryStorage(queues={sorted(self._queues)!r})"

