"""MemoryStorage's reaper step, :meth:`~trioqueue.storage.Storage.recover_stalled` (a
mixin kept apart from ``_storage.py``); it runs under the storage's lock."""

from __future__ import annotations

import math
import time

import trio

from .._base import StorageEvent
from .._rules import PROCESSING, recover
from ._parts import _Rec, _MemoryPart

__all__ = ["MemoryRecovery"]


class MemoryRecovery(_MemoryPart):
    """The reaper part of :class:`~trioqueue.storage.memory.MemoryStorage`."""

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        recovered: list[tuple[str, str]] = []
        events: list[StorageEvent] = []
        next_deadline = math.inf
        requeue: list[_Rec] = []
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)
            self._promote(q, now, events)
            promoted = bool(events)
            if q.delayed:
                next_deadline = q.delayed[0][0]
            for worker_id, proc in list(q.processing.items()):
                alive_until = q.workers.get(worker_id, 0.0)
                for job_id, rec in list(proc.items()):
                    lease = 0.0 if rec.lease is None else rec.lease
                    if lease > now and alive_until > now:
                        next_deadline = min(next_deadline, lease, alive_until)
                        continue
                    del proc[job_id]
                    q.group_left(rec)
                    events.append(StorageEvent("stalled", job_id, worker_id, token=rec.token))
                    # cancelled (a cancel request), requeued (attempts left, or a reserved
                    # claim that never ran: back at no cost) or failed (StalledJobError)
                    verdict = recover(rec, now, worker_id)
                    recovered.append((job_id, verdict))
                    if verdict == "requeued":
                        q.refile(rec, PROCESSING)
                        requeue.append(rec)
                        events.append(StorageEvent("requeued", job_id, worker_id, token=rec.token))
                    else:
                        self._ended(q, rec, PROCESSING, now)
                        error = rec.error if verdict == "failed" else None
                        events.append(StorageEvent(verdict, job_id, worker_id, error=error, token=rec.token))
                if not proc and alive_until <= now:
                    del q.processing[worker_id]
            for worker_id, alive_until in list(q.workers.items()):
                if alive_until <= now and not q.processing.get(worker_id):
                    del q.workers[worker_id]  # a dead worker holding nothing: forget it
                    q.processing.pop(worker_id, None)
            q.ready.push(requeue)
            self._publish(q, events)
            if recovered or promoted:
                q.flow.freed()
                self._wake(q)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return recovered, (None if next_deadline == math.inf else next_deadline)

