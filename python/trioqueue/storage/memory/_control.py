"""MemoryStorage's queue controls kept apart from its job paths: the worker registry and
its heartbeats, progress, stored schedules, pause/resume and the reapers' leader locks (each one step under
the storage's lock, like everything else)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import trio

from .._base import EnqueueOutcome, HeartbeatReply, LostClaim, NewJob, Storage, StorageEvent, lost_why
from .._base import PROCESSING as _PROCESSING
from .._base import QUEUED as _QUEUED
from ._parts import _Q

__all__ = ["MemoryControl"]


class MemoryControl(Storage):
    """A part of :class:`~trioqueue.storage.MemoryStorage` (which provides the helpers)."""

    _lock: threading.Lock
    _locks: dict[str, tuple[str, float]]  # lock name -> (owner, expiry)

    def _q(self, name: str) -> _Q:
        raise NotImplementedError

    def _publish(self, q: _Q, events: list[StorageEvent]) -> None:
        raise NotImplementedError

    def _wake(self, q: _Q) -> None:
        raise NotImplementedError

    def _enqueue_locked(self, q: _Q, jobs: Sequence[NewJob], now: float) -> list[EnqueueOutcome]:
        raise NotImplementedError

    def _expire(self, q: _Q, now: float) -> None:
        raise NotImplementedError

    # -- groups ------------------------------------------------------------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            changed = (group in q.paused_groups) != paused
            if paused:
                q.paused_groups.add(group)
            elif changed:
                q.paused_groups.discard(group)
                q.ready.requeue_group(group)  # back in the rings (it left them while paused)
                self._wake(q)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def paused_groups(self, queue: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return sorted(self._q(queue).paused_groups)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        await trio.lowlevel.checkpoint()
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for rec in self._q(queue).jobs.values():
                if rec.kind in (_QUEUED, _PROCESSING):
                    counts = out.setdefault(rec.group or "", {_QUEUED: 0, _PROCESSING: 0})
                    counts[rec.kind] += 1
        return out


    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        reply = HeartbeatReply([], [])
        with self._lock:
            q = self._q(queue)
            q.workers[worker_id] = now + ttl
            proc = q.processing.get(worker_id, {})
            for job_id, token in claims:
                rec = proc.get(job_id)
                if rec is not None and rec.claim == token:
                    rec.lease = now + lease
                    if rec.cancel_requested:
                        reply.cancel_requested.append(job_id)
                    continue
                known = q.jobs.get(job_id)  # (None: forgotten)
                kind, claim = (None, None) if known is None else (known.kind, known.claim)
                if (why := lost_why(kind, claim, token)) is not None:
                    reply.lost.append(LostClaim(job_id, token, why))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return reply

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            q.workers.pop(worker_id, None)
            if not q.processing.get(worker_id, True):
                del q.processing[worker_id]
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint()
        now = time.time()
        with self._lock:
            return {w: t for w, t in self._q(queue).workers.items() if include_expired or t > now}

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            rec = q.processing.get(worker_id, {}).get(job_id)
            ok = rec is not None and rec.claim == token
            if rec is not None and ok:
                rec.progress = progress
                self._publish(q, [StorageEvent("progress", job_id, worker_id, result=progress, token=rec.token)])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            schedules = self._q(queue).schedules
            entry = schedules.get(name)
            ok = (None if entry is None else entry[0]) == expected
            if ok:
                schedules[name] = (spec, None if entry is None else entry[1])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            found = self._q(queue).schedules.pop(name, None) is not None
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return dict(self._q(queue).schedules)

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            entry = q.schedules.get(name)
            ok = entry is not None and (entry[1] is None or tick > entry[1])
            if entry is not None and ok:
                if job is not None:
                    self._enqueue_locked(q, [job], time.time())
                q.schedules[name] = (entry[0], tick)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            changed = q.paused != paused
            if changed:
                q.paused = paused
                self._publish(q, [StorageEvent("paused" if paused else "resumed", "")])
                self._wake(q)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return self._q(queue).paused

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            holder = self._locks.get(name)
            ok = holder is None or holder[0] == owner or holder[1] <= now
            if ok:
                self._locks[name] = (owner, now + ttl)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            holder = self._locks.get(name)
            ok = holder is not None and holder[0] == owner
            if ok:
                del self._locks[name]
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok
