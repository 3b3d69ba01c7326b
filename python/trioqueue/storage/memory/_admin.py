"""MemoryStorage's registry queries and administration (counts, listing, retry, purge,
remove), a mixin kept apart from ``_storage.py``; every step runs under the storage's lock."""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from .. import _rules as R
from .._base import CLEARED, JobRecord, NewJob, StorageEvent, check_active_kind, check_state_kind, job_record
from .._flowstate import FlowState
from ._index import StateIndex
from ._parts import _Lanes, _Q, _Rec, _MemoryPart

__all__ = ["MemoryAdmin", "parse_int_cursor"]


def parse_int_cursor(cursor: str | None) -> int | None:
    """A cursor made of one non-negative integer, or ``None``; ``ValueError`` otherwise."""
    if cursor is None:
        return None
    try:
        value = int(cursor)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"invalid cursor {cursor!r}: pass back a cursor returned by list_jobs")
    return value


class MemoryAdmin(_MemoryPart):
    """The admin part of :class:`~trioqueue.storage.memory.MemoryStorage`."""

    def _tree_removed(self, rec: _Rec, now: float) -> None:
        raise NotImplementedError

    def _keep_newest(self, q: _Q, kind: str, keep: int) -> int:
        """Count-based retention (:attr:`Settlement.keep`), lock held: forget the oldest
        jobs of terminal state ``kind`` beyond the newest ``keep`` (jobs of trees go by
        their TTL)."""

        def forget(rec: _Rec) -> None:
            del q.jobs[rec.id]
            q.index.drop(rec)

        return q.index.trim(kind, keep, forget, R.in_tree)

    async def counts(self, queue: str) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            return dict(q.index.live)

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        await trio.lowlevel.checkpoint()
        with self._lock:
            ms = self._q(queue).index.oldest(state)
        return None if ms is None else ms / 1000

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        check_state_kind(state)
        after = parse_int_cursor(cursor)
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            recs, nxt = q.index.page(state, limit, after)
            return [job_record(r) for r in recs], (None if nxt is None else str(nxt))

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)
            old = q.jobs.get(job_id)
            ok = R.retryable(old)
            if old is not None and ok:
                q.index.drop(old)
                # A new record: the old one may still sit in the ready list (a cancelled
                # job), where claims skip it (cancelled, and forgotten by the index).
                again = NewJob(job_id, old.envelope, old.max_attempts, old.result_ttl, token, None, old.priority, old.group)
                rec = q.jobs[job_id] = _Rec(again, int(now * 1000), q.index)
                rec.steps = R.retried_steps(old, reset_steps)
                q.ready.push([rec])  # its own priority's lane
                self._publish(q, [StorageEvent("enqueued", job_id, token=token)])
                self._wake(q)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)

            def forget(rec: _Rec) -> None:
                del q.jobs[rec.id]
                q.index.drop(rec)

            cutoff = None if older_than is None else int((now - older_than) * 1000)
            n = q.index.purge(state, cutoff, forget)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return n

    async def remove_job(self, queue: str, job_id: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            rec = q.jobs.get(job_id)
            ok = R.removable(rec)
            if rec is not None and ok:
                # Its ready-list or delayed-heap entry (if any) is skipped once the
                # record is gone.
                del q.jobs[job_id]
                q.index.drop(rec)
                self._publish(q, [StorageEvent("removed", job_id, token=rec.token)])
                if rec.parent is not None:
                    self._tree_removed(rec, time.time())
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = time.time()
        with self._lock:
            q = self._q(queue)
            self._expire(q, now)
            gone = list(q.jobs.values())
            # Fresh structures: every job of the queue, whatever its state, is forgotten at
            # once; a worker's claim finds no processing entry (its settlement is fenced).
            q.ready, q.jobs, q.processing, q.delayed, q.expiry = _Lanes(), {}, {}, [], []
            q.index = StateIndex()
            q.flow = FlowState()
            # ... and its groups' state: the cleared claims' slots, the groups out of the
            # rings for their limit, the claim logs of group_rate (paused groups are kept,
            # as the pause flag is)
            q.running, q.gblocked, q.glogs, q.gsleep = {}, set(), {}, []
            if schedules:
                q.schedules = {}
            self._publish(q, [StorageEvent(CLEARED, "")])
            self._wake(q)  # claims waiting for a slot or a due job look again
        await trio.lowlevel.cancel_shielded_checkpoint()
        return len(gone)

    async def queue_names(self) -> list[str]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return sorted(self._queues)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await trio.lowlevel.checkpoint()
        with self._lock:  # one snapshot
            q = self._q(queue)
            self._expire(q, time.time())
            recs = [q.jobs.get(jid) for jid in job_ids]
            return [None if rec is None else job_record(rec) for rec in recs]

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            self._expire(q, time.time())
            rec = q.jobs.get(job_id)
            return None if rec is None else bytes(rec.envelope)
