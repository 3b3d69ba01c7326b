"""What a handler raises to steer its job's outcome: fail for good now
(:class:`UnrecoverableError`), retry after a delay of its own (:class:`Retry`), or go back
without using an attempt while the whole queue holds off (:class:`RateLimited`), or
wait for the children it added (:class:`WaitForChildren`); and what a batch handler
returns when its jobs end differently (:class:`BatchOutcome`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _validate as check
from ._errors import TrioQueueError, ValidationError

__all__ = [
    "BatchOutcome",
    "Parked",
    "RateLimited",
    "ResultEncodeError",
    "Retry",
    "Sleeping",
    "UnrecoverableError",
    "WaitForChildren",
]


class UnrecoverableError(Exception):
    """Raise it (or a subclass) from a handler to fail the job for good at once: no retry,
    whatever attempts are left. The error is stored like any other."""


class ResultEncodeError(TrioQueueError, UnrecoverableError):
    """The value a handler returned cannot be encoded by the queue's ``result_serde`` (it
    raised, or returned something other than bytes): the job fails for good at once, as
    another attempt would return a value that does not encode either. The stored error
    (type ``ResultEncodeError``) names the job and the type of the value."""


class Retry(Exception):
    """Raise it from a handler to retry the job after ``delay`` seconds (the job's or the
    queue's ``retry_delay`` when ``None``). The attempt counts: once ``max_attempts`` is
    reached the job fails with this error."""

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        super().__init__(message or "retry requested by the handler")
        self.delay = None if delay is None else check.non_negative_seconds("Retry.delay", delay)


class RateLimited(Exception):
    """Raise it from a handler when an upstream refused for now (an HTTP 429): the job goes
    back, due in ``retry_after`` seconds, *without* consuming an attempt, and every worker
    of the queue stops claiming for that long (stored in the storage)."""

    def __init__(self, message: str = "", *, retry_after: float = 1.0) -> None:
        super().__init__(message or f"rate limited: retry after {retry_after!r} s")
        self.retry_after = check.non_negative_seconds("RateLimited.retry_after", retry_after)


class WaitForChildren(BaseException):
    """Raise it from a handler after :meth:`Job.add_children <trioqueue.Job.add_children>`:
    the job goes to ``waiting_children`` (holding no worker slot and no lease) *without*
    using an attempt, and runs again once every child is terminal (its handler then reads
    them with :meth:`~trioqueue.Job.children_results`). With no child left to wait for it
    is queued again at once.

    A ``BaseException`` (not an ``Exception``): a handler's ``except Exception:`` does not
    swallow it, as it does not swallow Trio's ``Cancelled``."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "waiting for the job's children")


class Sleeping(BaseException):
    """What :meth:`Job.sleep <trioqueue.Job.sleep>` raises to end the handler's run while
    the job sleeps until ``until`` (seconds since the epoch): the worker settles the run
    as asleep (state ``delayed``, no attempt used). A ``BaseException``, so that a
    handler's ``except Exception:`` lets it through; a handler that swallows it anyway
    still sleeps (the worker also notes the sleep on the run)."""

    def __init__(self, job_id: str, name: str, until: float) -> None:
        super().__init__(f"job {job_id!r} sleeps at {name!r} until {until!r}")
        self.job_id = job_id
        self.name = name
        self.until = until


class Parked(BaseException):
    """Raised by :meth:`Job.wait_for_signal <trioqueue.Job.wait_for_signal>` when the job
    must wait: it ends the run (a ``BaseException``, so that ``except Exception`` in a
    handler lets it through), and the job is settled ``SettleKind.WAIT_SIGNAL``."""


class BatchOutcome:
    """What a batch handler (``Queue(batch_handler=...)``) returns when the jobs of its
    batch end differently: ``results`` (job id -> result) of the jobs that completed and
    ``errors`` (job id -> exception, as a handler raises it: :class:`Retry`,
    :class:`UnrecoverableError`, :class:`RateLimited`... or any other) of the rest. Each
    job is settled on its own: a failed one is retried while it has attempts left, the
    others complete. A job of the batch in neither fails with an error saying the handler
    gave it no outcome. Build it whole, or job by job with :meth:`complete` and
    :meth:`fail` (which take a job or its id)."""

    __slots__ = ("errors", "results")

    def __init__(self, results: Mapping[str, Any] | None = None, errors: Mapping[str, BaseException] | None = None) -> None:
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        for job_id, result in (results or {}).items():
            self.complete(job_id, result)
        for job_id, exc in (errors or {}).items():
            self.fail(job_id, exc)

    def complete(self, job: Any, result: Any = None) -> None:
        """``job`` (a :class:`~trioqueue.Job` or its id) completed with ``result``."""
        job_id = _job_id(job)
        if job_id in self.errors:
            raise ValidationError(f"job {job_id!r} has an error in this BatchOutcome already: not also a result")
        self.results[job_id] = result

    def fail(self, job: Any, exc: BaseException) -> None:
        """``job`` (a :class:`~trioqueue.Job` or its id) failed with ``exc``."""
        job_id = _job_id(job)
        if not isinstance(exc, BaseException):
            raise ValidationError(f"the error of job {job_id!r} in a BatchOutcome must be an exception, got {type(exc).__name__}")
        if job_id in self.results:
            raise ValidationError(f"job {job_id!r} has a result in this BatchOutcome already: not also an error")
        self.errors[job_id] = exc

    def __repr__(self) -> str:
        return f"BatchOutcome(results={self.results!r}, errors={self.errors!r})"


def _job_id(job: Any) -> str:
    job_id = job if isinstance(job, str) else getattr(job, "id", None)
    if not isinstance(job_id, str):
        raise ValidationError(f"a BatchOutcome entry needs a job or a job id, got {type(job).__name__}")
    return job_id
