"""Batch handlers: a Queue whose handler takes a list of jobs (``batch_handler``).

A batch worker takes up to ``size`` claims from its consumer's buffer (waiting at most
``wait`` seconds for the buffer to fill), counts the attempts of the reserved ones, calls
the handler once with their jobs, and settles each job on its own from the handler's
outcome (a list of results, or a :class:`~trioqueue.BatchOutcome`): a failed job is
retried while it has attempts left, the others complete.

Per job, as with a handler of one job: ``cancel()`` of a job in a running batch settles
that job as cancelled whatever the handler returns for it, and a lost lease stores
nothing for it; once every job of the batch is cancelled or lost, the handler itself is
cancelled. :meth:`Job.report_progress <trioqueue.Job.report_progress>`,
:meth:`Job.add_children <trioqueue.Job.add_children>` and
:attr:`Job.lease_deadline <trioqueue.Job.lease_deadline>` work for each job of the batch
from the handler's task. ``job_timeout`` (the shortest of the batch's jobs') bounds the
handler's call: every job of a batch that ran out fails with :class:`JobTimeoutError`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from .._model import _tracing
from .._model._clock import now as _now
from .._model import _validate as check
from .._model._errors import JobTimeoutError, TrioQueueError, ValidationError
from .._model._options import JobOptions
from .._model._outcomes import BatchOutcome
from .._model._types import Job
from ..storage._base import Claim, Settlement, SettleKind
from ._execution import Attempt, Executor, failure_of
from ._observers import notify

if TYPE_CHECKING:
    from ._consumer import ConsumerSettings
    from ._ledger import ClaimLedger

__all__ = ["BatchEscalation", "BatchRunner", "BatchSettings", "batch_settings", "execute_batch"]


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """A batch handler's batches: at most ``size`` jobs, waiting at most ``wait`` seconds
    for the buffer to fill one."""

    size: int
    wait: float


def batch_settings(size: Any, wait: Any, executor: str) -> BatchSettings:
    """A Queue's ``batch_size`` and ``batch_wait``, validated (``ValidationError``)."""
    if executor == "process":
        raise ValidationError('batch_handler cannot run with executor="process" (a batch runs in the worker)')
    return BatchSettings(check.positive_int("batch_size", size), check.non_negative_seconds("batch_wait", wait))


class BatchEscalation(BaseException):
    """A batch handler raised ``KeyboardInterrupt`` or ``SystemExit``: the worker stores
    ``settlements`` (every job of the batch failed), then re-raises ``exc``."""

    def __init__(self, settlements: list[Settlement | None], exc: BaseException) -> None:
        super().__init__()
        self.settlements = settlements
        self.exc = exc


class _Batch:
    """The cancel scope of a running batch, shared by its jobs: ``member(token)`` stands
    for it in :attr:`Cancellations.scopes`; the scope is cancelled once every job of the
    batch was (a ``cancel()``, a lost lease)."""

    __slots__ = ("cancelled", "scope", "size")

    def __init__(self, scope: trio.CancelScope, size: int) -> None:
        self.scope = scope
        self.size = size
        self.cancelled: set[str] = set()

    def member(self, token: str) -> _Member:
        return _Member(self, token)


class _Member:
    """One job's handle on its batch's scope (what :meth:`Consumer.request_cancel` and a
    lost lease cancel)."""

    __slots__ = ("batch", "token")

    def __init__(self, batch: _Batch, token: str) -> None:
        self.batch = batch
        self.token = token

    def cancel(self) -> None:
        batch = self.batch
        batch.cancelled.add(self.token)
        if len(batch.cancelled) >= batch.size:
            batch.scope.cancel()


def _outcomes(jobs: Sequence[Job[Any]], result: Any, raised: BaseException | None) -> list[tuple[Any, BaseException | None]]:
    """Each job's ``(result, exception)`` from the handler's return value or exception."""
    if raised is not None:
        return [(None, raised)] * len(jobs)
    if isinstance(result, BatchOutcome):
        out: list[tuple[Any, BaseException | None]] = []
        for job in jobs:
            if job.id in result.errors:
                out.append((None, result.errors[job.id]))
            elif job.id in result.results:
                out.append((result.results[job.id], None))
            else:
                out.append((None, TrioQueueError(f"the batch handler gave job {job.id!r} no outcome")))
        return out
    if isinstance(result, list | tuple):
        if len(result) == len(jobs):
            return [(r, None) for r in result]
        problem = f"the batch handler returned {len(result)} results for {len(jobs)} jobs"
    else:
        problem = f"a batch handler must return a list of results or a BatchOutcome, got {type(result).__name__}"
    return [(None, TrioQueueError(f"{problem} (job {job.id!r})")) for job in jobs]


