"""Running one attempt of a job and deciding how to settle it.

Everything here is free of storage I/O: :class:`Executor` turns a :class:`Claim` into a
:class:`Settlement` (complete, retry after a delay, or fail for good) according to the
handler's outcome, the job's own options and the queue's retry policy.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from .._model import _tracing
from .._model._clock import now as _now
from .._model import _validate as check
from .._core import CodecError, decode_envelope
from .._model._errors import FlowError, JobTimeoutError, SignalTimeoutError, TrioQueueError, ValidationError
from .._model._outcomes import Parked, RateLimited, ResultEncodeError, Retry, Sleeping, UnrecoverableError, WaitForChildren
from .._model._flows import check_on_child_failure as check_policy
from .._model._options import NO_JOB_OPTIONS, JobOptions
from .._model._types import CURRENT_ATTEMPT, ExecutionContext, Job, JobError
from ._leases import Leases
from ._observers import QueueObserver, notify
from ._pool import Encoded, HandlerProcessError, ProcessPool
from .._model._serde import Serde, decode_error, encode_error, error_data
from ..storage._base import Claim, FlowJob, JobRecord, Settlement, SettleKind, Storage, parse_job_state
from ..storage._capabilities import Signals, Steps, Trees, require
from ..storage._rules import WaitSignal

if TYPE_CHECKING:
    from ._emitter import Emitter

__all__ = [
    "AfterExecution",
    "Attempt",
    "Cancellations",
    "Escalation",
    "ExecutionSettings",
    "Executor",
    "Handler",
    "Parked",
    "RetryIf",
    "RunSteps",
    "check_retry_if",
    "encode_failure",
    "encode_value",
    "enter_worker",
    "failure_of",
    "job_error",
    "only_cancelled",
    "result_failure",
]


class Attempt:
    """The attempt a worker task is running a handler for, as :meth:`Job.report_progress`
    and :attr:`Job.lease_deadline` find it (``CURRENT_ATTEMPT``): one per worker task, put
    in the task's context once (:func:`enter_worker`) and filled in for each job while its
    handler runs (a context variable set and reset per job costs more than a noop
    handler). Tasks the handler starts inherit it; ``job`` (an async handler's) and
    ``thread_job`` (a sync handler's, which may read its lease but not report progress)
    are ``None`` between handlers, so a task that outlives its handler cannot report for
    the next job. ``leases`` are the worker's lease estimates (``None``: not tracked)."""

    __slots__ = ("batch", "executor", "job", "leases", "steps", "thread_job", "token")

    def __init__(self, executor: Executor, leases: Leases | None = None) -> None:
        self.executor = executor
        self.leases = leases
        self.job: Job[Any] | None = None
        self.thread_job: Job[Any] | None = None
        self.token = ""  # the claim token of ``job``'s (or ``thread_job``'s) attempt
        # a batch handler's jobs while it runs: job id -> (job, claim token)
        self.batch: dict[str, tuple[Job[Any], str]] | None = None
        # the steps of the runs of this task's current job(s) (Job.step), by claim token:
        # made at a run's first step, dropped at the first step of a later claim
        self.steps: dict[str, RunSteps] = {}

    def _find(self, job: Job[Any], current: Job[Any] | None) -> tuple[Job[Any], str] | None:
        """``job``'s running attempt and its claim token, if this task runs it (as its
        handler's ``current`` job, or in a batch)."""
        if current is not None and (current is job or (current.id == job.id and current.attempts == job.attempts)):
            return current, self.token
        batch = self.batch
        entry = None if batch is None else batch.get(job.id)
        if entry is not None and entry[0].attempts == job.attempts:
            return entry
        return None

    def lease_deadline(self, job: Job[Any]) -> float | None:
        """:attr:`Job.lease_deadline`: the worker's estimate of the lease deadline of
        ``job``'s attempt (seconds since the epoch), if it is the one this task runs."""
        found = self._find(job, self.job if self.job is not None else self.thread_job)
        if found is None or self.leases is None:
            return None
        return self.leases.epoch(found[1])

    async def report_progress(self, job: Job[Any], value: Any) -> None:
        """:meth:`Job.report_progress`: store and announce the progress of the running
        attempt, if ``job`` is the one this task runs."""
        found = self._find(job, self.job)
        if found is None:
            raise TrioQueueError(f"report_progress for job {job.id!r} called outside that job's (async) handler")
        await self.executor.report_progress(found[0].id, found[1], value)

    def _current(self, job: Job[Any], what: str) -> tuple[Job[Any], str]:
        found = self._find(job, self.job)
        if found is None:
            raise TrioQueueError(f"{what} for job {job.id!r} called outside that job's (async) handler")
        return found

    async def add_children(self, job: Job[Any], children: Sequence[Any], on_child_failure: str = "cancel") -> None:
        """:meth:`Job.add_children` of the running attempt."""
        current, token = self._current(job, "add_children")
        await self.executor.add_children(current.id, token, children, on_child_failure)

    async def children_outcomes(self, job: Job[Any]) -> tuple[dict[str, Any], dict[str, JobError]]:
        """:meth:`Job.children_results` and :meth:`Job.children_failures`."""
        current, _ = self._current(job, "children_results")
        return await self.executor.children_outcomes(current.id)

    async def step(self, job: Job[Any], name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`Job.step` of the running attempt: of an async handler's task, or of a
        sync handler's thread (through ``trio.from_thread.run``: a sync ``fn`` then runs
        in a thread too)."""
        current, token, in_thread, run = self._run(job, f"step {name!r}")
        return await self.executor.step(current.id, token, run, name, fn, args, kwargs, in_thread=in_thread)

    async def sleep(self, job: Job[Any], name: str, wake: Callable[[], float]) -> None:
        """:meth:`Job.sleep` and :meth:`Job.sleep_until` of the running attempt: the wake-up
        time is step ``name`` (``wake()``'s the first time); until it has come, the sleep
        is noted on the run (the worker settles it asleep whatever the handler does next)
        and :class:`Sleeping` ends the handler."""
        if self.batch is not None and job.id in self.batch:
            raise TrioQueueError(
                f"sleep {name!r} of job {job.id!r}: not available in a batch handler; "
                "use a handler of one job for a job that sleeps"
            )
        current, token, in_thread, run = self._run(job, f"sleep {name!r}")
        until = await self.executor.step(current.id, token, run, name, wake, (), {}, in_thread=False)
        if isinstance(until, bool) or not isinstance(until, int | float):
            raise TrioQueueError(
                f"sleep {name!r} of job {job.id!r}: step {name!r} holds {until!r}, not a wake-up time (a step of that name)"
            )
        if until <= _now():
            return
        run.wake = until if run.wake is None else max(run.wake, until)
        raise Sleeping(current.id, name, until)

    def _run(self, job: Job[Any], what: str) -> tuple[Job[Any], str, bool, RunSteps]:
        """``job``'s running attempt, its claim token, whether it is a sync handler's (in
        a thread) and the steps of its run."""
        found = self._find(job, self.job)
        in_thread = False
        if found is None and self.thread_job is not None:
            found = self._find(job, self.thread_job)
            in_thread = found is not None
        if found is None:
            raise TrioQueueError(f"{what} of job {job.id!r} called outside that job's handler")
        current, token = found
        return current, token, in_thread, self._run_steps(token)

    def _run_steps(self, token: str) -> RunSteps:
        """The :class:`RunSteps` of the run of claim ``token`` (made at its first step)."""
        run = self.steps.get(token)
        if run is None:
            if self.batch is None:
                for old in self.steps:  # an earlier job's (and its park, if it swallowed it)
                    self.executor.parked.pop(old, None)
                self.steps.clear()
            else:
                keep = {t for _, t in self.batch.values()}
                for old in [t for t in self.steps if t not in keep]:
                    del self.steps[old]
            run = self.steps[token] = RunSteps()
        return run

    async def wait_for_signal(self, job: Job[Any], name: str, timeout: float | None) -> Any:
        """:meth:`Job.wait_for_signal` of the running attempt (an async handler's)."""
        if self.batch is not None:
            raise TrioQueueError(f"wait_for_signal {name!r} of job {job.id!r}: not available in a batch handler")
        current, token = self._current(job, "wait_for_signal")
        if timeout is not None:
            timeout = check.non_negative_seconds("timeout", timeout, job=current.id)
        return await self.executor.wait_for_signal(current.id, token, self._run_steps(token), name, timeout)


class RunSteps:
    """The steps of one run of a job (one claim): the values stored (read from the storage
    at its first step, then kept up to date by its saves), a lock that runs its steps
    one at a time, ``wake``: when a sleep of the run (:meth:`Job.sleep`) wakes it
    (seconds since the epoch; ``None``: it does not sleep), and its waits for signals:
    how many it made on each name (the k-th takes the k-th message), the job's mailbox as
    this run read it (``name -> payloads``, in the order sent; ``None``: not read yet). (The
    wait that ends a run is the executor's, by claim token: ``Executor.parked``.)"""

    __slots__ = ("lock", "mailbox", "values", "waits", "wake")

    def __init__(self) -> None:
        self.values: dict[str, bytes] | None = None
        self.lock = trio.Lock()
        self.wake: float | None = None
        self.waits: dict[str, int] = {}
        self.mailbox: dict[str, list[bytes]] | None = None


# The value of a wait for a signal: ``m`` and the payload's JSON (read from the mailbox,
# not stored), or ``t`` (timed out: stored as a step). Its step's name, and its deadline's (epoch ms, as text), are internal (a
# NUL first: never a name a handler gives); JobStatus.steps leaves them out.
_MESSAGE, _TIMED_OUT = b"m", b"t"


def signal_step(name: str, k: int) -> str:
    """The internal step name of the ``k``-th (0-based) wait for ``name`` of a run."""
    return f"\x00signal:{name}:{k}"


def deadline_step(name: str, k: int) -> str:
    """The internal step name of its deadline."""
    return f"\x00deadline:{name}:{k}"


def enter_worker(executor: Executor, leases: Leases | None = None) -> Attempt:
    """Called by each worker task, once: its :class:`Attempt`, made current in its context."""
    attempt = Attempt(executor, leases)
    CURRENT_ATTEMPT.set(attempt)
    return attempt

logger = logging.getLogger("trioqueue.jobs")

Handler = Callable[[Job[Any]], Awaitable[Any]] | Callable[[Job[Any]], Any]
AfterExecution = Callable[[ExecutionContext], Awaitable[None] | None]
RetryIf = Callable[[BaseException], bool]
"""Decides, for an exception a handler raised (a :class:`JobTimeoutError` for a handler
that exceeded its ``job_timeout``), whether the job may be retried."""


@dataclass(frozen=True, slots=True)
class ExecutionSettings:
    """What an :class:`Executor` needs of its queue's settings."""

    queue: str
    worker_id: str
    handler: Handler
    handler_is_async: bool
    payload_serde: Serde
    result_serde: Serde
    result_ttl: float
    job_timeout: float | None
    retry_delay: Callable[[int], float]  # the queue's policy: seconds before the retry after attempt n
    retry_if: RetryIf | None = None
    after_execution: AfterExecution | None = None
    pool: ProcessPool | None = None  # executor="process": the sync handler runs there
    # the jobs of children added to a running job (queue, id, children): its Queue's
    # JobMaker.subtree (validated, encoded with the queue's payload serde)
    subtree: Callable[[str, str, Sequence[Any]], list[FlowJob]] | None = None
    keep_completed: int | None = None  # count-based retention (Settlement.keep), None: by TTL only
    keep_failed: int | None = None


@dataclass(slots=True)
class Cancellations:
    """The ``cancel()`` requests a worker received for jobs it holds, shared by its
    consumer (which receives them) and its executor (which honours them): ``requested``,
    the claim tokens of the claims not to run (settled as cancelled: by claim, so that a
    request never reaches a later incarnation of the job's id), and the cancel scope of
    each running handler, by its claim token."""

    requested: set[str] = field(default_factory=set)
    scopes: dict[str, trio.CancelScope] = field(default_factory=dict)


class Escalation(BaseException):
    """Carries the settlement of an attempt whose handler raised ``KeyboardInterrupt`` or
    ``SystemExit`` from :meth:`Executor.execute` to the worker, which stores it and
    re-raises ``exc``."""

    def __init__(self, settlement: Settlement, exc: BaseException) -> None:
        super().__init__()
        self.settlement = settlement
        self.exc = exc


def job_error(exc: BaseException) -> JobError:
    """The storable form of an exception: type, message, formatted traceback, and the
    data it offers (:func:`~trioqueue.error_data`)."""
    if isinstance(exc, HandlerProcessError):
        return exc.error  # raised in a pool process, and not picklable: its text crossed
    return JobError(
        type(exc).__qualname__,
        str(exc),
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        error_data(exc),
    )


def encode_value(serde: Serde, value: Any, what: str, error: type[TrioQueueError], subject: str | None = None) -> bytes:
    """``serde.dumps(value)``, with any failure (or a non-bytes result) raised as ``error``
    about ``what`` (followed by ``subject``'s repr when given: the message is only built
    on failure)."""
    try:
        data = serde.dumps(value)
    except Exception as exc:
        raise encode_failure(serde, what, error, subject, exc) from exc
    if not isinstance(data, bytes):
        raise encode_failure(serde, what, error, subject, data)
    return data


def encode_failure(
    serde: Serde, what: str, error: type[TrioQueueError], subject: str | None, outcome: object
) -> TrioQueueError:
    """The ``error`` for a ``serde.dumps`` that raised ``outcome`` (an exception, chained
    as the cause) or returned it (not bytes)."""
    what = what if subject is None else f"{what} {subject!r}"
    if isinstance(outcome, Exception):
        failure = error(f"{what} cannot be encoded by {type(serde).__name__}: {outcome}")
        failure.__cause__ = outcome
        return failure
    return error(f"{what}: {type(serde).__name__}.dumps returned {type(outcome).__name__}, not bytes")


def result_failure(serde: Serde, job_id: str, result: object, outcome: object) -> ResultEncodeError:
    """The :class:`ResultEncodeError` of job ``job_id`` whose ``result`` ``serde.dumps``
    could not encode (``outcome``: what it raised or returned): it fails the job for good."""
    what = f"result of job {job_id!r} (a {type(result).__qualname__})"
    failure = encode_failure(serde, what, ResultEncodeError, None, outcome)
    assert isinstance(failure, ResultEncodeError)
    return failure


def failure_of(exc: BaseException) -> tuple[BaseException, BaseException | None]:
    """What a handler's exception means: ``(the failure, the interrupt to escalate after
    storing it, or None)``; Trio's ``Cancelled`` (alone or in a group of nothing else) is
    raised again: it is not a failure of the job."""
    if only_cancelled(exc):
        raise exc
    return exc, exc if isinstance(exc, KeyboardInterrupt | SystemExit) else None


def only_cancelled(exc: BaseException) -> bool:
    """Trio's ``Cancelled``, or a group of nothing else."""
    if isinstance(exc, trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None


_COMPLETE = SettleKind.COMPLETE
_new = tuple.__new__  # a Job or Settlement per attempt, built as the tuple it is


class Executor:
    """Runs attempts of a queue's jobs (its handler, serdes and policies: ``settings``),
    reporting to its ``events`` and ``observers``; ``cancellations`` are its consumer's;
    ``storage`` stores a running attempt's progress."""

    def __init__(
        self,
        settings: ExecutionSettings,
        storage: Storage,
        events: Emitter,
        observers: Sequence[QueueObserver],
        cancellations: Cancellations,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.events = events
        self.observers = observers
        self.cancellations = cancellations
        # what a lost lease does (``LeaseKeeper.lose``: job id, claim token, why), set by
        # the consumer: a step refused by the storage (fenced) cancels the handler so
        self.lose: Callable[[str, str, str], None] | None = None
        # the runs that park waiting for a signal (claim token -> the wait), until settled
        self.parked: dict[str, WaitSignal] = {}

    async def call_handler(self, job: Job[Any], token: str, attempt: Attempt, payload: bytes = b"") -> Any:
        """The handler's result for ``job`` (``payload``: its encoded payload, which
        crosses to a process pool's handler; its result comes back :class:`Encoded`)."""
        q = self.settings
        handler = q.handler
        if q.handler_is_async:
            attempt.job, attempt.token = job, token
            try:
                return await handler(job)
            finally:
                attempt.job = None
        if q.pool is not None:
            return await q.pool.run(job, payload, attempt.leases, token)
        attempt.thread_job, attempt.token = job, token
        try:
            result = await trio.to_thread.run_sync(handler, job, abandon_on_cancel=True)
        finally:
            attempt.thread_job = None
        if inspect.isawaitable(result):
            result = await result
        return result

    async def execute(self, claim: Claim, scope: trio.CancelScope, attempt: Attempt) -> Settlement:
        """Run one attempt; return how to settle it. Every failure of the job becomes a
        settlement, a ``BaseException`` other than Trio's ``Cancelled`` included (it counts
        as a failed attempt). For ``KeyboardInterrupt`` and ``SystemExit`` the settlement
        travels in an :class:`Escalation`: the worker stores it, then the interrupt
        propagates. Only cancellation escapes without a settlement.

        ``scope`` is the calling worker's cancel scope (entered by the worker, lived across
        many jobs: a scope per job costs more than a noop handler). It is registered as
        this job's while its handler runs, so a ``cancel()`` of the running job (or the
        loss of its lease) cancels it; the ``Cancelled`` then escapes from here, the
        worker's scope catches it and the worker settles the job with :meth:`cancelled`
        (for a lost lease it stores nothing); a cancelled scope is never reused.
        ``attempt`` is the worker's (:func:`enter_worker`).
        """
        q = self.settings
        observers = self.observers
        # prepare()'s decoding, inline (the per-job path); a failure goes to prepare(),
        # which says it in the settlement
        _, envelope, attempts, token, _ = claim
        try:
            jid, raw, created_ms, _, max_attempts, ttl_ms, corr, opts = decode_envelope(envelope)
            options = JobOptions.decode(opts) if opts else NO_JOB_OPTIONS
            payload = q.payload_serde.loads(raw)
        except Exception:  # noqa: BLE001 - told by prepare()
            prepared = self.prepare(claim)
            if isinstance(prepared, Settlement):
                return prepared
            job, options, ttl, raw = prepared
        else:
            ttl = ttl_ms / 1000 if ttl_ms else q.result_ttl
            job = _new(Job, (jid, payload, attempts, max_attempts, created_ms / 1000, q.worker_id, corr))
        jid = job.id
        timeout = q.job_timeout if options.job_timeout is None else options.job_timeout
        raised: BaseException | None = None
        result: Any = None
        escalate: BaseException | None = None
        requests = self.cancellations.requested
        if token in requests:  # cancel() came before the handler started
            requests.discard(token)
            return self.finished(Settlement(SettleKind.CANCEL, jid, b"", ttl=ttl, token=token))
        scopes = self.cancellations.scopes
        scopes[token] = scope  # cancelled by a cancel() of this running job
        if observers:
            wait = _now() - max(job.created_at, options.run_at or 0.0) if attempts == 1 else None
            notify(observers, "job_started", q.queue, jid, attempts, wait)
        span = _tracing.start_job_span(q.queue, job, options.trace) if _tracing.ENABLED else None
        began = time.perf_counter()
        try:
            if timeout is None:
                if q.handler_is_async:  # call_handler's, inline: the common case, per job
                    attempt.job, attempt.token = job, token
                    try:
                        result = await q.handler(job)
                    finally:
                        attempt.job = None
                else:
                    result = await self.call_handler(job, token, attempt, raw)
            else:
                with trio.move_on_after(timeout) as timer:
                    result = await self.call_handler(job, token, attempt, raw)
                if timer.cancelled_caught:
                    raised = JobTimeoutError(jid, timeout)
        except BaseException as exc:
            raised, escalate = failure_of(exc)
        finally:
            scopes.pop(token, None)
            if span is not None:
                _tracing.end_job_span(span, raised)
        # (only observers and the failure log use the duration)
        duration = time.perf_counter() - began if observers or raised is not None else 0.0
        if token in requests:
            requests.discard(token)
            return self.finished(Settlement(SettleKind.CANCEL, jid, b"", ttl=ttl, token=token), duration)
        if attempt.steps:  # a run that took steps: did it go to sleep (Job.sleep)?
            run = attempt.steps.get(token)
            if run is not None and run.wake is not None:
                # whatever the handler did after (returned, raised): it sleeps
                asleep = Settlement(SettleKind.SLEEP, jid, b"", delay=max(0.0, run.wake - _now()), token=token)
                asleep = self.finished(asleep, duration)
                if escalate is not None:
                    raise Escalation(asleep, escalate)
                return asleep
        settlement = None
        if raised is None and q.after_execution is None and q.pool is not None:
            settlement = _new(Settlement, (_COMPLETE, jid, result.data, ttl, 0.0, token, q.keep_completed))  # (pool-encoded)
        elif raised is None and q.after_execution is None:  # settlement()'s common case, inline
            serde = q.result_serde
            try:
                data = serde.dumps(result)
            except Exception as exc:
                raised = result_failure(serde, jid, result, exc)
            else:
                if type(data) is bytes or isinstance(data, bytes):
                    settlement = _new(Settlement, (_COMPLETE, jid, data, ttl, 0.0, token, q.keep_completed))
                else:
                    raised = result_failure(serde, jid, result, data)
        if settlement is None:
            settlement = await self.settlement(job, token, result, raised, ttl, options)
        if observers:
            self.finished(settlement, duration)
        if raised is not None:
            self.log_failure(job, settlement, raised, duration)
        if escalate is not None:
            raise Escalation(settlement, escalate)
        return settlement

    def prepare(self, claim: Claim) -> tuple[Job[Any], JobOptions, float, bytes] | Settlement:
        """Decode a claim: ``(job, its options, its result TTL, its stored payload)``, or
        the settlement that fails it for good (an unreadable envelope or payload)."""
        q = self.settings
        claim_id, envelope, attempts, token, _ = claim
        try:
            jid, raw, created_ms, _, max_attempts, ttl_ms, corr, opts = decode_envelope(envelope)
            options = JobOptions.decode(opts) if opts else NO_JOB_OPTIONS
        except CodecError as exc:
            bad = JobError("CodecError", f"job {claim_id!r} has an unreadable envelope: {exc}")
            failed = Settlement(SettleKind.FAIL, claim_id, encode_error(bad), ttl=q.result_ttl, token=token, keep=q.keep_failed)
            return self.finished(failed)
        ttl = ttl_ms / 1000 if ttl_ms else q.result_ttl
        try:
            payload = q.payload_serde.loads(raw)
        except Exception as exc:
            # A payload that cannot be decoded never will be: fail for good, no retry.
            bad = JobError(
                "PayloadDecodeError", f"payload of job {jid!r} cannot be decoded: {exc}", job_error(exc).traceback
            )
            return self.finished(Settlement(SettleKind.FAIL, jid, encode_error(bad), ttl=ttl, token=token, keep=q.keep_failed))
        job: Job[Any] = _new(Job, (jid, payload, attempts, max_attempts, created_ms / 1000, q.worker_id, corr))
        return job, options, ttl, raw

    def log_failure(self, job: Job[Any], settlement: Settlement, raised: BaseException, duration: float) -> None:
        """Log a failed attempt that is retried or failed for good."""
        if settlement.kind not in (SettleKind.RETRY, SettleKind.FAIL):
            return
        retry = settlement.kind is SettleKind.RETRY
        logger.info(
            "job %r attempt %d/%d failed after %.3f s (%s): %s: %s",
            job.id,
            job.attempts,
            job.max_attempts,
            duration,
            f"retry in {settlement.delay:g} s" if retry else "failed for good",
            type(raised).__qualname__,
            raised,
            extra={
                "queue": self.settings.queue,
                "job_id": job.id,
                "attempt": job.attempts,
                "max_attempts": job.max_attempts,
                "duration": round(duration, 6),
                "outcome": "retry" if retry else "failed",
            },
        )

    def cancelled(self, claim: Claim, duration: float | None) -> Settlement:
        """The settlement of an attempt whose handler a ``cancel()`` interrupted (the
        ``Cancelled`` escaped :meth:`execute` and the worker's scope caught it)."""
        self.cancellations.requested.discard(claim.token)
        try:
            ttl_ms = decode_envelope(claim.envelope)[5]
        except CodecError:
            ttl_ms = 0
        ttl = ttl_ms / 1000 if ttl_ms else self.settings.result_ttl
        return self.finished(Settlement(SettleKind.CANCEL, claim.id, b"", ttl=ttl, token=claim.token), duration)

    def finished(self, settlement: Settlement, duration: float | None = None) -> Settlement:
        """Tell the queue's observers how an attempt ended; returns ``settlement``."""
        if self.observers:
            notify(self.observers, "job_finished", self.settings.queue, settlement.id, settlement.kind, duration)
        return settlement

    def _retry_delay(self, job: Job[Any], raised: BaseException, options: JobOptions) -> float | None:
        """Seconds until the retry of a failed attempt, or ``None``: fail for good."""
        if job.attempts >= job.max_attempts or isinstance(raised, UnrecoverableError):
            return None
        if isinstance(raised, Retry):
            if raised.delay is not None:
                return raised.delay
        elif self.settings.retry_if is not None:
            try:
                if not self.settings.retry_if(raised):
                    return None
            except Exception as exc:
                self.events.emit("error", job.id, error=exc, where="retry_if (the job is retried)")
        delay = options.retry_delay if options.retry_delay is not None else self.settings.retry_delay(job.attempts)
        return max(0.0, float(delay))

    async def settlement(
        self,
        job: Job[Any],
        token: str,
        result: Any,
        raised: BaseException | None,
        ttl: float,
        options: JobOptions = NO_JOB_OPTIONS,
    ) -> Settlement:
        after = self.settings.after_execution
        jid = job.id
        data = b""
        if raised is None:
            try:
                data = self.dump_result(jid, result)
            except TrioQueueError as exc:
                raised = exc
        error = None
        if isinstance(raised, BaseExceptionGroup) and raised.split(WaitForChildren)[1] is None:
            raised = WaitForChildren()  # (raised in a nursery: a group of nothing else)
        if isinstance(raised, Parked) or (raised is not None and token in self.parked):
            wait = self.parked.pop(token, None)
            if wait is not None:  # not an attempt: the job waits for a signal
                return Settlement(SettleKind.WAIT_SIGNAL, jid, wait.encode(), ttl=ttl, token=token)
        if isinstance(raised, WaitForChildren):
            # Not an attempt: the job waits for its children, then runs again.
            return Settlement(SettleKind.WAIT_CHILDREN, jid, b"", ttl=ttl, token=token)
        if isinstance(raised, RateLimited):
            # Not an attempt: back to the queue, and the whole queue holds off meanwhile.
            return Settlement(SettleKind.RATE_LIMITED, jid, b"", delay=raised.retry_after, token=token)
        if raised is not None:
            error = job_error(raised)
            delay = self._retry_delay(job, raised, options)
            if delay is not None:
                return Settlement(SettleKind.RETRY, jid, encode_error(error), delay=delay, token=token)
        if after is not None:
            if error is None and isinstance(result, Encoded):  # the hook sees the value
                try:
                    result = self.settings.result_serde.loads(result.data)
                except Exception as exc:
                    self.events.emit("error", jid, error=exc, where="after_execution (decoding the result)")
                    return Settlement(SettleKind.COMPLETE, jid, data, ttl=ttl, token=token, keep=self.settings.keep_completed)
            ctx = ExecutionContext(job, result if error is None else None, error, ttl)
            try:
                ret = after(ctx)
                if inspect.isawaitable(ret):
                    await ret
                error, ttl = ctx.error, check.seconds("context.ttl", ctx.ttl, job=jid)
                if error is None:
                    data = self.dump_result(jid, ctx.result)
            except Exception as exc:
                self.events.emit("error", jid, error=exc, where="after_execution")
        if error is None:
            return Settlement(SettleKind.COMPLETE, jid, data, ttl=ttl, token=token, keep=self.settings.keep_completed)
        return Settlement(SettleKind.FAIL, jid, encode_error(error), ttl=ttl, token=token, keep=self.settings.keep_failed)

    def dump_result(self, job_id: str, result: Any) -> bytes:
        if isinstance(result, Encoded):
            return result.data
        serde = self.settings.result_serde
        try:
            data = serde.dumps(result)
        except Exception as exc:
            raise result_failure(serde, job_id, result, exc) from exc
        if not isinstance(data, bytes):
            raise result_failure(serde, job_id, result, data)
        return data

    async def report_progress(self, job_id: str, token: str, value: Any) -> None:
        """Store and announce ``value`` as the progress of the attempt of claim ``token``."""
        q = self.settings
        data = encode_value(q.result_serde, value, "progress of job", ValidationError, job_id)
        if not await self.storage.set_progress(q.queue, q.worker_id, job_id, token, data):
            raise TrioQueueError(f"progress of job {job_id!r} not stored: this worker no longer holds the job")


    async def step(
        self,
        job_id: str,
        token: str,
        run: RunSteps,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        in_thread: bool = False,
    ) -> Any:
        """Step ``name`` of the run of claim ``token`` (see :meth:`Job.step`): its stored
        value, or ``fn``'s, stored first. The stored steps are read once per run, at its
        first step (one round trip; a job that takes no step pays nothing), then each new
        step is one save. A save the storage refuses (the claim is no longer held) loses
        the claim as a lost lease does: the handler is cancelled, nothing more is stored."""
        q = self.settings
        serde = q.result_serde
        steps = require(self.storage, Steps, f"step {name!r} of job {job_id!r}")
        async with run.lock:
            if run.values is None:
                run.values = await steps.get_steps(q.queue, job_id)
            data = run.values.get(name)
            if data is None:
                if in_thread and not inspect.iscoroutinefunction(fn):
                    value = await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), abandon_on_cancel=True)
                else:
                    value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
                data = encode_value(serde, value, f"value of step {name!r} of job", ResultEncodeError, job_id)
                if not await steps.save_step(q.queue, q.worker_id, job_id, token, name, data):
                    if self.lose is not None:
                        self.lose(job_id, token, "fenced")
                        await trio.lowlevel.checkpoint()  # the handler's scope is cancelled now
                    raise TrioQueueError(f"step {name!r} of job {job_id!r} not stored: this worker no longer holds the job")
                run.values[name] = data
        try:
            return serde.loads(data)
        except Exception as exc:
            raise TrioQueueError(f"stored value of step {name!r} of job {job_id!r} cannot be decoded: {exc}") from exc

    async def wait_for_signal(self, job_id: str, token: str, run: RunSteps, name: str, timeout: float | None) -> Any:
        """:meth:`Job.wait_for_signal` in the run of claim ``token``: the ``k``-th wait for
        ``name`` of the run (``k`` counted in ``run``) takes the ``k``-th message on it.
        The mailbox only grows while the incarnation lives, so the ``k``-th message is the
        same on every run: it is returned without being copied into a step (a resume pays
        no write), from the mailbox read once a run (read again when the message is not
        in it yet). A timeout is a step (``signal_step``, stored: raised again, whatever
        arrives later). Else its deadline (``deadline_step``, stored at the first wait so
        that waking up does not move it) has passed: the timeout is stored and raised;
        or the run parks (:class:`Parked`: settled ``WAIT_SIGNAL``, the storage queues it
        again at once if the message arrived meanwhile)."""
        q = self.settings
        signals = require(self.storage, Signals, f"wait_for_signal {name!r} of job {job_id!r}")
        k = run.waits.get(name, 0)
        run.waits[name] = k + 1
        step, until = signal_step(name, k), deadline_step(name, k)
        async with run.lock:
            if run.values is None:
                run.values = await signals.get_steps(q.queue, job_id)
            data = run.values.get(step)
            if data is None:
                if run.mailbox is None or len(run.mailbox.get(name, ())) <= k:
                    run.mailbox = {}
                    for n, payload in await signals.get_signals(q.queue, job_id):
                        run.mailbox.setdefault(n, []).append(payload)
                messages = run.mailbox.get(name, [])
                if len(messages) > k:
                    data = _MESSAGE + messages[k]
                else:
                    stored = run.values.get(until)
                    deadline = None if stored is None else int(stored)
                    if deadline is None and timeout is not None:
                        deadline = math.ceil((_now() + timeout) * 1000)  # (never early)
                        await self._save(signals, job_id, token, run, until, b"%d" % deadline)
                    if deadline is None or deadline > _now() * 1000:
                        self.parked[token] = WaitSignal(name, k + 1, deadline)
                        raise Parked()
                    data = _TIMED_OUT
                    await self._save(signals, job_id, token, run, step, data)
        if data[:1] == _TIMED_OUT:
            raise SignalTimeoutError(job_id, name, timeout)
        try:
            return json.loads(data[1:])
        except ValueError as exc:
            raise TrioQueueError(f"stored signal {name!r} of job {job_id!r} cannot be decoded: {exc}") from exc

    async def _save(self, steps: Steps, job_id: str, token: str, run: RunSteps, name: str, data: bytes) -> None:
        """Store step ``name`` of the run (fenced: a refusal loses the claim)."""
        assert run.values is not None
        if not await steps.save_step(self.settings.queue, self.settings.worker_id, job_id, token, name, data):
            if self.lose is not None:
                self.lose(job_id, token, "fenced")
                await trio.lowlevel.checkpoint()  # the handler's scope is cancelled now
            raise TrioQueueError(f"step {name!r} of job {job_id!r} not stored: this worker no longer holds the job")
        run.values[name] = data

    async def add_children(self, job_id: str, token: str, children: Sequence[Any], policy: str) -> None:
        """Store ``children`` as children of the attempt of claim ``token``."""
        q = self.settings
        if q.subtree is None:
            raise TrioQueueError(f"add_children for job {job_id!r}: this worker cannot make jobs")
        check_policy(policy, job_id)
        jobs = q.subtree(q.queue, job_id, children)
        for fj in jobs:
            if fj.depends_on:
                # (the job adding them exists, and so may a job waiting for it: a child of
                # it waiting for that job would wait for ever; enqueue such jobs on their own)
                raise FlowError(f"job {fj.job.id!r}: children added by a running job (job {job_id!r}) cannot have depends_on")
        trees = require(self.storage, Trees, f"add_children for job {job_id!r}")
        if not await trees.add_children(q.queue, q.worker_id, job_id, token, jobs, policy):
            raise TrioQueueError(
                f"children of job {job_id!r} not added: the job is being cancelled (a cancel request, or its tree's), "
                "or this worker no longer holds it"
            )

    async def children_outcomes(self, job_id: str) -> tuple[dict[str, Any], dict[str, JobError]]:
        """``({id: result} of the completed children, {id: error} of the failed and
        cancelled ones)``, results decoded by the queue's result serde."""
        trees = require(self.storage, Trees, f"the children of job {job_id!r}")
        records: list[tuple[str, JobRecord]] = await trees.get_children(self.settings.queue, job_id)
        results: dict[str, Any] = {}
        failures: dict[str, JobError] = {}
        for _, r in records:
            kind = parse_job_state(r.state)[0]
            if kind == "completed":
                results[r.id] = None if r.result is None else self.settings.result_serde.loads(r.result)
            elif kind == "failed":
                failures[r.id] = decode_error(r.error) if r.error else JobError("UnknownError", "error not stored")
            elif kind == "cancelled":
                failures[r.id] = JobError("JobCancelledError", f"job {r.id!r} was cancelled")
        return results, failures


def check_retry_if(value: Any) -> RetryIf | None:
    """``retry_if`` as given to a Queue: ``None`` or a callable."""
    if value is not None and not callable(value):
        raise ValidationError(f"retry_if must be a callable (exception -> bool), got {value!r}")
    return value  # type: ignore[no-any-return]
