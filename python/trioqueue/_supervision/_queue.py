"""The Queue: its settings, lifecycle, ``enqueue`` and the supervised consumer (the rest of
the producer API and request/response are in ``_producing.py``, the registry and
administration in ``_registry.py``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, Unpack, overload

import trio

from .._model import _tracing
from .._model import _validate as check
from .._model._clock import note_run
from .._model._errors import TrioQueueError, ValidationError
from .._model._flows import JobRef
from .._model._limits import RateLimit
from .._model._options import EnqueueOptions
from .._model._retry import ExponentialBackoff, RetryDelay
from .._model._serde import Serde
from .._model._types import CancelResult, EnqueueResult, Job, JobPage, JobState, JobStatus, UpdateTTLStatus
from ..storage._base import Storage
from ._emitter import Emitter, EventCallback
from ._execution import AfterExecution, Handler, RetryIf
from ._flows import JobMaker, remember_queue
from ._listener import Listener, level_for
from ._observers import QueueObserver
from ._producing import QueueProducer
from ._registry import JobReader, QueueAdmin
from ._scheduler import Missed, Schedule
from ._service import ServiceContext, sole_interrupt
from ._streams import EventStream
from ._settings import WORKER_ARGUMENTS, JobDefaults, WorkerSettings
from ._waiters import Waiters
from ._worker import QueueParts, Worker

__all__ = ["Queue"]

logger = logging.getLogger("trioqueue")

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")


class _Setting(Generic[T]):
    """A read-only attribute of a Queue, read from one of its settings objects (``holder``)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | _Setting[T]:
        if obj is None:
            return self  # (the class's attribute: for introspection and the docs)
        return getattr(getattr(obj, self.holder), self.name)  # type: ignore[no-any-return]