async def execute_batch(executor: Executor, claims: Sequence[Claim], attempt: Attempt) -> list[Settlement | None]:
    """Run one batch: each claim's settlement, in order (``None``: a job of a batch
    cancelled whole whose lease was lost; nothing is stored for it). Only cancellation
    escapes (a ``KeyboardInterrupt``/``SystemExit`` travels in a :class:`BatchEscalation`)."""
    q = executor.settings
    requests = executor.cancellations.requested
    out: list[Settlement | None] = [None] * len(claims)
    live: list[tuple[int, Claim, Job[Any], JobOptions, float]] = []
    for i, claim in enumerate(claims):
        prepared = executor.prepare(claim)
        if isinstance(prepared, Settlement):
            out[i] = prepared
            continue
        job, options, ttl, _ = prepared
        if claim.token in requests:  # cancel() came before the handler started
            requests.discard(claim.token)
            out[i] = executor.finished(Settlement(SettleKind.CANCEL, job.id, b"", ttl=ttl, token=claim.token))
            continue
        live.append((i, claim, job, options, ttl))
    if not live:
        return out
    jobs = [job for _, _, job, _, _ in live]
    timeouts = [q.job_timeout if o.job_timeout is None else o.job_timeout for _, _, _, o, _ in live]
    timeout = min((t for t in timeouts if t is not None), default=None)
    scope = trio.CancelScope()
    batch = _Batch(scope, len(live))
    scopes = executor.cancellations.scopes
    for _, claim, _, _, _ in live:
        scopes[claim.token] = batch.member(claim.token)  # type: ignore[assignment]
    if executor.observers:
        now = _now()
        for _, _, job, options, _ in live:
            wait = now - max(job.created_at, options.run_at or 0.0) if job.attempts == 1 else None
            notify(executor.observers, "job_started", q.queue, job.id, job.attempts, wait)
    spans = [_tracing.start_job_span(q.queue, job, o.trace) for _, _, job, o, _ in live] if _tracing.ENABLED else None
    attempt.batch = {job.id: (job, claim.token) for _, claim, job, _, _ in live}
    result: Any = None
    raised: BaseException | None = None
    escalate: BaseException | None = None
    timed_out = False
    began = time.perf_counter()
    try:
        with scope:
            if timeout is None:
                result = await _call(executor, jobs)
            else:
                with trio.move_on_after(timeout) as timer:
                    result = await _call(executor, jobs)
                timed_out = timer.cancelled_caught
    except BaseException as exc:
        raised, escalate = failure_of(exc)
    finally:
        attempt.batch = None
        for _, claim, _, _, _ in live:
            scopes.pop(claim.token, None)
        if spans is not None:
            for span in reversed(spans):  # (each made its context current: undone in reverse)
                if span is not None:
                    _tracing.end_job_span(span, raised)
    duration = time.perf_counter() - began
    if scope.cancelled_caught:  # every job of the batch was cancelled, or its lease lost
        for i, claim, _, _, _ in live:
            out[i] = executor.cancelled(claim, duration)  # (the worker stores nothing for a lost one)
        return out
    if timed_out and timeout is not None:
        outcomes: list[tuple[Any, BaseException | None]] = [(None, JobTimeoutError(job.id, timeout)) for job in jobs]
    else:
        outcomes = _outcomes(jobs, result, raised)
    for (i, claim, job, options, ttl), (res, error) in zip(live, outcomes, strict=True):
        if claim.token in requests:  # cancelled while the batch ran: whatever its outcome
            requests.discard(claim.token)
            out[i] = executor.finished(Settlement(SettleKind.CANCEL, job.id, b"", ttl=ttl, token=claim.token), duration)
            continue
        settlement = executor.finished(await executor.settlement(job, claim.token, res, error, ttl, options), duration)
        if error is not None:
            executor.log_failure(job, settlement, error, duration)
        out[i] = settlement
    if escalate is not None:
        raise BatchEscalation(out, escalate)
    return out


async def _call(executor: Executor, jobs: list[Job[Any]]) -> Any:
    q = executor.settings
    if q.handler_is_async:
        return await q.handler(jobs)  # type: ignore[arg-type]
    result = await trio.to_thread.run_sync(q.handler, jobs, abandon_on_cancel=True)  # type: ignore[arg-type]
    if inspect.isawaitable(result):
        result = await result
    return result


