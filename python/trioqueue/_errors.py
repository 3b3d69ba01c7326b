"""The exceptions trioqueue raises (all derive from :class:`TrioQueueError`), and the two a
handler raises to steer its job's retries (:class:`UnrecoverableError`, :class:`Retry`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._models import JobError


class TrioQueueError(Exception):
    """Base class of every error raised by trioqueue."""


class ValidationError(TrioQueueError, ValueError):
    """Bad input (an id, a TTL, a timeout, a payload...). Nothing was written."""


class StorageError(TrioQueueError):
    """The storage backend failed (connection lost, corrupt data, ...)."""


class JobTimeoutError(TrioQueueError, TimeoutError):
    """``enqueue_and_wait`` gave up waiting (the job may still run and complete later), or
    a handler exceeded its ``job_timeout`` (stored as that attempt's error)."""

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(f"job {job_id!r} did not finish within {timeout:g} s")
        self.job_id = job_id
        self.timeout = timeout


class JobFailedError(TrioQueueError):
    """The job failed for good; :attr:`error` holds the stored error."""

    def __init__(self, job_id: str, error: JobError) -> None:
        super().__init__(f"job {job_id!r} failed: {error.type}: {error.message}")
        self.job_id = job_id
        self.error = error


class JobCancelledError(TrioQueueError):
    """The job was cancelled (by :meth:`Queue.cancel`), or removed (by
    :meth:`Queue.remove`: ``removed`` is true), while it was being waited on."""

    def __init__(self, job_id: str, *, removed: bool = False) -> None:
        super().__init__(f"job {job_id!r} was {'removed' if removed else 'cancelled'}")
        self.job_id = job_id
        self.removed = removed


class QueueStoppedError(TrioQueueError):
    """The queue stopped while a call (``enqueue_and_wait``) was waiting on it."""

    def __init__(self, queue: str, job_id: str) -> None:
        super().__init__(f"queue {queue!r} stopped while waiting for job {job_id!r}")
        self.queue = queue
        self.job_id = job_id


class UnrecoverableError(Exception):
    """Raise it (or a subclass) from a handler to fail the job for good at once: no retry,
    whatever attempts are left. The error is stored like any other."""


class Retry(Exception):
    """Raise it from a handler to retry the job after ``delay`` seconds (the job's or the
    queue's ``retry_delay`` when ``None``). The attempt counts: once ``max_attempts`` is
    reached the job fails with this error."""

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        from ._validate import non_negative_seconds

        super().__init__(message or "retry requested by the handler")
        self.delay = None if delay is None else non_negative_seconds("Retry.delay", delay)
