"""Public value types: status enums, results, jobs and events."""

from __future__ import annotations

import math
from contextvars import ContextVar
from datetime import datetime
from dataclasses import dataclass, field
from enum import StrEnum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from . import _clock
from ._errors import TrioQueueError, ValidationError

if TYPE_CHECKING:
    from ._flows import Child, JobRef

T = TypeVar("T")


class _RunningAttempt(Protocol):
    async def report_progress(self, job: Job[Any], value: Any) -> None: ...

    def lease_deadline(self, job: Job[Any]) -> float | None: ...

    async def add_children(self, job: Job[Any], children: Sequence[Any], on_child_failure: str = ...) -> None: ...

    async def children_outcomes(self, job: Job[Any]) -> tuple[dict[str, Any], dict[str, JobError]]: ...

    async def step(self, job: Job[Any], name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    async def sleep(self, job: Job[Any], name: str, wake: Callable[[], float]) -> None: ...

    async def wait_for_signal(self, job: Job[Any], name: str, timeout: float | None) -> Any: ...


# The attempt the current task runs a handler for, as the worker running it sets it (see
# ``_supervision._execution.Attempt``): what :meth:`Job.report_progress` reports to and
# :attr:`Job.lease_deadline` reads. ``None`` outside.
CURRENT_ATTEMPT: ContextVar[_RunningAttempt | None] = ContextVar("trioqueue_attempt", default=None)


class JobState(StrEnum):
    """The state of a job in the registry."""

    QUEUED = "queued"
    PROCESSING = "processing"
    FAILING = "failing"  # failed an attempt, waiting for its retry
    COMPLETED = "completed"
    FAILED = "failed"  # failed for good
    CANCELLED = "cancelled"  # cancelled before it ran (kept for its result TTL)
    DELAYED = "delayed"  # enqueued with a delay: queued once due (``JobStatus.run_at``)
    WAITING_CHILDREN = "waiting_children"  # a parent: queued once every child is terminal
    WAITING_SIGNAL = "waiting_signal"  # waits for a signal (Job.wait_for_signal): queued once it arrives

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class EnqueueStatus(StrEnum):
    QUEUED = "queued"
    DUPLICATE = "duplicate"
    COMPLETED = "completed"
    DEBOUNCED = "debounced"  # (``debounce=``) the waiting job took this payload; its run moved


class CancelStatus(StrEnum):
    CANCELLED = "cancelled"
    NOT_FOUND = "not_found"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"


class UpdateTTLStatus(StrEnum):
    UPDATED = "updated"
    NOT_FOUND = "not_found"
    NOT_TERMINAL = "not_terminal"
    MISSING_PAYLOAD = "missing_payload"


@dataclass(frozen=True, slots=True)
class JobError:
    """A stored failure: the exception's type name, message and traceback text, and the
    ``data`` dict the exception offered (see :func:`~trioqueue.error_data`: its
    ``to_dict()``, or the attributes its class names in ``error_fields``), ``None`` when
    it offered none."""

    type: str
    message: str
    traceback: str = ""
    data: dict[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What :meth:`Queue.enqueue` did.

    ``status`` is ``queued`` (a new job), ``duplicate`` (the id is already known;
    ``existing_state`` says in which state) or ``completed`` (the id completed earlier and
    its cached ``result`` is returned).
    """

    id: str
    status: EnqueueStatus
    existing_state: JobState | None = None
    result: Any = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    id: str
    status: CancelStatus


# ``Queue(result_ttl=None)``: results and errors are kept "forever", as a TTL of 100 years
# (every backend stores it as any TTL; Redis's expiry index holds times up to year 2527).
FOREVER_TTL = 100 * 365.25 * 86400.0

# The library's defaults of ``Queue(max_attempts=, result_ttl=)``: also those of a child job
# enqueued to a queue no Queue object of this process is made for (see ``Child``).
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_RESULT_TTL = 3600.0

# Job priorities: a fixed range, lower runs first; jobs of one priority run in FIFO order.
MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A registry look-up: the job's state and, once terminal, its result or error."""

    id: str
    state: JobState
    created_at: float  # seconds since the epoch
    attempts: int
    result: Any = None
    error: JobError | None = None
    worker_id: str | None = None
    updated_at: float = 0.0  # when the job entered ``state`` (seconds since the epoch)
    run_at: float | None = None  # a delayed job: when it is due (seconds since the epoch)
    progress: Any = None  # the last value the handler gave ``Job.report_progress``
    priority: int = DEFAULT_PRIORITY  # 0 (first) .. 9 (last)
    parent: JobRef | None = None  # a child job: its parent (queue and id)
    children: dict[JobState, int] | None = None  # a parent: its children's counts by state
    group: str | None = None  # its group (``enqueue(..., group=)``), ``None`` without one
    # its stored steps (``Job.step``), name -> value in the order they were saved: read by
    # ``get_status`` (``{}``: none); ``None`` where not read (``get_statuses``, ``list_jobs``).
    # Not compared: the status of one job read either way is equal.
    steps: dict[str, Any] | None = field(default=None, compare=False)


class JobPage(NamedTuple):
    """A page of :meth:`Queue.list_jobs`: the jobs, newest first, and the ``cursor`` to
    pass for the next page (``None``: this was the last)."""

    jobs: list[JobStatus]
    cursor: str | None


class Job(NamedTuple, Generic[T]):
    """What a handler receives. ``attempts`` is 1-based: 1 on the first run."""

    id: str
    payload: T
    attempts: int
    max_attempts: int
    created_at: float
    worker_id: str
    correlation_id: str | None = None

    async def report_progress(self, value: Any) -> None:
        """Store ``value`` (serializable by the queue's result serde: a number, a dict...)
        as this job's progress, visible in ``get_status`` and sent as a ``progress`` event.
        Call it from the handler's task (or its children). Raises ``TrioQueueError`` if
        the worker no longer holds the job (its lease was lost)."""
        attempt = CURRENT_ATTEMPT.get()
        if attempt is None:
            raise TrioQueueError(f"report_progress for job {self.id!r} called outside that job's (async) handler")
        await attempt.report_progress(self, value)

    async def add_children(self, children: Sequence[Child], on_child_failure: str = "cancel") -> None:
        """Add children to this running job (dynamic children), atomically (the whole
        list, with their own children, or nothing: :class:`~trioqueue.FlowError` naming
        the problem). They start at once; ``raise WaitForChildren()`` then makes this job
        wait for them (without using an attempt) and run again once they are terminal.
        ``on_child_failure`` as for ``enqueue`` (the first call that adds children sets
        it). Call it from the handler's task. Raises ``TrioQueueError`` naming the job,
        adding nothing, if the job is being cancelled (a cancel request: ``Queue.cancel``
        of it, or its tree's cancel after a failure) or the worker no longer holds it."""
        await _attempt(self, "add_children").add_children(self, children, on_child_failure)

    async def children_results(self) -> dict[str, Any]:
        """The results of this job's completed children and dependencies (``depends_on``),
        ``{id: result}`` (decoded by this queue's result serde). Call it from the
        handler's task."""
        return (await _attempt(self, "children_results").children_outcomes(self))[0]

    async def children_failures(self) -> dict[str, JobError]:
        """The errors of this job's children and dependencies that failed for good or were
        cancelled, ``{id: JobError}`` (``on_child_failure="continue"``; ``"ignore"`` too).
        Call it from the handler's task."""
        return (await _attempt(self, "children_failures").children_outcomes(self))[1]

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (a sync function, or an async one, awaited) once
        for this job: the first time a run of this job reaches step ``name``, its return
        value is stored with the job (encoded by the queue's result serde) and returned;
        when the job runs again (a retry after an exception, a recovery after its worker
        died, ``Queue.retry``), a step whose value is stored returns that value at once
        without calling ``fn``. What is returned is always the stored value, decoded (the
        same on the first run as on a replay). An exception from ``fn`` stores nothing and
        propagates. A name used twice in one run returns the first value. The steps of a
        job run one at a time (a second ``step`` call waits for the first).

        The save is fenced by the job's claim: when this worker no longer holds the job
        (its lease was lost), nothing is stored and the handler is cancelled, as on a lost
        lease. Call it from an async handler's task (or its children); a sync handler
        running in a thread calls ``trio.from_thread.run(job.step, name, fn)`` (a sync
        ``fn`` then runs in a worker thread too). Not available in a process pool's
        handler (``executor="process"``). Needs a storage with the ``Steps`` capability
        (all four built-in ones have it)."""
        if not isinstance(name, str):
            raise TypeError(f"step name of job {self.id!r} must be a string, got {type(name).__name__}")
        if not callable(fn):
            raise TypeError(f"step {name!r} of job {self.id!r}: fn must be callable, got {fn!r}")
        return await _attempt(self, "step").step(self, name, fn, args, kwargs)

    async def sleep(self, name: str, seconds: float) -> None:
        """Sleep ``seconds`` durably, as step ``name``: the first time a run of this job
        gets here, the wake-up time (now + ``seconds``, an absolute time) is stored as the
        value of step ``name`` and the handler's run ends here: the job goes ``delayed``
        until then, holding no worker slot and no lease, without using an attempt (event
        ``sleeping``). When it runs again, its earlier steps return their stored values
        and this call returns at once once the stored time has come (a run that comes
        early sleeps again for the rest: a sleep never wakes early). ``seconds`` counts
        from the first time only.

        The run ends by a ``BaseException`` this call raises, which a handler's ``except
        Exception:`` lets through (a handler that catches it anyway still sleeps: the
        worker notes the sleep on the run). A cancel of a sleeping job ends it cancelled.
        Call it from an async handler's task (or a sync handler's thread, through
        ``trio.from_thread.run(job.sleep, name, seconds)``); not in a batch handler nor in
        a process pool's (``TrioQueueError``). ``ValidationError`` naming the job for a
        negative or non-finite ``seconds``."""
        if not isinstance(name, str):
            raise TypeError(f"sleep name of job {self.id!r} must be a string, got {type(name).__name__}")
        delay = _instant(f"seconds of sleep {name!r}", seconds, self.id, "a number of seconds")
        await _attempt(self, "sleep").sleep(self, name, lambda: _clock.now() + delay)

    async def sleep_until(self, name: str, when: datetime | float) -> None:
        """:meth:`sleep` until ``when``, a timezone-aware ``datetime`` or a UNIX timestamp
        (seconds since the epoch), stored as step ``name``; a time already past returns at
        once (and is stored as well). A naive ``datetime`` raises ``ValidationError``
        naming the job."""
        if not isinstance(name, str):
            raise TypeError(f"sleep name of job {self.id!r} must be a string, got {type(name).__name__}")
        if isinstance(when, datetime):
            if when.tzinfo is None or when.utcoffset() is None:
                raise ValidationError(
                    f"when of sleep_until {name!r} must be a timezone-aware datetime, "
                    f"got naive {when.isoformat()} (job {self.id!r})"
                )
            until = when.timestamp()
        else:
            until = _instant(f"when of sleep_until {name!r}", when, self.id, "a timezone-aware datetime or a UNIX timestamp")
        await _attempt(self, "sleep_until").sleep(self, name, lambda: until)
    async def wait_for_signal(self, name: str, timeout: float | None = None) -> Any:
        """The payload of the next message on ``name`` sent to this job
        (:meth:`Queue.signal <trioqueue.Queue.signal>`): the k-th call with ``name`` in a
        run of the job returns the k-th message ever sent to it on ``name`` (a message
        sent before the job waits is kept for it). The outcome is kept as a step: a later
        run of the job returns the same payload at once.

        With no such message yet the job *parks*: this call does not return; the run ends
        (let the internal exception it raises propagate) and the job waits in
        ``waiting_signal`` (no worker slot, no lease, no attempt used) until the message
        arrives (then it is queued at once, and its next run replays its steps up to
        here and returns the payload) or ``timeout`` seconds pass (counted from the
        first time the job waited here; ``None``: no limit): then the next run raises
        :class:`~trioqueue.SignalTimeoutError` here. Call it from an async handler's task;
        needs a storage with the ``Signals`` capability (all four built-in ones)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"signal name of job {self.id!r} must be a non-empty string, got {name!r}")
        return await _attempt(self, "wait_for_signal").wait_for_signal(self, name, timeout)

    @property
    def lease_deadline(self) -> float | None:
        """When this attempt's lease runs out unless its worker renews it, in seconds since
        the epoch: the worker's own estimate, not a time read from the storage. The worker
        measures it on its monotonic clock, from the start of the claim (or of the last
        heartbeat call that renewed the lease) plus ``visibility_timeout``, and gives it
        on this machine's wall clock, so the deadline the storage keeps is the same or
        later (barring clock skew between this machine and a storage server). It moves
        forward with each renewal; the worker cancels the handler itself once it is
        within the queue's ``lease_margin`` and the lease was not renewed. ``None`` outside
        this attempt's handler (and for a Job made by hand)."""
        attempt = CURRENT_ATTEMPT.get()
        return None if attempt is None else attempt.lease_deadline(self)


def _instant(name: str, value: Any, job_id: str, expected: str) -> float:
    """A finite number >= 0 (seconds, or a UNIX timestamp), else ``ValidationError``
    naming the job."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{name} must be {expected}, got {type(value).__name__} (job {job_id!r})")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValidationError(f"{name} must be finite and >= 0, got {number!r} (job {job_id!r})")
    return number


def _attempt(job: Job[Any], what: str) -> _RunningAttempt:
    attempt = CURRENT_ATTEMPT.get()
    if attempt is None:
        raise TrioQueueError(f"{what} for job {job.id!r} called outside that job's (async) handler")
    return attempt


@dataclass(slots=True)
class ExecutionContext:
    """Passed to ``after_execution`` after the last attempt, before the terminal state is stored.

    The hook may change ``result``, ``error`` (set it to ``None`` to turn a failure into a
    success, or set one to fail a success) and ``ttl`` (seconds the result/error is cached).
    """

    job: Job[Any]
    result: Any
    error: JobError | None
    ttl: float


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """An event delivered to callbacks registered with :meth:`Queue.on`.

    ``name`` is one of :data:`EVENT_NAMES`; ``job_id`` is set for job events; ``data``
    carries event details (``error`` for ``error``/``failed``/``failing``, ``worker_id``...).
    A ``completed`` event carries the job's decoded ``result`` (``None`` if it is no
    longer stored; one the queue's ``result_serde`` cannot decode is ``None`` too, and
    ``result_error`` says why).
    """

    name: str
    queue: str
    job_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


# Two frozen dataclasses built once a job on the hot paths, by their slots directly: the
# generated ``__init__`` goes through ``object.__setattr__`` a field.
_new_object = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_EVENT_SLOTS = _slot_setters(QueueEvent, "name", "queue", "job_id", "data")
_RESULT_SLOTS = _slot_setters(EnqueueResult, "id", "status", "existing_state", "result")


def queue_event(name: str, queue: str, job_id: str | None, data: dict[str, Any]) -> QueueEvent:
    """``QueueEvent(name, queue, job_id, data)`` (once a job for a queue with a
    ``completed`` callback)."""
    event = _new_object(QueueEvent)
    set_name, set_queue, set_job_id, set_data = _EVENT_SLOTS
    set_name(event, name)
    set_queue(event, queue)
    set_job_id(event, job_id)
    set_data(event, data)
    return event


def queued_result(job_id: str) -> EnqueueResult:
    """``EnqueueResult(job_id, EnqueueStatus.QUEUED)`` (once a job of ``enqueue_many``)."""
    result = _new_object(EnqueueResult)
    set_id, set_status, set_state, set_result = _RESULT_SLOTS
    set_id(result, job_id)
    set_status(result, EnqueueStatus.QUEUED)
    set_state(result, None)
    set_result(result, None)
    return result


# The job events the storages publish that reach ``Queue.on`` as they are.
STORAGE_EVENT_NAMES = frozenset(
    {
        "enqueued",
        "completed",
        "failed",
        "failing",
        "requeued",
        "cancelled",
        "stalled",
        "promoted",
        "paused",
        "resumed",
        "removed",
        "rate_limited",
        "sleeping",
        "waiting_signal",
        "cleared",
    }
)
EVENT_NAMES = STORAGE_EVENT_NAMES | {
    "started",
    "stopped",
    "error",
    "leadership_acquired",
    "leadership_lost",
    "resync",
    "progress",
    "cancel_requested",
    "lease_lost",
}
