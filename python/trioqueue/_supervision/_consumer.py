"""The consumer side of a Queue: claims in batches, runs handlers on long-lived worker
tasks, and settles in batches, with no Trio task, lock or round trip per job."""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import trio

from .._model import _validate as check
from .._model._clock import monotonic
from .._model._errors import StorageError, ValidationError
from .._model._limits import RateLimit
from ._batch import BatchRunner, BatchSettings
from ._execution import Attempt, Escalation, Executor, enter_worker
from ._leases import LeaseKeeper
from ._ledger import ClaimLedger
from ..storage._base import Claim, ClaimLimits, Settlement, SettleKind, Storage
from ..storage._capabilities import NonBlockingStart

if TYPE_CHECKING:
    from ._emitter import Emitter

# Cleanup that must run even when the owner is cancelled is shielded, but bounded by this.
CLEANUP_TIMEOUT = 10.0
RETRY_BACKOFF = (0.05, 2.0)  # storage error in a loop: first and maximum pause
# How long a worker may run jobs whose handlers never block back to back before it lets
# the other tasks run, and how long before it checks for cancellation (a forced stop)
# between two such jobs.
WORKER_SLICE = 0.001
CANCEL_CHECK = 0.00005
# Claims that the recent pace of the workers says will begin within PACE_HORIZON seconds
# are started at claim time (no start() call, no wait before their handlers); the pace is
# the rate of settled jobs over windows of PACE_WINDOW seconds, forgotten after
# PACE_STALE seconds without a settlement.
PACE_HORIZON = 0.02
PACE_WINDOW = 0.1
PACE_STALE = 0.2


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """What a :class:`Consumer` needs of its queue's settings."""

    queue: str
    worker_id: str
    concurrency: int
    prefetch: int
    block_timeout: float
    visibility_timeout: float
    lease_margin: float  # seconds, resolved and validated (see _leases.lease_margin)
    claim_limits: ClaimLimits | None = None
    batch: BatchSettings | None = None  # a batch handler's batches (see _batch)


def claim_limits(
    rate_limit: Any, global_concurrency: Any, group_concurrency: Any = None, group_rate_limit: Any = None
) -> ClaimLimits | None:
    """The storage's :class:`ClaimLimits` for a Queue's ``rate_limit``,
    ``global_concurrency``, ``group_concurrency`` and ``group_rate_limit`` (``None``: none
    is set). Raises :class:`ValidationError`."""
    if rate_limit is None and global_concurrency is None and group_concurrency is None and group_rate_limit is None:
        return None
    for name, value in (("rate_limit", rate_limit), ("group_rate_limit", group_rate_limit)):
        if value is not None and not isinstance(value, RateLimit):
            raise ValidationError(f"{name} must be a trioqueue.RateLimit, got {type(value).__name__}")
    concurrency = 0 if global_concurrency is None else check.positive_int("global_concurrency", global_concurrency)
    per_group = 0 if group_concurrency is None else check.positive_int("group_concurrency", group_concurrency)
    rate, per = (0, 1.0) if rate_limit is None else (rate_limit.limit, rate_limit.per)
    group_rate, group_per = (0, 1.0) if group_rate_limit is None else (group_rate_limit.limit, group_rate_limit.per)
    return ClaimLimits(rate, per, concurrency, per_group, group_rate, group_per)


class _StartBatch:
    """Reserved claims whose handlers wait for :meth:`Storage.start` to count their attempt."""

    __slots__ = ("claims", "done", "ok")

    def __init__(self) -> None:
        self.claims: list[Claim] = []
        self.done = trio.Event()
        self.ok: list[bool] = []