class BatchRunner:
    """The worker tasks of a batch handler (``settings.batch``): take batches from the
    ``ledger``'s buffer, count the attempts of the reserved claims (``begin_many``, one
    batched :meth:`Storage.start`, or ``start_nowait`` where the storage needs no I/O),
    run them on ``executor`` and queue each job's settlement."""

    def __init__(
        self,
        settings: ConsumerSettings,
        executor: Executor,
        ledger: ClaimLedger,
        begin_many: Callable[[list[Claim]], Awaitable[list[bool]]],
        start_nowait: Callable[[str, str, str, str], bool] | None,
    ) -> None:
        self.q = settings
        self.executor = executor
        self.ledger = ledger
        self.begin_many = begin_many
        self.start_nowait = start_nowait

    async def take_batch(self, size: int, wait: float) -> list[Claim]:
        """Up to ``size`` claims of the buffer, waiting up to ``wait`` seconds for it to
        fill (less once draining); ``[]`` when the worker is done. A claim of a job whose
        lost claim still ends on another of our tasks stays in the buffer, as in
        :meth:`Consumer._work`."""
        buffer = self.ledger.buffer
        while True:
            if not buffer:
                if self.ledger.draining:
                    return []
                await self.ledger.work.park()
                if self.ledger.waking:
                    self.ledger.waking -= 1
                continue
            if len(buffer) < size and wait > 0 and not self.ledger.draining:
                with trio.move_on_after(wait):
                    while len(buffer) < size and not self.ledger.draining:
                        await self.ledger.filled.park()
            claims: list[Claim] = []
            held_back: list[Claim] = []
            running = set(self.ledger.running.values()) if self.ledger.lost else ()
            while buffer and len(claims) < size:
                claim = buffer.popleft()
                (held_back if claim.id in running else claims).append(claim)
            buffer.extendleft(reversed(held_back))
            if claims:
                return claims
            if held_back:
                await self.ledger.lost_ended.park()

    async def work(self, attempt: Attempt) -> bool:
        """Run batches one after another until the worker is done (draining); returns
        ``False`` then, as :meth:`Consumer._work` does."""
        batch: BatchSettings = self.q.batch  # type: ignore[assignment]
        while True:
            claims = await self.take_batch(batch.size, batch.wait)
            if not claims:
                return False
            if self.ledger.buffer and not self.ledger.waking and self.ledger.work:
                self.ledger.wake_worker()
            for claim in claims:
                self.ledger.running[claim.token] = claim.id
            executing = False
            try:
                runnable = await self.begin_batch(claims)
                executing = True
                try:
                    settlements = await execute_batch(self.executor, runnable, attempt)
                except BatchEscalation as esc:
                    self.queue_settlements(runnable, esc.settlements)
                    raise esc.exc from None
            except BaseException:
                if executing:
                    self.ledger.interrupted.update(c.id for c in claims)  # their handler may have run in part
                raise
            finally:
                for claim in claims:
                    self.ledger.running.pop(claim.token, None)
                spent = self.ledger.spent_scopes
                if spent:
                    spent.difference_update([s for s in spent if isinstance(s, _Member)])
            self.queue_settlements(runnable, settlements)

    async def begin_batch(self, claims: list[Claim]) -> list[Claim]:
        """Count the attempts of the reserved claims (one :meth:`Storage.start` for the
        batch, or none where the storage needs no I/O); the claims still ours to run."""
        q = self.q
        if self.start_nowait is not None:
            ok = [c.started or self.start_nowait(q.queue, q.worker_id, c.id, c.token) for c in claims]
        else:
            reserved = [c for c in claims if not c.started]
            started: dict[str, bool] = {}
            if reserved:  # one start() for the batch (with other workers' claims waiting)
                started = dict(zip((c.token for c in reserved), await self.begin_many(reserved), strict=True))
            ok = [c.started or started.get(c.token, False) for c in claims]
        runnable = []
        for claim, good in zip(claims, ok, strict=True):
            if good and claim.token not in self.ledger.lost:
                runnable.append(claim)
                continue
            self.ledger.running.pop(claim.token, None)
            if claim.token in self.ledger.lost:
                self.ledger.drop_lost(claim.id, claim.token)
            else:
                self.ledger.unhold(1)  # cancelled, or the reaper took it back: not ours to run
                self.ledger.cancel_spent(claim.token)
        return runnable

    def queue_settlements(self, claims: list[Claim], settlements: list[Settlement | None]) -> None:
        """Queue the batch's settlements for the settler (a lost claim's: nothing)."""
        lost = self.ledger.lost
        pending = self.ledger.pending
        before = len(pending)
        for claim, settlement in zip(claims, settlements, strict=True):
            if claim.token in lost or settlement is None:
                if claim.token in lost:
                    self.ledger.drop_lost(claim.id, claim.token)
                else:
                    self.ledger.unhold(1)
                continue
            pending.append(settlement)
        if before == 0 and pending:
            self.ledger.settle_wakeup.unpark()

