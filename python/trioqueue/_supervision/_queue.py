"""The Queue: its settings, lifecycle and the supervised consumer (the producer API and
request/response are in ``_producing.py``, the registry and administration in
``_registry.py``)."""

from __future__ import annotations

import inspect
import logging
import os
import socket
import uuid
from itertools import count
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, overload

import trio

from .._model import _validate as check
from ._batch import BatchSettings, batch_settings
from ._consumer import Consumer, ConsumerSettings, claim_limits
from .._model._errors import (
    TrioQueueError,
    ValidationError,
)
from ._emitter import Emitter, EventCallback
from ._listener import Listener, level_for
from .._model._limits import RateLimit
from ._flows import JobMaker, remember_queue
from ._producing import QueueProducer
from ._registry import QueueAdmin
from ._waiters import Waiters
from ._leases import lease_margin as resolve_lease_margin
from ._execution import (
    AfterExecution,
    Cancellations,
    ExecutionSettings,
    Executor,
    Handler,
    RetryIf,
    check_retry_if,
    only_cancelled,
)
from .._model._types import Job
from ._observers import QueueObserver
from ._pool import ProcessPool, check_executor, check_process_handler
from ._reaper import LeaderElection, Reaper
from .._model._retry import ExponentialBackoff, RetryDelay, retry_policy
from .._model._serde import JsonSerde, Serde
from .._model._types import FOREVER_TTL
from ..storage._base import Storage
from ..storage._capabilities import Groups, require

__all__ = ["Queue"]

logger = logging.getLogger("trioqueue")

