"""A queue's producer calls and request/response (:class:`QueueProducer`:
``enqueue_many`` and ``enqueue_and_wait``), an object the :class:`~trioqueue.Queue`
builds and delegates to (its ``enqueue``, the per-job path, uses the same parts itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack
from collections.abc import Callable, Iterable

import trio

from .._model import _tracing
from .._model import _validate as check
from .._model._errors import JobCancelledError, JobTimeoutError, QueueStoppedError, TrioQueueError
from .._model._options import EnqueueOptions
from .._model._types import EnqueueResult, EnqueueStatus, queued_result
from ..storage._base import Storage, StorageEvent
from ._listener import NOTICES
from ._waiters import terminal_from_record

if TYPE_CHECKING:
    from ._flows import JobMaker
    from ._listener import Listener
    from ._registry import JobReader
    from ._waiters import Waiters

__all__ = ["QueueProducer"]

P = TypeVar("P")
R = TypeVar("R")


class QueueProducer(Generic[P, R]):
    """A queue's producer calls (the :class:`~trioqueue.Queue`'s ``enqueue_many`` and
    ``enqueue_and_wait``, documented there; its ``enqueue`` uses these parts itself): jobs
    made and stored by its ``maker``, outcomes read by its ``reader``, the ``listener``
    waited for (a level asked for, the notices of ``enqueue_and_wait``), ``waiters``
    parked until their outcome, ``check_running`` raising unless the queue runs."""

    def __init__(
        self,
        storage: Storage,
        name: str,
        maker: JobMaker,
        reader: JobReader,
        listener: Listener,
        waiters: Waiters,
        check_running: Callable[[], None],
    ) -> None:
        self.storage = storage
        self.name = name
        self.maker = maker
        self.reader = reader
        self.listener = listener
        self.waiters = waiters
        self.check_running = check_running

    # -- producer API ------------------------------------------------------------------

    async def enqueue_many(
        self,
        jobs: Iterable[tuple[str, P]],
        *,
        transaction: object | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = self.maker.new_jobs(jobs, options, trace)
        if options.get("children") is not None or options.get("depends_on") is not None:  # one tree per job, each atomic
            trees = [self.maker.tree(n, options, trace) for n in new]
            self.check_running()
            await self.listener.caught_up()
            if transaction is not None:
                return [
                    self.maker.enqueue_result(n.id, (await self.maker.store_in(transaction, [n], options, t))[0])
                    for n, t in zip(new, trees, strict=True)
                ]
            return [self.maker.enqueue_result(n.id, await self.maker.store(n, t, options)) for n, t in zip(new, trees, strict=True)]
        self.check_running()
        if not new:
            await trio.lowlevel.checkpoint()
            return []
        await self.listener.caught_up()
        outcomes = await self.maker.store_in(transaction, new, options)
        result = self.maker.enqueue_result
        queued = EnqueueStatus.QUEUED
        # (a queued job's result, enqueue_result's common case, built here: a call less a job)
        return [
            queued_result(n.id) if o.status is queued else result(n.id, o) for n, o in zip(new, outcomes, strict=True)
        ]

    async def enqueue_and_wait(
        self,
        job_id: str,
        payload: P,
        *,
        timeout: float = 30.0,
        **options: Unpack[EnqueueOptions],
    ) -> R:
        timeout = check.seconds("timeout", timeout, job=job_id if isinstance(job_id, str) else None)
        trace = _tracing.current_context() if _tracing.ENABLED else None
        new = self.maker.new_job(job_id, payload, options, trace)
        tree = self.maker.tree(new, options, trace)
        self.check_running()
        jid = new.id
        waiter = self.waiters.add(jid)
        try:
            with trio.move_on_after(timeout):
                # The terminal notices are live before we enqueue (the first waiter of a
                # queue subscribes to them; later ones find them live).
                await self.listener.ensure(max(NOTICES, self.listener.pending))
                outcome = await self.maker.store(new, tree, options)
                if outcome.status is EnqueueStatus.COMPLETED:
                    return self.reader.load_result(jid, outcome.result)  # type: ignore[no-any-return]
                if outcome.status is EnqueueStatus.DUPLICATE and outcome.state and outcome.state.startswith("failed"):
                    await self.reader.raise_stored_failure(jid, None)
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
                    event = waiter.event = trio.Event()
                    await event.wait()
            raise JobTimeoutError(jid, timeout)
        finally:
            self.waiters.remove(jid, waiter)

    async def _waiter_outcome(self, job_id: str, outcome: StorageEvent) -> Any:
        if outcome.kind == "completed":
            if outcome.result is None:
                record = await self.storage.get_job(self.name, job_id)
                if record is None or record.result is None:
                    raise TrioQueueError(f"job {job_id!r} completed but its result is no longer stored")
                return self.reader.load_result(job_id, record.result)
            return self.reader.load_result(job_id, outcome.result)
        if outcome.kind == "failed":
            await self.reader.raise_stored_failure(job_id, outcome.error)
        raise JobCancelledError(job_id, removed=outcome.kind == "removed")