class Queue(Generic[P, R]):
    """A job queue on a :class:`~trioqueue.Storage`: the producer and admin handle; given a
    ``handler`` (or ``batch_handler``), also its consumer.

    ``Queue(storage, name=...)`` enqueues and administers; a :class:`~trioqueue.Worker`
    (``Worker(queue, handler=...)``) consumes it, in this process or another.
    ``Queue(storage, name=..., handler=..., concurrency=...)`` is the one-object shorthand:
    the Queue builds a Worker from its consumer arguments (:attr:`worker`, with
    :attr:`worker_settings`) and runs it inside ``async with queue:``. Use the shorthand
    for small programs and tests, a Queue and a Worker where producers and workers are
    different processes (a web app enqueues, ``trioqueue worker`` consumes) or one worker
    consumes several queues. The consumer arguments below are the Worker's.

    ``async with Queue(...) as queue:`` opens the storage, subscribes to the queue's events
    (as far as needed: not at all for a pure producer, see :mod:`trioqueue._supervision._listener`)
    and, if a handler is set, starts ``concurrency`` consumers, their heartbeat, and a
    :class:`~trioqueue.Reaper` (leader-elected, so one per queue is active). On exit it
    stops gracefully: no new jobs are claimed, prefetched jobs go back to the queue, running
    handlers finish, results are stored, and the worker unregisters. If the enclosing cancel
    scope is cancelled instead, running handlers are cancelled and their jobs go back to
    the queue. ``await nursery.start(queue.run)`` does the same as a service; cancel the
    nursery for a forced stop or call :meth:`stop` for a graceful one.

    All durations are seconds. ``name`` isolates this queue's jobs within the storage.
    A worker renews the leases of its claims (``visibility_timeout``) with a heartbeat
    every fifth of it; a claim it could not renew is given up (its handler cancelled, a
    ``lease_lost`` event emitted) ``lease_margin`` seconds before its lease runs out
    (``None``: two heartbeat intervals, ``2 * visibility_timeout / 5``; it must be less
    than ``visibility_timeout`` minus one interval), and so is one the storage took away.
    A failed attempt is retried after ``retry_delay`` while attempts remain, unless the
    handler raised :class:`UnrecoverableError` or ``retry_if(exc)`` returned false (fail
    now); :class:`Retry` asks for a retry after its own delay.

    ``executor``: where a sync handler runs, ``"thread"`` (a worker thread) or
    ``"process"``: a pool of ``processes`` processes of its own (default: ``concurrency``),
    for CPU-bound handlers; ``concurrency`` (handlers at once) defaults to ``processes``
    when that is given, else to 1. A process handler needs ``trioqueue[process]`` (trio-parallel),
    must be a module-level function (it crosses by reference), with picklable serdes; the
    payload crosses as its stored bytes and the result as the bytes of the result serde;
    ``job_timeout``, ``cancel()``, a lost lease and a forced stop kill its process; it
    cannot report progress (:meth:`Job.report_progress` raises).

    ``batch_handler`` (instead of ``handler``): called with a list of up to ``batch_size``
    jobs (waiting at most ``batch_wait`` seconds to fill a batch), it returns one result
    per job, in order, or a :class:`BatchOutcome`; each job is settled on its own (see
    :mod:`trioqueue._supervision._batch`). ``concurrency`` batches run at once;
    ``prefetch`` defaults to one batch per worker.

    Retention: a finished job's result (or error) and record are kept ``result_ttl``
    seconds (``None``: for good, until purged, removed or cleared); ``keep_completed``
    / ``keep_failed`` (``None``: no limit) also keep only the newest N completed / failed
    jobs of the queue, whichever removes a job first. The count is applied by this
    queue's workers as they settle jobs: on memory and Redis in the settlement's atomic
    step (never more than N, whatever the rate), on PostgreSQL by the same call right
    after it commits, on files in batches (see :class:`~trioqueue.storage.FileStorage`).

    Groups (``enqueue(..., group="tenant-42")``): the ready jobs of one priority are
    claimed round-robin across their groups (jobs without a group form one group), so
    one group's backlog does not delay another's. ``group_concurrency``: at most that many
    jobs of one group run at once across every worker process, ``group_rate_limit``: at
    most that many start per window, per group (jobs without a group are limited by
    neither); :meth:`pause_group` stops claiming one group's jobs.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        name: str | None = None,
        handler: Handler | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        max_attempts: int = 3,  # (DEFAULT_MAX_ATTEMPTS, as result_ttl's is DEFAULT_RESULT_TTL)
        retry_delay: RetryDelay = ExponentialBackoff(),
        job_timeout: float | None = None,
        block_timeout: float = 5.0,
        visibility_timeout: float = 30.0,
        result_ttl: float | None = 3600.0,
        payload_serde: Serde | None = None,
        result_serde: Serde | None = None,
        after_execution: AfterExecution | None = None,
        prefetch: int | None = None,
        reaper: bool = True,
        retry_if: RetryIf | None = None,
        rate_limit: RateLimit | None = None,
        global_concurrency: int | None = None,
        group_concurrency: int | None = None,
        group_rate_limit: RateLimit | None = None,
        lease_margin: float | None = None,
        executor: Literal["thread", "process"] = "thread",
        processes: int | None = None,
        batch_handler: Callable[[list[Job[Any]]], Any] | None = None,
        batch_size: int = 100,
        batch_wait: float = 0.05,
        keep_completed: int | None = None,
        keep_failed: int | None = None,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if not isinstance(storage, Storage):
            raise ValidationError(f"storage must be a trioqueue Storage, got {type(storage).__name__}")
        self.storage = storage
        self.name = check.job_id(name, "name") if name is not None else "default"
        if handler is not None and batch_handler is not None:
            raise ValidationError("give a Queue a handler or a batch_handler, not both")
        worker_arguments = {k: v for k, v in arguments.items() if k in WORKER_ARGUMENTS}
        # The one-object shorthand's Worker settings (validated now, used once a handler is set).
        self.worker_settings = WorkerSettings.build(storage, batch=batch_handler is not None, **worker_arguments)
        self.defaults = JobDefaults.build(max_attempts, result_ttl, payload_serde, result_serde)
        self._arguments = {k: v for k, v in arguments.items() if k not in WORKER_ARGUMENTS}
        self._observers: list[QueueObserver] = []  # instruments (trioqueue.metrics)
        self._running = False
        self._events = Emitter(self.name)
        self._waiters = Waiters()
        # the storage subscription, opened by need
        self._listener = Listener(storage, self.name, self._events, self._waiters, self.defaults.result_serde)
        reader = JobReader(storage, self.name, self.defaults.result_serde)
        maker = JobMaker(storage, self.name, self.defaults, self._observers, reader)
        self._producer: QueueProducer[P, R] = QueueProducer(
            storage, self.name, maker, reader, self._listener, self._waiters, self._check_running
        )
        self._admin: QueueAdmin[P] = QueueAdmin(
            storage, self.name, self.defaults, reader, self._listener, self._events, maker.new_token, self._check_running
        )
        self._stop_requested = trio.Event()
        self._service = ServiceContext(self.run, self.stop)
        self.parts = QueueParts(
            storage, self.name, self.defaults, self._events, self._listener, self._observers, maker.subtree
        )
        """What a :class:`Worker` consuming this queue attaches to (for Workers, not applications)."""
        self._worker: Worker | None = None
        if handler is not None or batch_handler is not None:
            self.execute(handler or batch_handler)  # type: ignore[arg-type]
        remember_queue(maker)  # its job defaults, for children other queues enqueue to it

    # the job defaults, and the shorthand's worker settings, as attributes
    max_attempts = _Setting[int]("defaults")
    result_ttl = _Setting[float]("defaults")
    payload_serde = _Setting[Serde]("defaults")
    result_serde = _Setting[Serde]("defaults")
    worker_id = _Setting[str]("worker_settings")
    concurrency = _Setting[int]("worker_settings")
    executor = _Setting[Literal["thread", "process"]]("worker_settings")
    processes = _Setting[int | None]("worker_settings")
    prefetch = _Setting[int]("worker_settings")
    block_timeout = _Setting[float]("worker_settings")
    visibility_timeout = _Setting[float]("worker_settings")
    lease_margin = _Setting[float]("worker_settings")
    job_timeout = _Setting[float | None]("worker_settings")
    keep_completed = _Setting[int | None]("worker_settings")
    keep_failed = _Setting[int | None]("worker_settings")
    rate_limit = _Setting[RateLimit | None]("worker_settings")
    global_concurrency = _Setting[int | None]("worker_settings")
    group_concurrency = _Setting[int | None]("worker_settings")
    group_rate_limit = _Setting[RateLimit | None]("worker_settings")

    @property
    def worker(self) -> Worker | None:
        """The Worker of the one-object shorthand (a Queue given a handler), run by the
        queue itself; ``None`` for a producer."""
        return self._worker

    # -- configuration -----------------------------------------------------------------

    def copy(self, **changes: Any) -> Queue[P, R]:
        """A new (not running) Queue with this one's settings, handler and ``on()``
        callbacks, and ``changes`` (any constructor argument) applied; e.g. the worker CLI
        runs ``queue.copy(storage=from_url(url), concurrency=8)``."""
        settings = {**self._arguments, **self.worker_settings.arguments}
        worker = self._worker
        if worker is not None:
            settings["batch_handler" if self.worker_settings.batch is not None else "handler"] = worker.handler
        settings = {**settings, **changes}
        if "worker_id" not in changes:
            settings["worker_id"] = None  # a new worker: a new id
        new: Queue[P, R] = Queue(**settings)
        for name, callbacks in self._events.callbacks().items():
            for callback in callbacks:
                new.on(name, callback)
        for observer in self._observers:
            new.add_observer(observer)
            observer.copied(new)
        return new

    def add_observer(self, observer: QueueObserver) -> None:
        """Tell ``observer`` (an instrument, such as :class:`trioqueue.metrics.QueueMetrics`)
        what this queue does from now on: the jobs it enqueues, the attempts its worker
        starts and settles, the stalled jobs its reaper recovers (see
        :class:`~trioqueue.metrics.QueueObserver`). Added before the queue starts; once."""
        if self._running:
            raise TrioQueueError("add observers before the queue starts")
        if observer not in self._observers:
            self._observers.append(observer)

    @overload
    def execute(self, fn: None = None) -> Callable[[Handler], Handler]: ...
    @overload
    def execute(self, fn: Handler) -> Handler: ...

    def execute(self, fn: Handler | None = None) -> Handler | Callable[[Handler], Handler]:
        """Register the job handler; usable as ``@queue.execute``. An ``async def`` handler
        runs in the queue's nursery; a plain function runs in a worker thread (it cannot be
        interrupted, so a ``job_timeout`` only abandons it), or with ``executor="process"``
        in a pool process (a picklable module-level function; a ``job_timeout`` kills it)."""
        if fn is None:
            return self.execute
        if not callable(fn):
            raise ValidationError(f"handler must be callable, got {fn!r}")
        if self._running:
            raise TrioQueueError("set the handler before the queue starts")
        self._worker = Worker.with_settings(self, fn, self.worker_settings)
        return fn

    def on(self, name: str, callback: EventCallback | None = None) -> Any:
        """Call ``callback(event)`` (sync or async) for each event ``name``; usable as a
        decorator. Names: ``started``, ``stopped``, ``error``, ``enqueued``, ``completed``
        (``data["result"]``: the decoded result), ``failed``, ``failing`` (``data["error"]``:
        the :class:`JobError`), ``requeued``, ``cancelled``, ``cleared``, ``stalled``,
        ``leadership_acquired``, ``leadership_lost``, ``resync``, ``lease_lost`` (this
        worker gave up a claim: ``data`` has ``worker_id`` and ``why``, one of
        ``recovered``, ``cancelled``, ``fenced`` or ``expired``; see :data:`EVENT_NAMES`). Job events come from the
        storage's event stream, so a producer also sees completions done by other workers.
        ``resync`` (no job id) says the stream may have lost events (a reconnect, a log
        rotation): a subscriber tracking jobs re-reads their status (``get_status``);
        waiters of ``enqueue_and_wait`` do so by themselves.

        Events are routed by need: the queue subscribes to the storage's events only as
        far as its callbacks, streams, waiters and consumer need (none for a pure
        producer; the terminal notices alone for ``completed``/``failed``/``cancelled``/
        ``removed``/``cancel_requested``; everything for the others). Registered while
        the queue runs, a callback that needs a wider subscription gets events from once
        it is live (after a ``resync``). ``error`` and ``resync`` callbacks subscribe to
        nothing by themselves: the storage's own errors (a fenced settlement, a
        quarantined file) reach a queue that subscribes for another reason (a worker, a
        waiter, another callback)."""
        if callback is None:
            return lambda cb: self.on(name, cb)
        registered = self._events.on(name, callback)
        if self._running:
            self._listener.want(level_for((name,)))
        return registered

    # -- producing (the QueueProducer's) ----------------------------------------------

    async def enqueue(
        self,
        job_id: str,
        payload: P,
        *,
        transaction: object | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Add a job unless its id is known: returns ``queued``, ``duplicate`` (the id is
        queued/processing/failing/delayed, or failed and still cached) or ``completed``
        with the cached result. ``options`` (:class:`~trioqueue.EnqueueOptions`), each
        overriding the queue's setting, fixed by the first accepted enqueue:
        ``max_attempts``, ``result_ttl``, ``retry_delay`` (a fixed delay),
        ``job_timeout``; ``delay`` (seconds from now) or ``at`` (a timezone-aware
        ``datetime`` or a UNIX timestamp) makes the job ``delayed`` until then;
        ``priority`` (0..9, default :data:`DEFAULT_PRIORITY` 5): lower runs first, FIFO
        within a priority; the job keeps it through retries and recoveries.
        ``transaction`` (PostgresStorage: ``async with storage.transaction() as tx``)
        writes the job in the application's transaction: it exists only if that commits.
        Raises :class:`ValidationError` (writing nothing) on bad input, ``TypeError`` for
        an unknown option.

        ``children`` (a list of :class:`~trioqueue.Child`, trees of any depth) makes it
        the parent of a tree, written atomically (every job or none: a child id that
        exists raises :class:`~trioqueue.FlowError`): it waits in ``waiting_children``
        until every child is terminal, then runs. ``on_child_failure``: ``"cancel"``
        (default) fails it with :class:`~trioqueue.ChildJobFailedError` and cancels the
        other children as soon as one fails for good, ``"continue"`` runs it anyway
        (:meth:`Job.children_failures`), ``"ignore"`` counts failed children as done.

        ``depends_on`` (a list of ids of this queue and :class:`~trioqueue.JobRef` of any
        queue of the storage) makes it wait, in ``waiting_children`` too, until every
        named job is terminal: jobs that exist already (in any state; one terminal counts
        at once; an unknown id raises :class:`~trioqueue.FlowError`, writing nothing),
        which it does not own. Their outcomes count as its children's do (the same
        ``on_child_failure``, ``children_results()``); its end never cancels them. Many
        jobs may depend on one; a dependency's record is kept until they have ended."""
        # The producer's parts, used here rather than through a QueueProducer method: a
        # call and a coroutine less on the path of every awaited enqueue.
        maker = self._producer.maker
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = maker.new_job(job_id, payload, options, trace)
        tree = maker.tree(new, options, trace) if options else None
        self._check_running()
        listener = self._listener
        if listener.pending > listener.level:  # (caught_up()'s test, inline: no coroutine a job)
            await listener.caught_up()
        if transaction is None:
            return maker.enqueue_result(new.id, await maker.store(new, tree, options))
        [outcome] = await maker.store_in(transaction, [new], options, tree)
        return maker.enqueue_result(new.id, outcome)

    async def enqueue_many(
        self,
        jobs: Iterable[tuple[str, P]],
        *,
        transaction: object | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """Enqueue ``(id, payload)`` pairs in one storage call (each job atomically, in
        order), with the options of :meth:`enqueue` for all of them (``transaction``
        too). Everything is validated first: one bad job means nothing is written."""
        return await self._producer.enqueue_many(jobs, transaction=transaction, **options)

    async def enqueue_and_wait(
        self,
        job_id: str,
        payload: P,
        *,
        timeout: float = 30.0,
        **options: Unpack[EnqueueOptions],
    ) -> R:
        """Enqueue (or join an in-flight job with the same id) and return its result.

        Raises :class:`JobTimeoutError` after ``timeout`` seconds (the job keeps going),
        :class:`JobFailedError` if it failed for good, :class:`JobCancelledError` if it is
        cancelled meanwhile, :class:`QueueStoppedError` at once if the queue stops. A
        completed id returns its cached result at once. Driven by the storage's event
        stream (the wait is registered before enqueueing), never by polling; only the
        outcome of the incarnation this call enqueued or joined counts (a job cancelled and
        enqueued again under the same id is another incarnation). An enclosing cancel scope
        cancels the wait, not the job.
        """
        return await self._producer.enqueue_and_wait(job_id, payload, timeout=timeout, **options)

    # -- registry and administration (the QueueAdmin's) --------------------------------

    async def children(self, job_id: str) -> dict[JobRef, JobStatus]:
        """The children of a job (a tree's parent, or a job that added children while it
        ran), ``{JobRef(queue, id): status}`` in the order they were added, then its
        dependencies (``depends_on``) in the order given; results are decoded by this
        queue's result serde. ``{}`` for a job without either."""
        return await self._admin.children(job_id)

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel a job: a queued, delayed or failing (waiting for its retry) one will never
        run; a running one has its handler cancelled by its worker (wherever it runs; the
        handler may shield cleanup as Trio allows) and is not retried. Its state becomes
        ``cancelled`` for its result TTL (enqueueing the id again starts a new incarnation)
        and its waiters get :class:`JobCancelledError`; a running job that finishes before
        the request reaches it keeps its outcome. Finished jobs are not touched: the status
        says why."""
        return await self._admin.cancel(job_id)

    async def signal(self, job_id: str, name: str, payload: Any = None) -> Literal["delivered", "not_found"]:
        """Send a message (``payload``: JSON-serializable, ``None`` by default) on ``name``
        to the job ``job_id``, for :meth:`Job.wait_for_signal`: ``"delivered"`` when the
        job is known and not terminal (a message sent before it waits is kept for it; a
        job waiting for it is queued again at once, on every worker's storage), else
        ``"not_found"`` (nothing is kept). One atomic step in the storage. A payload that
        does not serialize raises :class:`ValidationError` naming the job, sending nothing."""
        return await self._admin.signal(job_id, name, payload)  # type: ignore[return-value]

    async def schedule(
        self,
        name: str,
        payload: P | None = None,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        missed: Missed = "run_once",
        max_attempts: int | None = None,
        result_ttl: float | None = None,
    ) -> Schedule:
        """Create or update the schedule ``name``: a job with ``payload`` is enqueued on
        every tick of ``cron`` (evaluated in the IANA timezone ``tz``) or every ``every``
        seconds (the first tick at its first registration), with the id ``<name>@<tick in UTC>``
        (``nightly@2026-11-23T03:00:00Z``), so a tick never runs twice. Schedules live in
        the storage; the queue's active reaper (one per queue) enqueues the ticks.
        ``missed``: ticks that passed while no reaper ran (found more than 60 s late) are
        run once (``run_once``, the latest of them) or skipped (``skip``); later ones
        found within 60 s each run.

        Registering is idempotent, so a worker may declare its schedules at every
        start-up: an unchanged schedule is not written at all, and a changed one keeps its
        tick grid (the first registration's time, :attr:`Schedule.created_at`) and its
        last tick (no tick runs twice, and none that was due is dropped, because of an
        edit). Concurrent registrations agree on one grid (a compare-and-set). Returns the
        schedule as stored."""
        return await self._admin.schedule(name, payload, cron=cron, every=every, tz=tz, missed=missed, max_attempts=max_attempts, result_ttl=result_ttl)

    async def schedules(self) -> list[Schedule]:
        """The queue's schedules, a list sorted by name (each with its ``name``, ``cron`` or
        ``every``, ``tz``, ``missed``, ``last_tick``...)."""
        return await self._admin.schedules()

    async def unschedule(self, name: str) -> bool:
        """Remove a schedule (jobs already enqueued stay); False if there was none."""
        return await self._admin.unschedule(name)

    def events(
        self, *kinds: str, job_ids: Collection[str] | None = None, buffer: int = 1000
    ) -> AbstractAsyncContextManager[EventStream]:
        """``async with queue.events("completed", "failed") as stream: async for event in
        stream:`` — the queue's events (every name :meth:`on` accepts; all when no names
        are given), optionally only those of ``job_ids``. At most ``buffer`` events wait for
        a slow reader; beyond that they are dropped and counted (``stream.dropped``) and
        the reader gets one ``resync`` event marking the gap."""
        return self._admin.events(*kinds, job_ids=job_ids, buffer=buffer)

    def watch(self, job_id: str) -> AsyncIterator[JobStatus | None]:
        """``async for status in queue.watch(id):`` the job's status, again on each change
        of state or progress, until it is terminal (or unknown: ``None``)."""
        return self._admin.watch(job_id)

    async def pause(self) -> bool:
        """Stop every worker of this queue (in every process) from claiming and starting
        jobs; running jobs finish. Jobs that workers had prefetched go back to the queue:
        none starts once this returns (a job whose attempt was counted before, at its
        claim, is running). Stored in the storage; returns False if it was already
        paused."""
        return await self._admin.pause()

    async def resume(self) -> bool:
        """Let workers claim again (waiting ones wake at once); False if it was not paused."""
        return await self._admin.resume()

    async def is_paused(self) -> bool:
        """Whether claiming on this queue is paused."""
        return await self._admin.is_paused()

    async def pause_group(self, group: str) -> bool:
        """Stop every worker of this queue from claiming the jobs of ``group`` (other
        groups' jobs are claimed as before; running jobs finish). Stored in the storage;
        returns False if the group was already paused."""
        return await self._admin.pause_group(group)

    async def resume_group(self, group: str) -> bool:
        """Let workers claim the jobs of ``group`` again (waiting ones wake at once);
        False if it was not paused."""
        return await self._admin.resume_group(group)

    async def paused_groups(self) -> list[str]:
        """The groups of this queue whose claiming is paused (sorted)."""
        return await self._admin.paused_groups()

    async def group_counts(self) -> dict[str, dict[str, int]]:
        """How many jobs of each group are ``queued`` and ``processing`` (groups with
        any; the jobs without a group under ``""``): ``{group: {"queued": n,
        "processing": n}}``. For inspection (``trioqueue stats --group``): it may scan the
        queue's active jobs."""
        return await self._admin.group_counts()

    async def get_status(self, job_id: str) -> JobStatus | None:
        """The job's registry entry, or ``None`` if the id is unknown (or expired); a
        child names its :attr:`~JobStatus.parent`, a parent has its children's counts by
        state (:attr:`~JobStatus.children`), and its stored steps are in
        :attr:`~JobStatus.steps` (a second read, on a storage with steps)."""
        return await self._admin.get_status(job_id)

    async def get_statuses(self, job_ids: Iterable[str]) -> list[JobStatus | None]:
        """The statuses of many jobs at once, in the order of ``job_ids`` (``None`` for an
        unknown or expired id, as :meth:`get_status`): one storage call, one round trip
        to the server (Redis: one script, a queue's keys sharing one Cluster slot;
        PostgreSQL: one query), plus one per job that is a parent of a tree (its
        children's counts). A bad id raises :class:`ValidationError` naming it, before
        anything is read."""
        return await self._admin.get_statuses(job_ids)

    async def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (every :class:`JobState`, zeros included)."""
        return await self._admin.counts()

    async def list_jobs(self, state: JobState | str, *, limit: int = 100, cursor: str | None = None) -> JobPage:
        """A page of the jobs in ``state``, newest first (by when they entered it): pass
        the returned ``cursor`` back for the next page (``None`` after the last). Paging
        is stable while jobs come and go; memory is bounded by ``limit``."""
        return await self._admin.list_jobs(state, limit=limit, cursor=cursor)

    async def retry(self, job_id: str, *, reset_steps: bool = False) -> bool:
        """Run a ``failed`` (or ``cancelled``) job again: it is enqueued anew with its
        original payload and its attempts reset. False if it is not failed/cancelled.
        Its stored steps (:meth:`Job.step`) are kept, so it resumes after the last step
        that succeeded; ``reset_steps=True`` forgets them: it starts over."""
        return await self._admin.retry(job_id, reset_steps=reset_steps)

    async def purge(self, state: JobState | str, *, older_than: float | None = None) -> int:
        """Forget the ``completed``, ``failed`` or ``cancelled`` jobs that entered that
        state more than ``older_than`` seconds ago (all when ``None``); returns how many.
        A child or dependency kept for a parent or dependent that still waits is spared
        (it goes by its TTL once they have ended)."""
        return await self._admin.purge(state, older_than=older_than)

    async def remove(self, job_id: str) -> bool:
        """Forget a job that is not running (a queued, delayed or failing one never runs);
        False if it is unknown or running."""
        return await self._admin.remove(job_id)

    async def clear(self, *, schedules: bool = False) -> int:
        """Empty the queue's storage entirely: every job in every state (queued, delayed,
        running, waiting for a retry or for children, finished) with its results, errors
        and progress, and the rate limits' state (the groups' too: their claimed slots and
        ``group_rate_limit`` windows), is forgotten at once; the schedules are kept unless
        ``schedules`` is true (the pause flag, the paused groups and the worker registry
        always are). Returns how many jobs were forgotten. A worker running one of the jobs does
        not crash: its outcome is refused (fenced, an ``error`` event) and its heartbeat
        gives the claim up (``lease_lost``); waiters of ``enqueue_and_wait`` get
        :class:`JobCancelledError`; every subscriber gets a ``cleared`` event. Parents and
        dependents on other queues count the jobs cleared as :meth:`remove` has them count a
        removed one: an unfinished job as cancelled (their ``on_child_failure`` applies), a
        completed one as completed."""
        return await self._admin.clear(schedules=schedules)

    async def get_result(self, job_id: str) -> Any:
        """The cached result of a completed job. Raises :class:`JobFailedError` for a failed
        one, :class:`JobCancelledError` for a cancelled one and :class:`JobNotFinishedError`
        for an unknown or unfinished one."""
        return await self._admin.get_result(job_id)

    async def update_result_ttl(self, job_id: str, ttl: float) -> UpdateTTLStatus:
        """Keep a finished job's result (or error) for ``ttl`` more seconds from now."""
        return await self._admin.update_result_ttl(job_id, ttl)

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._service.enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        await self._service.exit(exc)  # the body's own exception propagates as it is
        return False

    def stop(self) -> None:
        """Ask a running queue to stop gracefully; :meth:`run` returns when it has."""
        self._stop_requested.set()

    @property
    def running(self) -> bool:
        return self._running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the queue until :meth:`stop` (graceful) or cancellation (forced).

        Reports started once the storage is open, the event subscription is live and the
        consumers (if any) are claiming jobs.
        """
        note_run()  # (under a MockClock, the clock follows it: see _model._clock)
        if self._running:
            raise TrioQueueError(f"queue {self.name!r} is already running")
        self._running = True
        self._stop_requested = trio.Event()
        try:
            await self._run(task_status)
        except BaseExceptionGroup as group:
            bare = sole_interrupt(group)
            if bare is None:
                raise
            raise bare from None
        finally:
            self._running = False
            self._wake_waiters()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        await self.storage.open()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.storage.watchdog)
                await nursery.start(self._events.run)
                await nursery.start(self._listener.run)
                worker = self._worker
                async with trio.open_nursery() as serving:
                    if worker is not None:
                        await serving.start(worker.run)  # attaches to this running queue
                    self._events.emit("started", worker_id=self.worker_id)
                    task_status.started()
                    await self._stop_requested.wait()
                    if worker is not None:
                        worker.stop()  # graceful: returns once its jobs are settled
                self._events.emit("stopped", worker_id=self.worker_id)
                self._events.close()
                self._wake_waiters()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.storage.aclose()

    def _wake_waiters(self) -> None:
        """The queue stopped: its waiters get :class:`QueueStoppedError`, and readers of
        ``queue.events()`` end with it."""
        self._waiters.wake_all(stopped=True)
        for stream in self._events.streams:
            stream.close()

    def _check_running(self) -> None:
        if not self._running:
            raise TrioQueueError(
                f"queue {self.name!r} is not running: use `async with queue:` or `await nursery.start(queue.run)`"
            )

    def __repr__(self) -> str:
        role = "consumer" if self._worker is not None else "producer"
        return f"<Queue {self.name!r} {role} worker_id={self.worker_id!r} storage={self.storage!r}>"