P = TypeVar("P")
R = TypeVar("R")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _sole_interrupt(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The ``KeyboardInterrupt``/``SystemExit`` a group carries, when it carries nothing
    else but cancellations: it is raised bare, as the interpreter expects."""
    interrupts, rest = group.split((KeyboardInterrupt, SystemExit))
    if interrupts is None or (rest is not None and not only_cancelled(rest)):
        return None
    found: BaseException = interrupts
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


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
        self._settings = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if not isinstance(storage, Storage):
            raise ValidationError(f"storage must be a trioqueue Storage, got {type(storage).__name__}")
        self.storage = storage
        self.name = check.job_id(name, "name") if name is not None else "default"
        processes = check_executor(executor, processes)
        # (default: 1, or the pool's size when one is given: each handler needs a process)
        self.concurrency = check.positive_int("concurrency", concurrency if concurrency is not None else processes or 1)
        self.executor = executor
        # the size of the process pool (executor="process"), else None
        self.processes = None if executor == "thread" else processes or self.concurrency
        self.worker_id = check.job_id(worker_id, "worker_id") if worker_id is not None else default_worker_id()
        self.max_attempts = check.positive_int("max_attempts", max_attempts)
        self.job_timeout = None if job_timeout is None else check.seconds("job_timeout", job_timeout)
        self.block_timeout = check.seconds("block_timeout", block_timeout)
        self.visibility_timeout = check.seconds("visibility_timeout", visibility_timeout)
        # A claim this worker could not renew is given up this long before its lease runs out.
        self.lease_margin = resolve_lease_margin(lease_margin, self.visibility_timeout)
        self.result_ttl = FOREVER_TTL if result_ttl is None else check.seconds("result_ttl", result_ttl)
        # Count-based retention, beside the TTL (Settlement.keep): None, no limit.
        self.keep_completed = check.keep_count("keep_completed", keep_completed)
        self.keep_failed = check.keep_count("keep_failed", keep_failed)
        self._batch: BatchSettings | None = None
        if batch_handler is not None:
            if handler is not None:
                raise ValidationError("give a Queue a handler or a batch_handler, not both")
            self._batch = batch_settings(batch_size, batch_wait, executor)
        per_worker = 1 if self._batch is None else self._batch.size
        self.prefetch = per_worker * self.concurrency if prefetch is None else check.positive_int("prefetch", prefetch)
        # Queue-wide flow control, enforced by the storage at claim time (see ClaimLimits);
        # a flow-limited queue claims only for idle workers (no prefetch): its claims start
        # at once and hold no slot or token a worker is not using.
        self.rate_limit = rate_limit
        self.global_concurrency = global_concurrency
        self.group_concurrency, self.group_rate_limit = group_concurrency, group_rate_limit
        if group_rate_limit is not None:
            require(storage, Groups, "group_rate_limit")
        if group_concurrency is not None:
            require(storage, Groups, "group_concurrency")
        self._claim_limits = claim_limits(rate_limit, global_concurrency, group_concurrency, group_rate_limit)
        if self._claim_limits is not None:
            if prefetch is not None:
                raise ValidationError("prefetch cannot be combined with rate_limit, global_concurrency or group limits")
            self.prefetch = 0
        self._retry_delay = retry_policy(retry_delay)
        self.payload_serde: Serde = payload_serde or JsonSerde()
        self.result_serde: Serde = result_serde or self.payload_serde
        for what, serde in (("payload_serde", self.payload_serde), ("result_serde", self.result_serde)):
            if not (callable(getattr(serde, "dumps", None)) and callable(getattr(serde, "loads", None))):
                raise ValidationError(f"{what} must have dumps(value) -> bytes and loads(bytes) methods")
        self._after_execution = after_execution
        self._retry_if = check_retry_if(retry_if)
        self._observers: list[QueueObserver] = []  # instruments (trioqueue.metrics)
        self._running = False
        self._handler: Handler | None = None
        self._handler_is_async = True
        if handler is not None or batch_handler is not None:
            self.execute(handler or batch_handler)  # type: ignore[arg-type]
        self._use_reaper = reaper
        self._events = Emitter(self.name)
        self._waiters = Waiters()
        # the storage subscription, opened by need
        self._listener = Listener(storage, self.name, self.worker_id, self._events, self._waiters, self.result_serde)
        # Incarnation tokens: unique per enqueue (a random prefix per Queue, then a counter).
        self._token_prefix = uuid.uuid4().hex[:12] + "-"
        self._token_seq = count(1)
        self._stop_requested = trio.Event()
        self._consumer: Consumer | None = None
        self._cm_nursery: trio.Nursery | None = None
        self._cm: Any = None
        remember_queue(self)  # its settings, for children other queues enqueue to it

    # -- configuration -----------------------------------------------------------------

    def copy(self, **changes: Any) -> Queue[P, R]:
        """A new (not running) Queue with this one's settings, handler and ``on()``
        callbacks, and ``changes`` (any constructor argument) applied; e.g. the worker CLI
        runs ``queue.copy(storage=from_url(url), concurrency=8)``."""
        own = {"handler": self._handler} if self._batch is None else {}
        settings = {**self._settings, **own, **changes}
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
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        if self.executor == "process":
            check_process_handler(fn, is_async, self.payload_serde, self.result_serde)
        self._handler, self._handler_is_async = fn, is_async
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
        self._cm = trio.open_nursery()
        nursery = await self._cm.__aenter__()
        try:
            await nursery.start(self.run)
        except BaseException:
            # ``run`` failed before it started: nothing runs in the nursery; close it
            # without wrapping the error in an ExceptionGroup.
            await self._cm.__aexit__(None, None, None)
            raise
        self._cm_nursery = nursery
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        cm, nursery, self._cm, self._cm_nursery = self._cm, self._cm_nursery, None, None
        if exc is None:
            self.stop()  # graceful
        elif nursery is not None and not isinstance(exc, trio.Cancelled):
            nursery.cancel_scope.cancel()  # the body failed: forced stop, jobs go back
        # The body's own exception propagates as it is, not wrapped in an ExceptionGroup.
        await cm.__aexit__(None, None, None)
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
            bare = _sole_interrupt(group)
            if bare is None:
                raise
            raise bare from None
        finally:
            self._running = False
            self._consumer = self._listener.consumer = self._listener.on_due = None
            self._wake_waiters(stopped=True)

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        await self.storage.open()
        try:
            async with self._open_pool() as pool, trio.open_nursery() as nursery:
                nursery.start_soon(self.storage.watchdog)
                await nursery.start(self._events.run)
                self._listener.consumes = self._handler is not None
                await nursery.start(self._listener.run)
                consumer = None
                if self._handler is not None:
                    consumer = self._consumer = self._listener.consumer = self._new_consumer(self._handler, pool)
                    await nursery.start(consumer.run)
                    if self._use_reaper:
                        reaper = Reaper(
                            self.storage,
                            name=self.name,
                            visibility_timeout=self.visibility_timeout,
                            leader_election=LeaderElection(
                                lock_ttl=self.visibility_timeout,
                                renewal_interval=self.visibility_timeout / 3,
                                acquire_retry_interval=self.visibility_timeout / 3,
                            ),
                            _emitter=self._events,
                            _observers=self._observers,
                            _fed=True,
                        )
                        self._listener.on_due = reaper.notice_due  # the queue's notices feed it
                        nursery.start_soon(reaper.run)
                self._events.emit("started", worker_id=self.worker_id)
                task_status.started()
                await self._stop_requested.wait()
                if consumer is not None:
                    await consumer.stop()
                self._events.emit("stopped", worker_id=self.worker_id)
                self._events.close()
                self._wake_waiters(stopped=True)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.storage.aclose()

    def _open_pool(self) -> AbstractAsyncContextManager[ProcessPool | None]:
        """The process pool of a running consumer with ``executor="process"`` (closed
        after its handlers end), else nothing."""
        if self.processes is None or self._handler is None:
            return nullcontext(None)
        return ProcessPool(self.processes, self._handler, self.payload_serde, self.result_serde).open()

    def _new_consumer(self, handler: Handler, pool: ProcessPool | None) -> Consumer:
        """The worker of a queue with a handler, with its executor."""
        execution = ExecutionSettings(
            self.name,
            self.worker_id,
            handler,
            self._handler_is_async,
            self.payload_serde,
            self.result_serde,
            self.result_ttl,
            self.job_timeout,
            self._retry_delay,
            self._retry_if,
            self._after_execution,
            pool,
            self._subtree,
            self.keep_completed,
            self.keep_failed,
        )
        executor = Executor(execution, self.storage, self._events, self._observers, Cancellations())
        settings = ConsumerSettings(
            self.name,
            self.worker_id,
            self.concurrency,
            self.prefetch,
            self.block_timeout,
            self.visibility_timeout,
            self._claim_limits,
            self.lease_margin,
            self._batch,
        )
        return Consumer(settings, self.storage, executor, self._events, observed=bool(self._observers))

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
        role = "consumer" if self._handler is not None else "producer"
        return f"<Queue {self.name!r} {role} worker_id={self.worker_id!r} storage={self.storage!r}>"