class Consumer:
    """Claims jobs in batches, runs them on ``concurrency`` long-lived tasks, and settles
    them in batches.

    Every claimed job is *held* from its claim until its settlement is stored (where it is
    meanwhile: the :class:`~._ledger.ClaimLedger`). Claims fetched for idle workers are
    started at claim time; the rest (prefetch) are reserved, and their attempt is counted
    just before their handler runs (by a batched :meth:`Storage.start`, or
    :meth:`NonBlockingStart.start_nowait` where the storage needs no I/O for it), so a
    crash costs a prefetched job nothing.

    Where the workers have lately been settling jobs fast enough that a new claim will
    begin within :data:`PACE_HORIZON` seconds, it is started at claim time too: a handler
    then never waits for a start round trip. The cost is bounded: a crash charges an
    attempt to at most that horizon's worth of claims that had not begun; a graceful stop
    hands them back with their attempts refunded.

    A worker whose handlers do not block runs job after job without a schedule point
    (see :meth:`_work`), and wakes at most one idle worker at a time for the claims left
    in the buffer; handlers that block spread over the workers as before.

    Its parts, each given what it needs: the :class:`~._ledger.ClaimLedger` (the claims
    it holds, shared by the parts), the :class:`~._leases.LeaseKeeper` (its heartbeat,
    the self-fencing of claims it could not renew and what a lost lease does) and, for a
    batch handler (``settings.batch``), the :class:`~._batch.BatchRunner`.
    """

    def __init__(
        self, settings: ConsumerSettings, storage: Storage, executor: Executor, events: Emitter, *, observed: bool = False
    ) -> None:
        self.q = settings
        self.worker_id = settings.worker_id  # (the listener routes cancel requests by it)
        self.storage = storage
        self.executor = executor
        self.events = events
        self.observed = observed  # observers want each attempt's duration
        ledger = self.ledger = ClaimLedger(executor.cancellations)
        self.per_worker = settings.batch.size if settings.batch is not None else 1  # claims a worker takes
        self.limit = settings.concurrency * self.per_worker + settings.prefetch
        self.leases = LeaseKeeper(settings, storage, events, ledger, self.request_cancel, self.limit)
        executor.lose = self.leases.lose  # a step refused by the storage loses the claim
        # Counting a reserved claim's attempt without I/O (MemoryStorage): no batch, no wait.
        self.start_nowait = self.storage.start_nowait if isinstance(self.storage, NonBlockingStart) else None
        # ... and storing settlements without I/O: a worker about to go idle stores them
        self.settle_nowait = self.storage.settle_nowait if isinstance(self.storage, NonBlockingStart) else None
        # ... and claiming without I/O: an enqueue in this run hands its jobs to our workers
        self.dequeue_into = self.storage.dequeue_into if isinstance(self.storage, NonBlockingStart) else None
        self.claim_called = 0.0  # (dequeue_into) when the latest claim was asked for
        self.settler_parked = False  # the settler waits for settlements
        self.start_wakeup = trio.lowlevel.ParkingLot()
        self.start_batch = _StartBatch()
        self.pace = 0.0  # jobs settled per second over the last window (0: not known)
        self.pace_count = 0  # settled in the current window
        self.pace_since = self.pace_at = perf_counter()  # the current window's start, the last settlement
        self.pauses = 0  # pause notices so far: a claim call that spans one gives its claims back
        self.nursery: trio.Nursery | None = None
        self.workers_left = settings.concurrency
        self.settled_all = trio.Event()
        self.done = trio.Event()
        self.batches = (
            None
            if settings.batch is None
            else BatchRunner(settings, executor, ledger, self._begin_many, self.start_nowait)
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        q = self.q
        try:
            backoff = RETRY_BACKOFF[0]
            while True:  # a storage that is briefly away at start-up is waited for
                try:
                    await self.storage.heartbeat(q.queue, q.worker_id, q.visibility_timeout, (), q.visibility_timeout)
                    await self._reconcile(final=False)  # jobs a previous run of this worker id left behind
                    break
                except StorageError as exc:
                    self.events.emit("error", error=exc, where="starting the consumer")
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, RETRY_BACKOFF[1])
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.leases.heartbeat_loop)
                nursery.start_soon(self.leases.lease_watch)
                nursery.start_soon(self._settle_loop)
                nursery.start_soon(self._start_loop)
                for _ in range(q.concurrency):
                    nursery.start_soon(self._worker)
                nursery.start_soon(self._fetch_loop)
                task_status.started()
                await self.settled_all.wait()
                nursery.cancel_scope.cancel()  # the heartbeat, the lease watch and the starter
        finally:
            # One cleanup for every way out. Graceful: everything is settled; give back
            # what a cancelled claim may have moved, then unregister. Forced (or a crash):
            # store what finished (a settlement that was in flight is sent again: settling
            # is idempotent per claim), hand back the rest; what cannot be written now
            # stays in our processing list for the reaper, its attempt counted.
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
                try:
                    if self.ledger.pending:
                        await self.storage.settle(q.queue, q.worker_id, self.ledger.pending)
                        self.ledger.pending = []
                    await self._reconcile(final=True)
                    if self.settled_all.is_set():
                        await self.storage.unregister_worker(q.queue, q.worker_id)
                except Exception as exc:
                    self.events.emit("error", error=exc, where="consumer cleanup")
            self.done.set()

    async def stop(self) -> None:
        """Graceful: stop claiming, give prefetched jobs back, let running ones finish."""
        self.ledger.draining = True
        # The claim call in flight is let finish (its jobs go back at once, see
        # _fetch_loop): cancelled, a call whose request the server served would leave its
        # jobs held, unseen, until the last running handler ended.
        self.ledger.capacity.unpark_all()
        if self.ledger.buffer:
            claims = list(self.ledger.buffer)
            self.ledger.buffer.clear()
            self.ledger.held -= await self._give_back(claims)
        self.ledger.work.unpark_all()
        self.ledger.filled.unpark_all()
        self.ledger.settle_wakeup.unpark_all()
        await self.done.wait()

    def paused(self) -> None:
        """The queue was paused (a ``paused`` notice, from any process): the claims that
        have not reached a handler go back to the queue, as at a graceful stop, and so do
        those of a claim call in flight. (A reserved claim would be refused anyway: a
        storage never starts one while paused.)"""
        claims = self._take_prefetched()
        if claims and self.nursery is not None:
            self.nursery.start_soon(self._hand_back, claims)

    async def pause(self) -> None:
        """:meth:`paused`, for a pause made by this queue: returns once they are back."""
        claims = self._take_prefetched()
        if claims:
            await self._hand_back(claims)

    def _take_prefetched(self) -> list[Claim]:
        self.pauses += 1
        claims = list(self.ledger.buffer)
        self.ledger.buffer.clear()  # in place: the workers hold a reference
        return claims

    async def _hand_back(self, claims: list[Claim]) -> None:
        # Not ours any more either way: what release could not take back stays in our
        # processing list, unrenewed, for the reaper (or the final reconcile).
        try:
            await self._give_back(claims)
        finally:
            self.ledger.unhold(len(claims))

    async def _give_back(self, claims: list[Claim]) -> int:
        """Release claims that never reached a handler (a claim started at claim time
        gets its attempt back; shielded, bounded); returns how many went back. Those that
        did not stay held: the final reconcile (run's cleanup) finds them."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
            try:
                return await self.storage.release(self.q.queue, self.q.worker_id, [c.id for c in claims], refund=True)
            except Exception as exc:
                self.events.emit("error", error=exc, where="releasing prefetched jobs")
        return 0

    def request_cancel(self, job_id: str) -> None:
        """``cancel()`` reached a job this worker holds: cancel its handler if it runs, or
        settle it as cancelled if it waits in the buffer; a job about to start checks
        ``cancel_requests``, which hold the claims the request reached (never a later
        claim: a later incarnation of the id). A job already finished settles as it
        finished."""
        running = [token for token, jid in self.ledger.running.items() if jid == job_id]
        if not running and not any(c.id == job_id for c in self.ledger.buffer):
            return
        self.ledger.cancel_requests.update(running)
        scopes = [scope for token in running if (scope := self.ledger.scopes.get(token)) is not None]
        for scope in scopes:
            scope.cancel()
            self.ledger.spent_scopes.add(scope)
        if scopes:
            return
        for claim in self.ledger.buffer:
            if claim.id == job_id:
                self.ledger.buffer.remove(claim)
                self.ledger.pending.append(self.executor.finished(Settlement(SettleKind.CANCEL, job_id, b"", token=claim.token)))
                self.ledger.settle_wakeup.unpark()
                return

    async def _reconcile(self, *, final: bool) -> None:
        """Release jobs in our processing list that we are not running: at start-up, those
        an earlier run of this worker id left (they may have run: their attempts stay);
        at the end (``final``), those of claims that never reached a handler (buffered, or
        moved by a claim cancelled in flight) get their attempts back, and those whose
        handlers a forced stop cut short keep theirs."""
        q = self.q
        held = await self.storage.held_jobs(q.queue, q.worker_id)
        busy = {*self.ledger.running.values(), *(s.id for s in self.ledger.pending)}
        orphans = [j for j in held if j not in busy]
        if orphans:
            ran = self.ledger.interrupted if final else set(orphans)
            unrun = [j for j in orphans if j not in ran]
            if unrun:
                await self.storage.release(q.queue, q.worker_id, unrun, refund=True)
            if len(unrun) < len(orphans):
                await self.storage.release(q.queue, q.worker_id, [j for j in orphans if j in ran])
            gone = set(orphans)
            before = len(self.ledger.buffer)
            kept = [c for c in self.ledger.buffer if c.id not in gone]
            self.ledger.buffer.clear()  # mutate in place: the workers hold a reference
            self.ledger.buffer.extend(kept)
            self.ledger.held -= before - len(kept)

    async def _fetch_loop(self) -> None:
        q = self.q
        backoff = RETRY_BACKOFF[0]
        while not self.ledger.draining:
            while self.ledger.held >= self.limit and not self.ledger.draining:
                await self.ledger.capacity.park()
            if self.ledger.draining:
                break
            pauses = self.pauses
            called = monotonic()
            try:
                if self.dequeue_into is not None:  # claims handed to _take as they are made
                    await self.dequeue_into(
                        q.queue, q.worker_id, q.block_timeout, q.visibility_timeout, q.claim_limits, self._wanted, self._take
                    )
                    claims = []
                else:
                    want, start = self._claim_size()
                    claims = await self.storage.dequeue(
                        q.queue, q.worker_id, want, q.block_timeout, q.visibility_timeout, start, q.claim_limits
                    )
            except Exception as exc:
                self.events.emit("error", error=exc, where="claiming jobs")
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF[1])
                continue
            backoff = RETRY_BACKOFF[0]
            if claims and self.ledger.draining:
                # claimed by a call in flight when stop() came (it gave the buffer
                # back already): none of these will run, so they go back now, not
                # when the last running handler finishes
                self.ledger.held += len(claims) - await self._give_back(claims)
            elif claims and self.pauses != pauses:
                # claimed before a pause that came while the call was in flight
                self.ledger.held += len(claims)
                await self._hand_back(claims)
            elif claims:
                self._accept(claims, called)
        # A claim cancelled mid-flight (a forced stop, or the end of a graceful one while a
        # call still blocks) may have moved jobs we never saw (a server served the
        # request): run()'s final reconcile gives them back, their attempts refunded.

    def _claim_size(self) -> tuple[int, int]:
        """How many jobs to claim, and how many of them to start at claim time."""
        want = self.limit - self.ledger.held
        # Workers idle now take the first claims at once: count those attempts at
        # claim time; the rest wait in the buffer, reserved.
        start = min(want, max(0, len(self.ledger.work) * self.per_worker - len(self.ledger.buffer)))
        ahead = self._pace_ahead()
        if ahead > start:
            start = min(want, ahead)
        if self.q.claim_limits is not None:
            start = want  # no prefetch: every claim has a worker
        return want, start

    def _accept(self, claims: list[Claim], called: float) -> None:
        """Claims made (the claim asked for at ``called``): held, buffered, a worker woken."""
        self.ledger.held += len(claims)
        self.ledger.buffer.extend(claims)
        self.leases.claimed(claims, called)
        self.ledger.wake_worker()
        if self.per_worker > 1:
            self.ledger.filled.unpark_all()

    def _wanted(self) -> tuple[int, int] | None:
        """``dequeue_into``'s question before each claim: None while draining or full
        (the fetch loop then waits for room)."""
        if self.ledger.draining or self.ledger.held >= self.limit:
            return None
        self.claim_called = monotonic()
        return self._claim_size()

    def _take(self, claims: list[Claim]) -> None:
        """``dequeue_into``'s claims, in the step that made them."""
        self._accept(claims, self.claim_called)

    async def _begin(self, claim: Claim) -> bool:
        """Count a reserved claim's attempt before its handler runs (batched with the other
        workers' starts); False if the claim was lost meanwhile. (:meth:`_begin_many`
        for one claim, without its lists: this is the per-job path.)"""
        batch = self.start_batch
        index = len(batch.claims)
        batch.claims.append(claim)
        if index == 0:
            self.start_wakeup.unpark()
        await batch.done.wait()
        return batch.ok[index]

    async def _begin_many(self, claims: list[Claim]) -> list[bool]:
        """:meth:`_begin` of several claims, in the same :meth:`Storage.start` call."""
        batch = self.start_batch
        index = len(batch.claims)
        batch.claims.extend(claims)
        if index == 0:
            self.start_wakeup.unpark()
        await batch.done.wait()
        return batch.ok[index : index + len(claims)]

    async def _start_loop(self) -> None:
        q = self.q
        backoff = RETRY_BACKOFF[0]
        while True:
            if not self.start_batch.claims:
                await self.start_wakeup.park()
                continue
            batch = self.start_batch
            self.start_batch = _StartBatch()
            while True:
                try:
                    batch.ok = await self.storage.start(q.queue, q.worker_id, [(c.id, c.token) for c in batch.claims])
                    break
                except Exception as exc:
                    self.events.emit("error", error=exc, where="starting jobs")
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, RETRY_BACKOFF[1])
            backoff = RETRY_BACKOFF[0]
            batch.done.set()

    async def _worker(self) -> None:
        attempt = enter_worker(self.executor, self.leases.leases)
        work = self._work if self.batches is None else self.batches.work
        try:
            while await work(attempt):
                pass  # a cancel() used the scope: the next jobs run under a new one
        finally:
            self.workers_left -= 1
            if self.workers_left == 0:
                self.ledger.settle_wakeup.unpark_all()

    async def _work(self, attempt: Attempt) -> bool:
        """Run jobs one after another under one cancel scope, the scope of whichever job
        runs (see :meth:`Executor.execute`). Jobs whose handlers do not block run back to
        back for up to :data:`WORKER_SLICE` seconds between schedule points, checking for
        cancellation at least every :data:`CANCEL_CHECK` seconds. Returns ``True`` when a
        ``cancel()`` or a lost lease used the scope (the caller starts a new one),
        ``False`` when the worker is done (draining)."""
        q = self.q
        ledger = self.ledger
        buffer = ledger.buffer
        running = ledger.running
        executor = self.executor
        start_nowait = self.start_nowait
        settle_now = self._settle_now if self.settle_nowait is not None else None
        spent = ledger.spent_scopes
        lost = ledger.lost
        claim: Claim | None = None
        began = 0.0
        with trio.CancelScope() as scope:
            yield_at = perf_counter() + WORKER_SLICE
            check_at = 0.0
            while True:
                if not buffer:
                    if ledger.draining:
                        return False
                    await ledger.work.park()
                    if ledger.waking:
                        ledger.waking -= 1
                    yield_at = perf_counter() + WORKER_SLICE
                    continue
                claim = buffer.popleft()
                job_id, _, _, token, started = claim
                if lost and job_id in running.values():
                    # A claim of this job whose lease was lost still ends on another of our
                    # tasks (its cancellation not delivered yet): the new claim waits for it,
                    # so two handlers of one job never run at once here.
                    buffer.appendleft(claim)
                    claim = None
                    await ledger.lost_ended.park()
                    continue
                if buffer and not ledger.waking and ledger.work:
                    ledger.wake_worker()
                running[token] = job_id
                executing = False
                try:
                    if not started:
                        if start_nowait is not None:
                            ok = start_nowait(q.queue, q.worker_id, job_id, token)
                        else:
                            ok = await self._begin(claim) and not (lost and token in lost)
                        if not ok:
                            if lost and token in lost:
                                ledger.drop_lost(job_id, token)
                            else:
                                ledger.unhold(1)  # cancelled, or the reaper took it back: not ours to run
                                ledger.cancel_spent(token)
                            claim = None
                            continue
                    began = perf_counter() if self.observed else 0.0  # for an attempt cancel() ends
                    executing = True
                    settlement = await executor.execute(claim, scope, attempt)
                except Escalation as esc:
                    ledger.pending.append(esc.settlement)
                    ledger.settle_wakeup.unpark()
                    raise esc.exc from None
                except BaseException:
                    if executing:
                        ledger.interrupted.add(job_id)  # its handler may have run in part
                    raise
                finally:
                    del running[token]
                claim = None
                if lost and token in lost:
                    ledger.drop_lost(job_id, token)  # its lease is gone: nothing is stored
                else:
                    pending = ledger.pending
                    pending.append(settlement)
                    if settle_now is not None and not buffer:
                        settle_now()  # about to go idle: store them here, not a scheduler trip away
                    elif len(pending) == 1 and not buffer and not running and self.settler_parked:
                        # the consumer goes idle with this one settlement: send it from
                        # here, not a scheduler trip away (nothing to batch it with)
                        await self._settle_alone()
                    elif len(pending) == 1:  # else the settler was woken already (or runs)
                        ledger.settle_wakeup.unpark()
                if spent and scope in spent:
                    spent.discard(scope)
                    return True  # a cancel() of the job that just ended: never reuse the scope
                now = perf_counter()
                if now >= yield_at:
                    await trio.lowlevel.checkpoint()
                    yield_at = perf_counter() + WORKER_SLICE
                    check_at = yield_at - WORKER_SLICE + CANCEL_CHECK
                elif now >= check_at:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    check_at = now + CANCEL_CHECK
        # Only a cancel() of the running job, or the loss of its lease, cancels the scope:
        # it caught that job's Cancelled (a forced stop's goes through).
        spent.discard(scope)
        if claim is not None:
            if claim.token in lost:
                ledger.drop_lost(claim.id, claim.token)
            else:
                ledger.pending.append(executor.cancelled(claim, perf_counter() - began if began else None))
                ledger.settle_wakeup.unpark()
        return True

    async def _settle_alone(self) -> None:
        """Store the one pending settlement in this worker (the consumer is idle, the
        settler parked): the settler's work without its trip through the scheduler. Not
        stored, or not known to be (a failure, a cancellation): it goes back to the
        settler, which reports a failure and tries again (a forced stop's cleanup stores
        it), as for its own batches."""
        ledger = self.ledger
        batch, ledger.pending = ledger.pending, []
        try:
            await self.storage.settle(self.q.queue, self.q.worker_id, batch)
        except BaseException as exc:
            ledger.pending[:0] = batch
            ledger.settle_wakeup.unpark()
            if not isinstance(exc, Exception):
                raise
            return
        self._paced(len(batch))
        ledger.unhold(len(batch))

    def _settle_now(self) -> None:
        """Store the pending settlements in this task, as a plain call (a storage that
        needs no I/O for it: :meth:`NonBlockingStart.settle_nowait`): what the settler
        would do a trip through the scheduler later. A failure leaves them to the settler
        (which reports it and tries again)."""
        assert self.settle_nowait is not None
        ledger = self.ledger
        batch, ledger.pending = ledger.pending, []
        try:
            self.settle_nowait(self.q.queue, self.q.worker_id, batch)
        except Exception:  # noqa: BLE001 - the settler tries again and reports it
            ledger.pending[:0] = batch
            ledger.settle_wakeup.unpark()
            return
        self._paced(len(batch))
        ledger.unhold(len(batch))

    def _pace_ahead(self) -> int:
        """How many new claims (behind the buffer) the workers' recent pace says will
        begin within :data:`PACE_HORIZON` seconds (0 when the pace is not known)."""
        if not self.pace or perf_counter() - self.pace_at > PACE_STALE:
            return 0  # nothing settled for a while: the pace is stale
        return int(self.pace * PACE_HORIZON) - len(self.ledger.buffer)

    def _paced(self, n: int) -> None:
        """Count ``n`` settled jobs towards the pace."""
        self.pace_count += n
        self.pace_at = now = perf_counter()
        elapsed = now - self.pace_since
        if elapsed >= PACE_WINDOW:
            self.pace = self.pace_count / elapsed
            self.pace_count = 0
            self.pace_since = now

    async def _settle_loop(self) -> None:
        q = self.q
        backoff = RETRY_BACKOFF[0]
        while True:
            if not self.ledger.pending:
                if self.workers_left == 0:
                    self.settled_all.set()
                    return
                self.settler_parked = True
                try:
                    await self.ledger.settle_wakeup.park()
                finally:
                    self.settler_parked = False
                continue
            batch, self.ledger.pending = self.ledger.pending, []
            try:
                # refusals (fenced) come back as events on the stream, reported there
                if self.ledger.draining:
                    with trio.CancelScope(shield=True):
                        await self.storage.settle(q.queue, q.worker_id, batch)
                else:  # (no cancel scope a batch: it costs more than settling a few jobs)
                    await self.storage.settle(q.queue, q.worker_id, batch)
            except BaseException as exc:
                # Not stored, or not known to be: keep them, for the next try or for the
                # cleanup's shielded flush. Acknowledged work is never dropped.
                self.ledger.pending[:0] = batch
                if not isinstance(exc, Exception):
                    raise
                self.events.emit("error", error=exc, where="storing results")
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF[1])
                continue
            backoff = RETRY_BACKOFF[0]
            self._paced(len(batch))
            self.ledger.unhold(len(batch))
