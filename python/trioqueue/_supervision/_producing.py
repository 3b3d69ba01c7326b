"""The Queue's producer API and request/response: ``enqueue``, ``enqueue_many`` and
``enqueue_and_wait``. A mixin of :class:`~trioqueue.Queue` (kept apart to keep each
module small)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack
from collections.abc import Iterable

import trio

from .._model import _tracing
from .._model import _validate as check
from .._model._errors import JobCancelledError, JobTimeoutError, QueueStoppedError, TrioQueueError
from .._model._options import EnqueueOptions
from .._model._types import EnqueueResult, EnqueueStatus
from ..storage._base import EnqueueOutcome, FlowJob, NewJob, Storage, StorageEvent
from ._listener import NOTICES
from ._waiters import terminal_from_record

if TYPE_CHECKING:
    from ._listener import Listener
    from ._waiters import Waiters

__all__ = ["QueueProducer"]

P = TypeVar("P")
R = TypeVar("R")


class QueueProducer(Generic[P, R]):
    """A part of :class:`~trioqueue.Queue` (which sets these attributes)."""

    storage: Storage
    name: str
    _listener: Listener
    _waiters: Waiters

    if TYPE_CHECKING:  # provided by the Queue, JobMaker and QueueAdmin

        def _check_running(self) -> None: ...

        def _new_job(
            self,
            job_id: Any,
            payload: Any,
            options: EnqueueOptions,
            trace: dict[str, str] | None,
            defaults: tuple[int, float] | None = None,
        ) -> NewJob: ...

        def _tree(self, new: NewJob, options: EnqueueOptions, trace: dict[str, str] | None) -> list[FlowJob] | None: ...

        async def _store(self, new: NewJob, tree: list[FlowJob] | None, options: EnqueueOptions) -> EnqueueOutcome: ...

        async def _store_in(
            self, transaction: object | None, new: list[NewJob], options: EnqueueOptions, tree: list[FlowJob] | None = None
        ) -> list[EnqueueOutcome]: ...

        def _enqueue_result(self, job_id: str, outcome: EnqueueOutcome) -> EnqueueResult: ...

        def _load_result(self, job_id: str, data: bytes | None) -> Any: ...

        async def _raise_stored_failure(self, job_id: str, error: bytes | None) -> None: ...

    # -- producer API ------------------------------------------------------------------

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
        (:meth:`Job.children_failures`), ``"ignore"`` counts failed children as done."""
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = self._new_job(job_id, payload, options, trace)
        tree = self._tree(new, options, trace)
        self._check_running()
        await self._listener.caught_up()
        if transaction is None:
            return self._enqueue_result(new.id, await self._store(new, tree, options))
        [outcome] = await self._store_in(transaction, [new], options, tree)
        return self._enqueue_result(new.id, outcome)

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
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = [
            self._new_job(jid, payload, options, trace) for jid, payload in jobs
        ]
        if options.get("children") is not None:  # one tree per job, each atomic
            trees = [self._tree(n, options, trace) for n in new]
            self._check_running()
            await self._listener.caught_up()
            if transaction is not None:
                return [
                    self._enqueue_result(n.id, (await self._store_in(transaction, [n], options, t))[0])
                    for n, t in zip(new, trees, strict=True)
                ]
            return [self._enqueue_result(n.id, await self._store(n, t, options)) for n, t in zip(new, trees, strict=True)]
        self._check_running()
        if not new:
            await trio.lowlevel.checkpoint()
            return []
        await self._listener.caught_up()
        outcomes = await self._store_in(transaction, new, options)
        return [self._enqueue_result(n.id, o) for n, o in zip(new, outcomes, strict=True)]

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
        timeout = check.seconds("timeout", timeout, job=job_id if isinstance(job_id, str) else None)
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = self._new_job(job_id, payload, options, trace)
        tree = self._tree(new, options, trace)
        self._check_running()
        jid = new.id
        waiter = self._waiters.add(jid)
        try:
            with trio.move_on_after(timeout):
                # The terminal notices are live before we enqueue (the first waiter of a
                # queue subscribes to them; later ones find them live).
                await self._listener.ensure(max(NOTICES, self._listener.pending))
                outcome = await self._store(new, tree, options)
                if outcome.status is EnqueueStatus.COMPLETED:
                    return self._load_result(jid, outcome.result)  # type: ignore[no-any-return]
                if outcome.status is EnqueueStatus.DUPLICATE and outcome.state and outcome.state.startswith("failed"):
                    await self._raise_stored_failure(jid, None)
                waiter.bind(new.token if outcome.status is EnqueueStatus.QUEUED else outcome.token)
                while True:
                    # Flags first, then a fresh wake-up: a notice can never fall in between.
                    if waiter.outcome is not None:
                        return await self._waiter_outcome(jid, waiter.outcome)  # type: ignore[no-any-return]
                    if waiter.stopped:
                        raise QueueStoppedError(self.name, jid)
                    if waiter.resync:  # the event stream may have lost our notice
                        waiter.resync = False
                        record = await self.storage.get_job(self.name, jid)
                        if waiter.outcome is None:
                            waiter.outcome = terminal_from_record(jid, record, waiter.token)
                        continue
                    waiter.event = trio.Event()
                    await waiter.event.wait()
            raise JobTimeoutError(jid, timeout)
        finally:
            self._waiters.remove(jid, waiter)

    async def _waiter_outcome(self, job_id: str, outcome: StorageEvent) -> Any:
        if outcome.kind == "completed":
            if outcome.result is None:
                record = await self.storage.get_job(self.name, job_id)
                if record is None or record.result is None:
                    raise TrioQueueError(f"job {job_id!r} completed but its result is no longer stored")
                return self._load_result(job_id, record.result)
            return self._load_result(job_id, outcome.result)
        if outcome.kind == "failed":
            await self._raise_stored_failure(job_id, outcome.error)
        raise JobCancelledError(job_id, removed=outcome.kind == "removed")

