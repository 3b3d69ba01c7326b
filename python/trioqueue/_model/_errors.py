"""The exceptions trioqueue raises (all derive from :class:`TrioQueueError`). What a handler
raises to steer its job is in :mod:`._outcomes`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._types import JobError


def install_hint(extra: str, needs: str) -> str:
    """The end of an error message about a missing optional dependency: what it is and
    the exact command that installs it, a user's (from the package index) and a
    contributor's (in a checkout), on one line."""
    return f"needs {needs}, the {extra!r} extra: pip install 'trioqueue[{extra}]' (in a checkout: pip install -e '.[{extra}]')"


class TrioQueueError(Exception):
    """Base class of every error raised by trioqueue."""


class ValidationError(TrioQueueError, ValueError):
    """Bad input (an id, a TTL, a timeout, a payload...). Nothing was written."""


class StorageError(TrioQueueError):
    """The storage backend failed (connection lost, corrupt data, ...)."""


class SignalTimeoutError(TrioQueueError, TimeoutError):
    """Raised by :meth:`Job.wait_for_signal <trioqueue.Job.wait_for_signal>` when no
    message on ``name`` reached the job within the wait's ``timeout`` (seconds). The
    timeout is kept as that wait's step: a later run of the job raises it again there."""

    def __init__(self, job_id: str, name: str, timeout: float | None) -> None:
        after = "" if timeout is None else f" within {timeout:g} s"
        super().__init__(f"job {job_id!r} received no signal {name!r}{after}")
        self.job_id = job_id
        self.name = name
        self.timeout = timeout


class JobTimeoutError(TrioQueueError, TimeoutError):
    """``enqueue_and_wait`` gave up waiting (the job may still run and complete later), or
    a handler exceeded its ``job_timeout`` (stored as that attempt's error)."""

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(f"job {job_id!r} did not finish within {timeout:g} s")
        self.job_id = job_id
        self.timeout = timeout


class JobFailedError(TrioQueueError):
    """The job failed for good; :attr:`error` holds the stored error, and :attr:`data`
    the data its exception offered (``error.data``: see :func:`~trioqueue.error_data`)."""

    def __init__(self, job_id: str, error: JobError) -> None:
        super().__init__(f"job {job_id!r} failed: {error.type}: {error.message}")
        self.job_id = job_id
        self.error = error
        self.data = error.data


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


class ChildJobFailedError(JobFailedError):
    """A job failed because a child of it failed for good (or was cancelled) and its
    ``on_child_failure`` is ``"cancel"`` (the default): the job never ran. :attr:`errors`
    maps each failed child's id to its error (the children that had failed when the job
    failed); the message lists them."""

    def __init__(self, job_id: str, error: JobError) -> None:
        super().__init__(job_id, error)
        try:
            listed = json.loads(error.traceback) if error.traceback else {}
            self.errors = {cid: type(error)(str(e["type"]), str(e["message"])) for cid, e in listed.items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            self.errors = {}


class FlowError(ValidationError):
    """A tree of jobs (``children=``) or a job's dependencies (``depends_on=``) were
    refused, writing nothing: a duplicate id within the tree, a child id that already
    exists, a dependency that does not exist (the message names it too), a bad
    ``on_child_failure``, or (Redis Cluster) queues that do not share a hash slot. The
    message names the job."""


class JobNotFinishedError(TrioQueueError, LookupError):
    """``get_result`` on a job that is unknown or has no result yet."""

    def __init__(self, job_id: str, state: str | None) -> None:
        what = "is unknown (never enqueued, cancelled, or its result expired)" if state is None else f"is {state}"
        super().__init__(f"job {job_id!r} {what}: no result to return")
        self.job_id = job_id
        self.state = state
