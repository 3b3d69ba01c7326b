"""What a handler raises to steer its job's outcome: fail for good now
(:class:`UnrecoverableError`), retry after a delay of its own (:class:`Retry`), or go back
without using an attempt while the whole queue holds off (:class:`RateLimited`), or
wait for the children it added (:class:`WaitForChildren`)."""

from __future__ import annotations

from . import _validate as check

__all__ = ["RateLimited", "Retry", "UnrecoverableError", "WaitForChildren"]


class UnrecoverableError(Exception):
    """Raise it (or a subclass) from a handler to fail the job for good at once: no retry,
    whatever attempts are left. The error is stored like any other."""


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


class WaitForChildren(Exception):
    """Raise it from a handler after :meth:`Job.add_children <trioqueue.Job.add_children>`:
    the job goes to ``waiting_children`` (holding no worker slot and no lease) *without*
    using an attempt, and runs again once every child is terminal (its handler then reads
    them with :meth:`~trioqueue.Job.children_results`). With no child left to wait for it
    is queued again at once."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "waiting for the job's children")
