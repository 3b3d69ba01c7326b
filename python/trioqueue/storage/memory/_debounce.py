"""MemoryStorage's debounced enqueue (:meth:`~trioqueue.storage.Debounce.debounce`), a mixin kept apart from
``_storage.py``: one locked step per call, as an enqueue."""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from ..._model._types import EnqueueStatus
from .._base import DELAYED, QUEUED, EnqueueOutcome, NewJob, StorageEvent
from ._parts import _MemoryPart

__all__ = ["MemoryDebounce"]


class MemoryDebounce(_MemoryPart):
    """The debounce part of :class:`~trioqueue.storage.MemoryStorage` (which provides the
    helpers below)."""

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        outcomes: list[EnqueueOutcome] = []
        with self._lock:
            q = self._q(queue)
            now = time.time()
            self._expire(q, now)
            events: list[StorageEvent] = []
            for job in jobs:
                rec = q.jobs.get(job.id)
                if rec is None or rec.kind not in (DELAYED, QUEUED):
                    [outcome] = self._enqueue_locked(q, [job._replace(run_at=now + min(delay, max_wait or delay))], now)
                    outcomes.append(outcome)
                    continue
                rec.envelope = job.envelope
                rec.max_attempts = job.max_attempts
                rec.result_ttl = job.result_ttl
                if rec.kind == DELAYED:
                    run_at = now + delay
                    if max_wait is not None:
                        run_at = min(run_at, rec.created_at_ms / 1000 + max_wait)
                    if run_at != rec.run_at:
                        earlier = run_at < rec.run_at
                        self._delay(q, rec, run_at, events)  # (its old entry in the heap is stale now)
                        if earlier:
                            self._wake(q)
                outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, rec.state(), token=rec.token))
            self._publish(q, events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return outcomes
