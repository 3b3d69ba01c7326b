"""MemoryStorage: the in-process backend, on the Rust lock-free queue.

Every mutating operation is one step under a single ``threading.Lock`` (the in-process
equivalent of a Lua script), so one instance may be shared by producers and consumers of
one Trio run *and* by several Trio runs in different OS threads. Wake-ups and events cross
threads through each waiter's own ``TrioToken``.

Nothing survives the process: use :class:`~trioqueue.FileStorage` or
:class:`~trioqueue.RedisStorage` for durability.

The class is the list of what the backend does. Its core (enqueue, claims, settlements,
leases, recovery), debounce, schedules, pause, groups and leader locks are written here;
trees and administration delegate to parts it builds in ``__init__``, each handed the
:class:`~._parts.MemoryQueues` it shares (the lock and the queues):
:class:`~._flows.MemoryTrees` (trees of jobs, and what a job's end does to its tree) and
:class:`~._admin.MemoryAdmin` (registry queries and administration). The structures of
one queue, and the steps on them its operations share, are :class:`~._parts.QueueState`.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from time import perf_counter

import trio

from ..._model._clock import now as _now
from ..._model._types import CancelStatus, EnqueueStatus, UpdateTTLStatus
from .. import _rules as R
from .._base import (
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    FlowJob,
    HeartbeatReply,
    JobRecord,
    LostClaim,
    NewJob,
    Settlement,
    SettleKind,
    StorageEvent,
    job_record,
    lost_why,
    ttl_update_status,
    wanted_kinds,
)
from .._capabilities import Administration, Debounce, Groups, NonBlockingStart, Schedules, Signals, Steps, Trees
from .._rules import COMPLETED as _COMPLETED
from .._rules import DELAYED as _DELAYED
from .._rules import PROCESSING as _PROCESSING
from .._rules import QUEUED as _QUEUED
from .._rules import TERMINAL_KINDS as _TERMINAL
from .._rules import WAITING_CHILDREN as _WAITING
from .._rules import claim, complete, recover
from .._steps import decode_signals, decode_steps, encode_step
from ._admin import MemoryAdmin
from ._flows import MemoryTrees
from ._parts import QUEUED_OUTCOME, Blocked, Hand, MemoryQueues, MemRec, QueueState, Subscriber, Waiter

__all__ = ["MemoryStorage"]

_COMPLETE = SettleKind.COMPLETE
_KEPT = R.KEPT  # the settlements Settlement.keep applies to: the kind they enter
# Claims and events by the thousand: built as the tuples they are, without the keyword
# handling of a NamedTuple's constructor.
_new = tuple.__new__
# An enqueue is a cancellation point every time, and a schedule point (it lets the other
# tasks of its Trio run go first) when the run's tasks have gone that long without one
# from this storage: a loop of awaited enqueues pays a scheduler trip a millisecond, not
# one a job (as a worker runs jobs whose handlers never block back to back).
ENQUEUE_SLICE = 0.001

class MemoryStorage(Trees, Schedules, Groups, Debounce, Administration, NonBlockingStart, Signals):
    """In-process storage. Fast, thread-safe, and gone when the process exits."""

    def __init__(self) -> None:
        super().__init__()
        # The parts, each handed what it shares: the lock and the queues.
        self._queues = MemoryQueues()
        self._lock = self._queues.lock
        self._q = self._queues.q
        self._trees = MemoryTrees(self._queues)
        self._admin = MemoryAdmin(self._queues, self._trees)
        self._locks: dict[str, tuple[str, float]] = {}  # leader locks: name -> (owner, expiry)
        self._slice = threading.local()  # per thread (one Trio run): when an enqueue next yields

    # -- producers ---------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        """:meth:`Storage.enqueue`: a cancellation point every call, a schedule point at
        least every :data:`ENQUEUE_SLICE` seconds of a run's enqueues (not every call)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            served: list[Waiter] = []
            outcomes = self._enqueue_locked(q, jobs, _now(), served)
        if served:
            self._hand_off(q, served)
        local = self._slice
        if perf_counter() >= getattr(local, "at", 0.0):  # (shielded: the change is made)
            await trio.lowlevel.cancel_shielded_checkpoint()
            local.at = perf_counter() + ENQUEUE_SLICE
        return outcomes

    def _enqueue_locked(
        self, q: QueueState, jobs: Sequence[NewJob], now: float, served: list[Waiter] | None = None
    ) -> list[EnqueueOutcome]:
        """The step of :meth:`enqueue` (lock held); :meth:`tick_schedule` runs it too.
        With ``served``, the ``dequeue_into`` calls of this thread parked without flow
        limits are not woken when only ready jobs came: they go to ``served``, for
        :meth:`_hand_off` once the lock is released."""
        now_ms = int(now * 1000)
        outcomes: list[EnqueueOutcome] = []
        events: list[StorageEvent] = []
        envelopes: list[MemRec] = []
        delayed: list[MemRec] = []
        q.expire(now)
        table = q.jobs
        replaceable, enqueue_kind = R.replaceable, R.enqueue_kind
        for job in jobs:
            rec = table.get(job.id)
            if rec is None or replaceable(rec):
                if rec is not None:
                    q.index.drop(rec)
                kind = enqueue_kind(job.run_at, now)
                rec = table[job.id] = MemRec(job, now_ms, None, kind)  # (indexed below, in batches)
                events.append(_new(StorageEvent, ("enqueued", job.id, None, None, None, job.token)))
                if kind == _DELAYED:
                    assert job.run_at is not None
                    q.delay(rec, job.run_at, events)
                    delayed.append(rec)
                else:
                    envelopes.append(rec)
                outcomes.append(QUEUED_OUTCOME)
            elif (result := R.existing_outcome(rec)) is not None:
                outcomes.append(EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state(), result, rec.token))
            else:
                outcomes.append(EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state(), token=rec.token))
        q.index.add(envelopes, _QUEUED)
        if delayed:
            q.index.add(delayed, _DELAYED)
        q.ready.push(envelopes)
        if envelopes or delayed:
            q.publish(events)
            if served is None or delayed or not q.waiters:
                q.wake()  # claimers take the new jobs, or recompute their wake-up
            else:
                me = threading.get_ident()
                for w in q.waiters:
                    if w.hand is not None and w.hand.limits is None and w.thread == me:
                        served.append(w)
                    else:
                        w.wake()
        return outcomes

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            rec = q.jobs.get(job_id)
            old = None if rec is None else rec.kind
            status, event = R.cancel(rec, now)
            if rec is not None and old is not None and event == "cancelled":
                # The envelope may still sit in the ready list or the delayed heap: it is
                # skipped there because the record is no longer queued/failing.
                self._trees.ended(q, rec, old, now)
                q.publish([StorageEvent("cancelled", job_id, token=rec.token)])
            elif rec is not None and rec.kind == _PROCESSING:
                if event is not None:
                    q.publish([StorageEvent(event, job_id, rec.worker, token=rec.token)])
                if rec.flow is not None:
                    self._trees.cancel_children(rec, now)  # its children (dynamic) go with it
        await trio.lowlevel.cancel_shielded_checkpoint()
        return status

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
            rec = q.jobs.get(job_id)
            if rec is None:
                return None
            return job_record(rec)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            rec = q.jobs.get(job_id)
            refused = ttl_update_status(*((rec.kind, rec.result, rec.error) if rec else (None, None, None)))
            if refused is not None:
                status = refused
            else:
                assert rec is not None
                rec.exp = now + ttl
                heapq.heappush(q.expiry, (rec.exp, next(q.seq), rec))
                status = UpdateTTLStatus.UPDATED
        await trio.lowlevel.cancel_shielded_checkpoint()
        return status

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        outcomes: list[EnqueueOutcome] = []
        with self._lock:
            q = self._q(queue)
            now = _now()
            q.expire(now)
            events: list[StorageEvent] = []
            for job in jobs:
                rec = q.jobs.get(job.id)
                if rec is None or not R.debounces(rec):
                    [outcome] = self._enqueue_locked(q, [job._replace(run_at=now + R.debounce_delay(delay, max_wait))], now)
                    outcomes.append(outcome)
                    continue
                run_at = R.debounce(rec, job.envelope, job.max_attempts, job.result_ttl, now, delay, max_wait)
                if run_at is not None and run_at != rec.run_at:
                    earlier = run_at < rec.run_at
                    q.delay(rec, run_at, events)  # (its old entry in the heap is stale now)
                    if earlier:
                        q.wake()
                outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, rec.state(), token=rec.token))
            q.publish(events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return outcomes

    # -- consumers ---------------------------------------------------------------------

    def _claim(
        self, q: QueueState, worker_id: str, max_jobs: int, lease: float, now: float, start: int, limits: ClaimLimits | None
    ) -> list[Claim]:
        events: list[StorageEvent] = []
        q.promote(now, events)
        now_ms = int(now * 1000)
        deadline = now + lease
        claims: list[Claim] = []
        held = sum(map(len, q.processing.values())) if limits is not None and limits.concurrency else 0
        max_jobs = q.flow.allowance(limits, now, max_jobs, held)
        if q.paused or not max_jobs or (limits is None and q.ready.empty()):
            q.publish(events)  # (nothing ready: an idle worker's claim takes and counts nothing)
            return claims
        proc = q.processing.get(worker_id)
        if proc is None:
            proc = q.processing[worker_id] = {}
        taken: list[MemRec] = []  # their index entries move in one batch
        append = claims.append
        if limits is None:
            blocked = Blocked(q.paused_groups, 0, q.running)
        else:
            q.wake_groups(now)
            blocked = Blocked(
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
        q.publish(events)
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
        waited = False
        while True:
            waiter = None
            with self._lock:
                q = self._q(queue)
                now = _now()
                claims = self._claim(q, worker_id, max_jobs, lease, now, start, limits)
                if not claims:
                    waiter, next_due = self._parked(q, now)
            if waiter is None:
                # Claimed: return without a cancellable checkpoint, so the claims are
                # never dropped by a cancellation after the fact; a call that waited
                # has had its schedule point (the wait), and returns at once: the
                # claimer hands the jobs to its workers in the same turn.
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return claims
            waited = True
            await self._wait(q, waiter, give_up, next_due)
            if trio.current_time() >= give_up:
                with self._lock:
                    claims = self._claim(q, worker_id, max_jobs, lease, _now(), start, limits)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return claims

    async def dequeue_into(
        self,
        queue: str,
        worker_id: str,
        timeout: float,
        lease: float,
        limits: ClaimLimits | None,
        wanted: Callable[[], tuple[int, int] | None],
        take: Callable[[list[Claim]], None],
    ) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        give_up = trio.current_time() + timeout
        hand = Hand(worker_id, lease, limits, wanted, take)
        waited = last = False
        while True:
            want = wanted()
            waiter = None
            claims: list[Claim] = []
            if want is not None:
                with self._lock:
                    q = self._q(queue)
                    now = _now()
                    claims = self._claim(q, worker_id, want[0], lease, now, want[1], limits)
                    if not claims and not last:
                        waiter, next_due = self._parked(q, now, hand)
            if waiter is None:
                if claims:
                    take(claims)  # in the claiming step: a cancellation never drops them
                if not waited:  # (a call that waited has had its schedule point)
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return
            waited = True
            await self._wait(q, waiter, give_up, next_due)
            last = trio.current_time() >= give_up

    def _parked(self, q: QueueState, now: float, hand: Hand | None = None) -> tuple[Waiter, float]:
        """(Lock held.) A claim that found nothing parks on ``q``: its waiter, and in how
        many seconds it must look again at the latest (a delayed job, a flow or group
        limit's end)."""
        waiter = Waiter(hand)
        q.waiters.add(waiter)
        return waiter, min(q.delayed[0][0] if q.delayed else math.inf, q.flow.wake, q.group_wake()) - now

    async def _wait(self, q: QueueState, waiter: Waiter, give_up: float, next_due: float) -> None:
        """A parked claim's wait: until it is woken, ``give_up`` or ``next_due`` seconds."""
        try:
            with trio.move_on_at(min(give_up, trio.current_time() + max(next_due, 0.0))):
                await waiter.event.wait()
        finally:
            with self._lock:
                q.waiters.discard(waiter)

    def _hand_off(self, q: QueueState, served: list[Waiter]) -> None:
        """Claims for the ``dequeue_into`` calls of this Trio run parked on ``q``, made in
        the step of the enqueue that readied jobs and handed over as they are made. A
        call stays parked (unwoken) only if its claim left nothing ready; otherwise it is
        woken, as any claimer, to claim again or to return (no room)."""
        for waiter in served:
            hand = waiter.hand
            assert hand is not None
            want = hand.wanted()
            claims: list[Claim] = []
            left = True
            if want is not None:
                with self._lock:
                    claims = self._claim(q, hand.worker_id, want[0], hand.lease, _now(), want[1], None)
                    left = not q.ready.empty()
            if claims:
                hand.take(claims)
            if left or not claims:
                waiter.wake()

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        out = self._settle(queue, worker_id, settlements)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return out

    def settle_nowait(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        return self._settle(queue, worker_id, settlements)

    def _settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """The step of :meth:`settle` and :meth:`settle_nowait`."""
        now = _now()
        out: list[bool] = []
        events: list[StorageEvent] = []
        retried = False
        now_ms = int(now * 1000)
        completed: list[MemRec] = []  # their index entries move in one batch
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
                        heapq.heappush(q.expiry, (expires_at, next(q.seq), group))
                    group.append(rec)
                    completed.append(rec)
                    events.append(_new(StorageEvent, ("completed", sid, worker_id, data, None, rec.token)))
                    if rec.parent is not None or rec.waiters is not None:
                        self._trees.tree_ended(rec, now)
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
                    self._trees.ended(q, rec, _PROCESSING, now)
                    result = data if rec.kind == _COMPLETED else None
                    error = rec.error if rec.kind == R.FAILED else None
                    events.append(StorageEvent(rec.kind, sid, worker_id, result, error, rec.token))
                elif rec.kind == _WAITING:
                    q.refile(rec, _PROCESSING)
                    self._trees.parent_check(q, rec, now)
                elif rec.kind == R.WAITING_SIGNAL:  # waits for a signal, until its deadline if any
                    q.refile(rec, _PROCESSING)
                    events.append(StorageEvent("waiting_signal", sid, worker_id, token=rec.token))
                    deadline = R.WaitSignal.decode(data).deadline_ms
                    if deadline is not None:
                        q.delay(rec, deadline / 1000, events)
                        retried = True
                elif rec.kind == _QUEUED:  # waited for a signal that had arrived: back at once
                    q.refile(rec, _PROCESSING)
                    q.ready.push([rec])
                    events.append(StorageEvent("requeued", sid, worker_id, token=rec.token))
                    retried = True
                else:  # failing (a retry) or delayed (rate limited, or asleep): due after the delay
                    q.refile(rec, _PROCESSING)
                    if event == "rate_limited":
                        q.flow.hold_until(now + delay)
                    assert event is not None
                    events.append(StorageEvent(event, sid, worker_id, error=rec.error if event == "failing" else None, token=rec.token))
                    q.delay(rec, now + delay, events)
                    retried = True
            q.index.move(completed, _PROCESSING, _COMPLETED)
            for kind, keep in keeps.items():  # count-based retention, in the same step
                q.keep_newest(kind, keep)
            q.publish(events)
            if retried or (any(out) and q.flow.freed()):
                q.wake()  # waiters recompute when the next retry is due
        return out

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        events: list[StorageEvent] = []
        with self._lock:
            q = self._q(queue)
            proc = q.processing.get(worker_id, {})
            released: list[MemRec] = []
            now = _now()
            for job_id in job_ids:
                rec = proc.pop(job_id, None)
                if rec is None:
                    continue
                q.group_left(rec)
                # cancelled (a cancel request) or failed (a started claim that used its
                # last attempt: StalledJobError) ends it; else it goes back
                verdict = R.release(rec, now, refund, worker_id)
                if verdict != "queued":
                    self._trees.ended(q, rec, _PROCESSING, now)
                    error = rec.error if verdict == "failed" else None
                    events.append(StorageEvent(verdict, rec.id, worker_id, error=error, token=rec.token))
                    continue
                released.append(rec)
            q.front(released, worker_id, events)
            q.publish(events)
            if released or (events and q.flow.freed()):
                q.wake()
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
            q.publish(events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return out

    def start_nowait(self, queue: str, worker_id: str, job_id: str, token: str) -> bool:
        with self._lock:
            q = self._queues.queues.get(queue) or self._q(queue)
            proc = q.processing.get(worker_id)
            rec = None if proc is None else proc.get(job_id)
            if rec is not None and rec.claim == token and not rec.cancel_requested and (rec.started or not q.paused):
                return R.start(rec, False, 0.0) == "run"  # the common case: it runs (no clock needed)
            events: list[StorageEvent] = []
            ok = self._start(q, worker_id, job_id, token, events)
            q.publish(events)
            return ok

    def _start(self, q: QueueState, worker_id: str, job_id: str, token: str, events: list[StorageEvent]) -> bool:
        proc = q.processing.get(worker_id, {})
        rec = proc.get(job_id)
        if rec is None or rec.claim != token:
            return False
        now = _now()
        verdict = R.start(rec, q.paused, now)
        if verdict == "run":
            return True
        del proc[job_id]
        q.group_left(rec)
        if verdict == R.CANCELLED:  # a reserved claim of a job with a cancel request
            self._trees.ended(q, rec, _PROCESSING, now)
            events.append(StorageEvent("cancelled", rec.id, worker_id, token=rec.token))
        else:  # paused: a prefetched job goes back, its attempt never counted
            q.front([rec], worker_id, events)
        return False

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        recovered: list[tuple[str, str]] = []
        events: list[StorageEvent] = []
        next_deadline = math.inf
        requeue: list[MemRec] = []
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            q.promote(now, events)
            promoted = bool(events)
            if q.delayed:
                next_deadline = q.delayed[0][0]
            for worker_id, proc in list(q.processing.items()):
                alive_until = q.workers.get(worker_id, 0.0)
                for job_id, rec in list(proc.items()):
                    lease = 0.0 if rec.lease is None else rec.lease
                    if lease > now and alive_until > now:
                        next_deadline = min(next_deadline, lease, alive_until)
                        continue
                    del proc[job_id]
                    q.group_left(rec)
                    events.append(StorageEvent("stalled", job_id, worker_id, token=rec.token))
                    # cancelled (a cancel request), requeued (attempts left, or a reserved
                    # claim that never ran: back at no cost) or failed (StalledJobError)
                    verdict = recover(rec, now, worker_id)
                    recovered.append((job_id, verdict))
                    if verdict == "requeued":
                        q.refile(rec, _PROCESSING)
                        requeue.append(rec)
                        events.append(StorageEvent("requeued", job_id, worker_id, token=rec.token))
                    else:
                        self._trees.ended(q, rec, _PROCESSING, now)
                        error = rec.error if verdict == "failed" else None
                        events.append(StorageEvent(verdict, job_id, worker_id, error=error, token=rec.token))
                if not proc and alive_until <= now:
                    del q.processing[worker_id]
            for worker_id, alive_until in list(q.workers.items()):
                if alive_until <= now and not q.processing.get(worker_id):
                    del q.workers[worker_id]  # a dead worker holding nothing: forget it
                    q.processing.pop(worker_id, None)
            q.ready.push(requeue)
            q.publish(events)
            if recovered or promoted:
                q.flow.freed()
                q.wake()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return recovered, (None if next_deadline == math.inf else next_deadline)

    # -- events ------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        sub = Subscriber(send, wanted_kinds(kinds))
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

    @contextmanager
    def subscribe_nowait(
        self, queue: str, kinds: Collection[str] | None, deliver: Callable[[list[StorageEvent]], None]
    ) -> Iterator[None]:
        sub = Subscriber(None, wanted_kinds(kinds), deliver)
        with self._lock:
            q = self._q(queue)
            q.subscribers = [*q.subscribers, sub]
        try:
            yield
        finally:
            with self._lock:
                q.subscribers = [s for s in q.subscribers if s is not sub]

    # -- groups ------------------------------------------------------------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            changed = (group in q.paused_groups) != paused
            if paused:
                q.paused_groups.add(group)
            elif changed:
                q.paused_groups.discard(group)
                q.ready.requeue_group(group)  # back in the rings (it left them while paused)
                q.wake()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def paused_groups(self, queue: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return sorted(self._q(queue).paused_groups)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        await trio.lowlevel.checkpoint()
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for rec in self._q(queue).jobs.values():
                if rec.kind in (_QUEUED, _PROCESSING):
                    counts = out.setdefault(rec.group or "", {_QUEUED: 0, _PROCESSING: 0})
                    counts[rec.kind] += 1
        return out


    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        reply = HeartbeatReply([], [])
        with self._lock:
            q = self._q(queue)
            q.workers[worker_id] = now + ttl
            proc = q.processing.get(worker_id, {})
            for job_id, token in claims:
                rec = proc.get(job_id)
                if rec is not None and rec.claim == token:
                    rec.lease = now + lease
                    if rec.cancel_requested:
                        reply.cancel_requested.append(job_id)
                    continue
                known = q.jobs.get(job_id)  # (None: forgotten)
                kind, claim = (None, None) if known is None else (known.kind, known.claim)
                if (why := lost_why(kind, claim, token)) is not None:
                    reply.lost.append(LostClaim(job_id, token, why))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return reply

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            q.workers.pop(worker_id, None)
            if not q.processing.get(worker_id, True):
                del q.processing[worker_id]
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint()
        now = _now()
        with self._lock:
            return {w: t for w, t in self._q(queue).workers.items() if include_expired or t > now}

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            rec = q.processing.get(worker_id, {}).get(job_id)
            ok = rec is not None and rec.claim == token
            if rec is not None and ok:
                rec.progress = progress
                q.publish([StorageEvent("progress", job_id, worker_id, result=progress, token=rec.token)])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            schedules = self._q(queue).schedules
            entry = schedules.get(name)
            ok = (None if entry is None else entry[0]) == expected
            if ok:
                schedules[name] = (spec, None if entry is None else entry[1])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            found = self._q(queue).schedules.pop(name, None) is not None
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return dict(self._q(queue).schedules)

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            entry = q.schedules.get(name)
            ok = entry is not None and (entry[1] is None or tick > entry[1])
            if entry is not None and ok:
                if job is not None:
                    self._enqueue_locked(q, [job], _now())
                q.schedules[name] = (entry[0], tick)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            changed = q.paused != paused
            if changed:
                q.paused = paused
                q.publish([StorageEvent("paused" if paused else "resumed", "")])
                q.wake()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return self._q(queue).paused

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            holder = self._locks.get(name)
            ok = holder is None or holder[0] == owner or holder[1] <= now
            if ok:
                self._locks[name] = (owner, now + ttl)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            holder = self._locks.get(name)
            ok = holder is not None and holder[0] == owner
            if ok:
                del self._locks[name]
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    # -- trees (MemoryTrees) -------------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        return await self._trees.enqueue_flow(jobs)

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        return await self._trees.add_children(queue, worker_id, job_id, token, children, policy)

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        return await self._trees.get_children(queue, job_id)

    # -- registry queries and administration (MemoryAdmin) --------------------------------

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return await self._admin.get_jobs(queue, job_ids)

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        return await self._admin.get_envelope(queue, job_id)

    async def counts(self, queue: str) -> dict[str, int]:
        return await self._admin.counts(queue)

    async def oldest(self, queue: str, state: str) -> float | None:
        return await self._admin.oldest(queue, state)

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        return await self._admin.list_jobs(queue, state, limit=limit, cursor=cursor)

    async def queue_names(self) -> list[str]:
        return await self._admin.queue_names()

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        return await self._admin.retry_job(queue, job_id, token, reset_steps=reset_steps)

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
            q.expire(_now())
            rec = q.jobs.get(job_id)
            data = None if rec is None else rec.steps
        return decode_steps(data)

    # -- signals (each one step under the lock) ----------------------------------------

    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        await trio.lowlevel.checkpoint_if_cancelled()
        entry = encode_step(name, payload)
        with self._lock:
            q = self._q(queue)
            now = _now()
            q.expire(now)
            rec = q.jobs.get(job_id)
            outcome = R.signal(rec, entry, int(now * 1000))
            if outcome == "woken":
                assert rec is not None
                q.refile(rec, R.WAITING_SIGNAL)
                rec.run_at = math.inf  # (its deadline's entry in the delayed heap is stale now)
                q.ready.push([rec])
                q.publish([StorageEvent("promoted", job_id, token=rec.token)])
                q.wake()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return "not_found" if outcome == "not_found" else "delivered"

    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
            rec = q.jobs.get(job_id)
            data = None if rec is None else rec.signals
        return decode_signals(data)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        return await self._admin.purge(queue, state, older_than=older_than)

    async def remove_job(self, queue: str, job_id: str) -> bool:
        return await self._admin.remove_job(queue, job_id)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        return await self._admin.clear(queue, schedules=schedules)

    def __repr__(self) -> str:
        return f"MemoryStorage(queues={sorted(self._queues.queues)!r})"

