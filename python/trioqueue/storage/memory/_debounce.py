"""MemoryStorage's debounced enqueue (:meth:`~trioqueue.storage.Debounce.debounce`), a mixin kept apart from
``_storage.py``: one locked step per call, as an enqueue."""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from ..._model._types import EnqueueStatus
from .. import _rules as R
from .._base import EnqueueOutcome, NewJob, StorageEvent
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
                if rec is None or not R.debounces(rec):
                    [outcome] = self._enqueue_locked(q, [job._replace(run_at=now + R.debounce_delay(delay, max_wait))], now)
                    outcomes.append(outcome)
                    continue
                run_at = R.debounce(rec, job.envelope, job.max_attempts, job.result_ttl, now, delay, max_wait)
                if run_at is not None and run_at != rec.run_at:
                    earlier = run_at < rec.run_at
                    self._delay(q, rec, run_at, events)  # (its old entry in the heap is stale now)
                    if earlier:
                        self._wake(q)
                outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, rec.state(), token=rec.token))
            self._publish(q, events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return outcomes
