"""FileStorage's debounced enqueue (:meth:`~trioqueue.storage.Debounce.debounce`): one locked step per call."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import trio

from ..._model._types import EnqueueStatus
from .. import _rules as R
from .._base import EnqueueOutcome, NewJob, StorageEvent
from ._enqueue import EnqueueOps
from ._fsutil import encode_name
from ._layout import _close_on_error, _seq_name, _state, _unlink, due_event

__all__ = ["DebounceOps"]


class DebounceOps(EnqueueOps):
    """A part of :class:`~trioqueue.storage.FileStorage`."""

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        fds: list[int] = []
        outcomes: list[EnqueueOutcome] = []
        wrote = False
        async with self._alock(q):
            with _close_on_error(fds):
                now = time.time()
                events: list[StorageEvent] = []
                for job in jobs:
                    enc = encode_name(job.id)
                    r = self._load(q, enc, now)
                    if r is None or not R.debounces(r):
                        out, more, new = self._enqueue_locked(q, [job._replace(run_at=now + R.debounce_delay(delay, max_wait))])
                        fds += more
                        wrote |= new
                        outcomes += out
                        continue
                    run_at = R.debounce(r, job.envelope, job.max_attempts, job.result_ttl, now, delay, max_wait)
                    old = mk = r.mk
                    if run_at is not None:  # a delayed job: due later (its marker's name says when)
                        r.mk = mk = _seq_name(int(run_at * 1000), enc)
                    self._commit(q, {enc: r}, fds)
                    if old is not None and mk is not None and mk != old:  # a new due time: a new marker
                        self._link_marker(q, enc, q.delayed, mk)
                        _unlink(os.path.join(q.delayed, old))
                        if mk < old:
                            events.append(due_event([(enc, mk)]))
                    wrote = True
                    outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, _state(r), token=r.token))
                self._publish(q, events)
        await self._finish(fds, {q.jobs_fd, q.delayed_fd, *(q.lane_fds[j.priority] for j in jobs)}, wrote)
        return outcomes
