"""The Queue: its settings, lifecycle and the supervised consumer (the producer API and
request/response are in ``_producing.py``, the registry and administration in
``_registry.py``)."""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from itertools import count
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, overload

import trio

from .._model import _validate as check
from .._model._errors import TrioQueueError, ValidationError
from .._model._limits import RateLimit
from .._model._retry import ExponentialBackoff, RetryDelay
from .._model._serde import Serde
from .._model._types import Job
from ..storage._base import Storage
from ._emitter import Emitter, EventCallback
from ._execution import AfterExecution, Handler, RetryIf
from ._flows import JobMaker, remember_queue
from ._listener import Listener, level_for
from ._observers import QueueObserver
from ._producing import QueueProducer
from ._registry import QueueAdmin
from ._service import ServiceContext, sole_interrupt
from ._settings import JobDefaults, WorkerSettings
from ._waiters import Waiters
from ._worker import QueueParts, Worker

__all__ = ["Queue"]

logger = logging.getLogger("trioqueue")

P = TypeVar("P")
R = TypeVar("R")


_WORKER_ARGUMENTS = frozenset(inspect.signature(WorkerSettings.build).parameters) - {"storage", "batch"}

T = TypeVar("T")


class _Setting(Generic[T]):
    """A read-only attribute of a Queue, read from one of its settings objects (``holder``)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> T:
        return getattr(getattr(obj, self.holder), self.name)  # type: ignore[no-any-return]


class Queue(QueueProducer[P, R], JobMaker[P], QueueAdmin[P], Generic[P, R]):
    """A job queue on a :class:`~trioqueue.Storage`: producer, consumer, or both.

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
        worker_arguments = {k: v for k, v in arguments.items() if k in _WORKER_ARGUMENTS}
        # The one-object shorthand's Worker settings (validated now, used once a handler is set).
        self.worker_settings = WorkerSettings.build(storage, batch=batch_handler is not None, **worker_arguments)
        self.defaults = JobDefaults.build(max_attempts, result_ttl, payload_serde, result_serde)
        self._arguments = {k: v for k, v in arguments.items() if k not in _WORKER_ARGUMENTS}
        self._observers: list[QueueObserver] = []  # instruments (trioqueue.metrics)
        self._running = False
        self._events = Emitter(self.name)
        self._waiters = Waiters()
        # the storage subscription, opened by need
        self._listener = Listener(storage, self.name, self._events, self._waiters, self.defaults.result_serde)
        # Incarnation tokens: unique per enqueue (a random prefix per Queue, then a counter).
        self._token_prefix = uuid.uuid4().hex[:12] + "-"
        self._token_seq = count(1)
        self._stop_requested = trio.Event()
        self._service = ServiceContext(self.run, self.stop)
        self.parts = QueueParts(
            storage, self.name, self.defaults, self._events, self._listener, self._observers, self._subtree
        )
        """What a :class:`Worker` consuming this queue attaches to (for Workers, not applications)."""
        self._worker: Worker | None = None
        if handler is not None or batch_handler is not None:
            self.execute(handler or batch_handler)  # type: ignore[arg-type]
        remember_queue(self)  # its settings, for children other queues enqueue to it

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
            self._wake_waiters(stopped=True)

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
                self._wake_waiters(stopped=True)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.storage.aclose()

    def _wake_waiters(self, *, stopped: bool = False) -> None:
        self._waiters.wake_all(stopped=stopped)
        if stopped:
            for stream in self._events.streams:
                stream.close()  # readers of queue.events() end with the queue

    def _check_running(self) -> None:
        if not self._running:
            raise TrioQueueError(
                f"queue {self.name!r} is not running: use `async with queue:` or `await nursery.start(queue.run)`"
            )

    def __repr__(self) -> str:
        role = "consumer" if self._worker is not None else "producer"
        return f"<Queue {self.name!r} {role} worker_id={self.worker_id!r} storage={self.storage!r}>"
