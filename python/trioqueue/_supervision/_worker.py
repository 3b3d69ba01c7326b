"""The Worker: consumes one or several Queues (claims, runs handlers, settles), with the
reaper of each; the Queue is the producer and admin handle it attaches to.

A Worker builds, per queue it consumes, the parts that do the work and hands each what it
needs: the :class:`~._execution.Executor` (one attempt: handler, serdes, retry policy),
the :class:`~._consumer.Consumer` (claims, leases, settlements), the
:class:`~._pool.ProcessPool` (``executor="process"``) and the :class:`~._reaper.Reaper`;
from the Queue it takes only its :class:`QueueParts` (storage, name, job defaults, events,
subscription).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import trio

from .._model._clock import note_run
from .._model._errors import TrioQueueError, ValidationError
from .._model._limits import RateLimit
from .._model._retry import ExponentialBackoff, RetryDelay
from .._model._types import Job
from ..storage._base import FlowJob, Storage
from ._consumer import Consumer, ConsumerSettings
from ._emitter import Emitter, EventCallback
from ._execution import AfterExecution, Cancellations, ExecutionSettings, Executor, Handler, RetryIf
from ._listener import Listener
from ._observers import QueueObserver
from ._pool import ProcessPool, check_process_handler
from ._reaper import LeaderElection, Reaper
from ._service import ServiceContext, sole_interrupt
from ._settings import WORKER_ARGUMENTS, JobDefaults, WorkerSettings, check_storage

if TYPE_CHECKING:
    from ._queue import Queue

__all__ = ["QueueParts", "Worker"]

BatchHandler = Callable[[list[Job[Any]]], Any]


@dataclass(frozen=True, slots=True)
class QueueParts:
    """What a :class:`Worker` needs of a Queue it consumes (``Queue.parts``): where its
    jobs are (``storage``, ``name``), its ``defaults`` (serdes, result TTL), its
    ``events`` (callbacks and streams: the worker's events go there too), its
    ``listener`` (the storage subscription: the worker's consumer attaches to it), its
    ``observers`` (instruments: told of the worker's attempts) and ``subtree`` (how the
    queue makes the jobs of children added by a running job)."""

    storage: Storage
    name: str
    defaults: JobDefaults
    events: Emitter
    listener: Listener
    observers: list[QueueObserver]
    subtree: Callable[[str, str, Sequence[Any]], list[FlowJob]]


def _queues(queues: Any) -> tuple[Queue[Any, Any], ...]:
    found = tuple(queues) if isinstance(queues, list | tuple) else (queues,)
    if not found:
        raise ValidationError("a Worker needs at least one Queue")
    for queue in found:
        if not isinstance(getattr(queue, "parts", None), QueueParts):
            raise ValidationError(f"a Worker consumes trioqueue Queues, got {type(queue).__name__}")
    names = [(id(q.parts.storage), q.name) for q in found]
    if len(set(names)) < len(names):
        raise ValidationError("a Worker consumes each queue once: two of its Queues name the same queue")
    return found


class Worker:
    """Consumes the jobs of one Queue, or of several: claims them, runs ``handler`` (or
    ``batch_handler``) on ``concurrency`` tasks, and settles them; renews the leases of its
    claims with a heartbeat and runs the queue's :class:`~trioqueue.Reaper`
    (leader-elected: one per queue is active). The :class:`~trioqueue.Queue` stays the
    producer and admin handle (enqueue, status, cancel, schedules, events, pause...)::

        queue = Queue(storage, name="emails")            # producers need only this
        worker = Worker(queue, handler=send_email, concurrency=20)
        async with worker:                               # or: trioqueue worker myapp:worker
            ...

    ``async with worker:`` (or ``await nursery.start(worker.run)``) starts the Queues that
    are not running yet (and stops them after the worker), attaches to those that are
    (``async with queue, Worker(queue, handler=h):``: a process that enqueues and
    consumes), and reports started once every consumer claims jobs. On exit it stops
    gracefully: no new claims, prefetched jobs go back to the queue, running handlers
    finish, results are stored and the worker unregisters; cancelled instead (or a body
    that raised), running handlers are cancelled and their jobs go back to the queue.
    :meth:`stop` asks for a graceful stop. A Worker stops before the Queues it did not
    start.

    Several Queues: each is consumed with these settings (``concurrency`` handlers,
    ``prefetch``, a process pool of ``processes``, each per queue: not one budget
    shared by the queues), under one ``worker_id``; the handler gets jobs of every queue
    (``job`` does not say which: give each queue its own Worker when the handlers
    differ). Per queue because each queue's claims come from a claim call of its own,
    which waits (up to ``block_timeout``, woken by the queue's notices) for that queue's
    jobs: a budget shared by the queues would have to reserve its slots for each waiting
    call (an idle queue would keep them from a busy one) or claim more than it can run
    (jobs held, not running, that another worker could have taken). Per queue, a backlog
    on one queue never slows another. For a total over the queues, give each a share
    (``concurrency=total // len(queues)``); to bound the handler's own resources, share a
    :class:`trio.CapacityLimiter` between its calls (what waits for it is claimed).

    The settings are those of the one-object shorthand (``Queue(storage,
    handler=..., concurrency=...)``, see :class:`~trioqueue.Queue` for each): ``handler``
    or ``batch_handler`` (with ``batch_size``, ``batch_wait``), ``concurrency``,
    ``worker_id``, ``executor`` and ``processes``, ``prefetch``, ``block_timeout``,
    ``visibility_timeout`` and ``lease_margin``, ``job_timeout``, ``retry_delay`` and
    ``retry_if``, ``after_execution``, ``reaper``, the claim limits ``rate_limit``,
    ``global_concurrency``, ``group_concurrency`` and ``group_rate_limit``, and the
    retention counts ``keep_completed`` and ``keep_failed`` (applied as it settles). The
    job defaults (``max_attempts``, ``result_ttl``) and the serdes are the Queue's.

    Events (``lease_lost``, ``error``, ``stalled``, ``leadership_*``...) go to each
    Queue's callbacks and streams (:meth:`Queue.on`, :meth:`Queue.events`);
    :meth:`on` registers a callback on every Queue of the worker.
    """

    def __init__(
        self,
        queues: Queue[Any, Any] | Sequence[Queue[Any, Any]],
        *,
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        retry_delay: RetryDelay = ExponentialBackoff(),
        job_timeout: float | None = None,
        block_timeout: float = 5.0,
        visibility_timeout: float = 30.0,
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
        batch_size: int = 100,
        batch_wait: float = 0.05,
        keep_completed: int | None = None,
        keep_failed: int | None = None,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k in WORKER_ARGUMENTS}
        found = _queues(queues)
        if handler is not None and batch_handler is not None:
            raise ValidationError("give a Worker a handler or a batch_handler, not both")
        fn: Any = handler if handler is not None else batch_handler
        if fn is None:
            raise ValidationError("a Worker needs a handler (or a batch_handler)")
        settings = WorkerSettings.build(batch=batch_handler is not None, **arguments)
        self._setup(found, fn, settings)

    @classmethod
    def with_settings(
        cls, queues: Queue[Any, Any] | Sequence[Queue[Any, Any]], handler: Handler, settings: WorkerSettings
    ) -> Worker:
        """A Worker of ``queues`` from settings validated already (``handler`` is a batch
        handler when ``settings.batch`` is set): what the one-object shorthand
        ``Queue(storage, handler=...)`` builds."""
        worker = cls.__new__(cls)
        worker._setup(_queues(queues), handler, settings)
        return worker

    def _setup(self, queues: tuple[Queue[Any, Any], ...], handler: Handler, settings: WorkerSettings) -> None:
        if not callable(handler):
            raise ValidationError(f"handler must be callable, got {handler!r}")
        is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        )
        for queue in queues:
            defaults = queue.parts.defaults
            check_storage(queue.parts.storage, settings.group_rate_limit, settings.group_concurrency)
            if settings.executor == "process":
                check_process_handler(handler, is_async, defaults.payload_serde, defaults.result_serde)
        self.queues = queues
        self.settings = settings
        self.handler = handler
        self._handler_is_async = is_async
        self._running = False
        self._stop_requested = trio.Event()
        self._service = ServiceContext(self.run, self.stop)

    # -- configuration -----------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """This worker's id (its registration, its claims' owner), the same on every queue."""
        return self.settings.worker_id

    @property
    def concurrency(self) -> int:
        """How many handlers run at once (on each queue)."""
        return self.settings.concurrency

    def copy(self, **changes: Any) -> Worker:
        """A new (not running) Worker with this one's handler and settings, and
        ``changes`` (any constructor argument, ``queues`` included) applied; a new
        ``worker_id`` unless given. The worker CLI runs ``worker.copy(concurrency=8)``."""
        arguments = {**self.settings.arguments, "worker_id": None}
        if "handler" not in changes and "batch_handler" not in changes:
            arguments["batch_handler" if self.settings.batch is not None else "handler"] = self.handler
        queues = changes.pop("queues", self.queues)
        return Worker(queues, **{**arguments, **changes})

    def on(self, name: str, callback: EventCallback | None = None) -> Any:
        """:meth:`Queue.on` on every Queue of this worker (usable as a decorator): the
        worker's events (``lease_lost``, ``error``, ``stalled``...) go to its queues'
        callbacks, with the job events of those queues."""
        if callback is None:
            return lambda cb: self.on(name, cb)
        for queue in self.queues:
            queue.on(name, callback)
        return callback

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._service.enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        await self._service.exit(exc)
        return False

    def stop(self) -> None:
        """Ask a running worker to stop gracefully; :meth:`run` returns when it has."""
        self._stop_requested.set()

    @property
    def running(self) -> bool:
        return self._running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`stop` (graceful) or cancellation (forced). Reports started once
        every queue's consumer claims jobs (the Queues not running yet are started first,
        and stopped after the worker)."""
        note_run()  # (under a MockClock, the clock follows it: see _model._clock)
        if self._running:
            raise TrioQueueError(f"worker {self.worker_id!r} is already running")
        self._running = True
        self._stop_requested = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                started = []
                for queue in self.queues:
                    if not queue.running:
                        await nursery.start(queue.run)
                        started.append(queue)
                async with trio.open_nursery() as serving:
                    for queue in self.queues:
                        await serving.start(self._serve, queue.parts)
                    task_status.started()
                for queue in started:
                    queue.stop()
        except BaseExceptionGroup as group:
            bare = sole_interrupt(group)
            if bare is None:
                raise
            raise bare from None
        finally:
            self._running = False

    async def _serve(self, parts: QueueParts, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Consume one queue until the worker stops: its consumer (attached to the
        queue's subscription) and its reaper."""
        settings = self.settings
        async with self._open_pool(parts.defaults) as pool, trio.open_nursery() as nursery:
            consumer = self._new_consumer(parts, pool)
            reaper = None
            if settings.reaper:
                lease = settings.visibility_timeout
                reaper = Reaper(
                    parts.storage,
                    name=parts.name,
                    visibility_timeout=lease,
                    leader_election=LeaderElection(
                        lock_ttl=lease, renewal_interval=lease / 3, acquire_retry_interval=lease / 3
                    ),
                    _emitter=parts.events,
                    _observers=parts.observers,
                    _fed=True,  # the queue's notices feed it (listener.attach)
                )
            on_due = None if reaper is None else reaper.notice_due
            try:
                await parts.listener.attach(consumer, on_due)
                await nursery.start(consumer.run)
                if reaper is not None:
                    nursery.start_soon(reaper.run)
                task_status.started()
                await self._stop_requested.wait()
                await consumer.stop()
                nursery.cancel_scope.cancel()  # the reaper
            finally:
                parts.listener.detach(consumer, on_due)

    def _open_pool(self, defaults: JobDefaults) -> AbstractAsyncContextManager[ProcessPool | None]:
        """The process pool of a queue's consumer with ``executor="process"`` (closed
        after its handlers end), else nothing."""
        processes = self.settings.processes
        if processes is None:
            return nullcontext(None)
        return ProcessPool(processes, self.handler, defaults.payload_serde, defaults.result_serde).open()

    def _new_consumer(self, parts: QueueParts, pool: ProcessPool | None) -> Consumer:
        """The consumer of one queue, with its executor."""
        s = self.settings
        defaults = parts.defaults
        execution = ExecutionSettings(
            parts.name,
            s.worker_id,
            self.handler,
            self._handler_is_async,
            defaults.payload_serde,
            defaults.result_serde,
            defaults.result_ttl,
            s.job_timeout,
            s.retry_delay,
            s.retry_if,
            s.after_execution,
            pool,
            parts.subtree,
            s.keep_completed,
            s.keep_failed,
        )
        executor = Executor(execution, parts.storage, parts.events, parts.observers, Cancellations())
        consumer = ConsumerSettings(
            parts.name,
            s.worker_id,
            s.concurrency,
            s.prefetch,
            s.block_timeout,
            s.visibility_timeout,
            s.lease_margin,
            s.claim_limits,
            s.batch,
        )
        return Consumer(consumer, parts.storage, executor, parts.events, observed=bool(parts.observers))

    def __repr__(self) -> str:
        names = ", ".join(repr(q.name) for q in self.queues)
        return f"<Worker {self.worker_id!r} of {names} concurrency={self.concurrency}>"
