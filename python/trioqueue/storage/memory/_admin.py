"""MemoryStorage's registry queries and administration (counts, listing, retry, purge,
remove, clear): a part built by the storage with the queues and the trees it shares;
every step runs under the storage's lock."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ..._model._clock import now as _now
from .. import _rules as R
from .._base import CLEARED, JobRecord, NewJob, StorageEvent, check_active_kind, check_state_kind, job_record
from ._flows import MemoryTrees
from ._parts import MemoryQueues, MemRec

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


class MemoryAdmin:
    """The registry queries and administration of :class:`~trioqueue.storage.MemoryStorage`."""

    __slots__ = ("_queues", "_lock", "_q", "_trees")

    def __init__(self, queues: MemoryQueues, trees: MemoryTrees) -> None:
        self._queues = queues
        self._lock = queues.lock
        self._q = queues.q
        self._trees = trees

    async def counts(self, queue: str) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
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
            q.expire(_now())
            recs, nxt = q.index.page(state, limit, after)
            return [job_record(r) for r in recs], (None if nxt is None else str(nxt))

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            old = q.jobs.get(job_id)
            ok = R.retryable(old)
            if old is not None and ok:
                q.index.drop(old)
                # A new record: the old one may still sit in the ready list (a cancelled
                # job), where claims skip it (cancelled, and forgotten by the index).
                again = NewJob(job_id, old.envelope, old.max_attempts, old.result_ttl, token, None, old.priority, old.group)
                rec = q.jobs[job_id] = MemRec(again, int(now * 1000), q.index)
                rec.steps = R.retried_steps(old, reset_steps)
                rec.signals = old.signals  # its mailbox is kept (Job.wait_for_signal)
                q.ready.push([rec])  # its own priority's lane
                q.publish([StorageEvent("enqueued", job_id, token=token)])
                q.wake()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            cutoff = None if older_than is None else int((now - older_than) * 1000)
            n = q.index.purge(state, cutoff, q.forget, lambda rec: rec.exp is None)  # (kept for a parent or dependent)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return n

    async def remove_job(self, queue: str, job_id: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
            rec = q.jobs.get(job_id)
            ok = R.removable(rec)
            if rec is not None and ok:
                # Its ready-list or delayed-heap entry (if any) is skipped once the
                # record is gone.
                del q.jobs[job_id]
                q.index.drop(rec)
                q.publish([StorageEvent("removed", job_id, token=rec.token)])
                if rec.parent is not None or rec.waiters is not None or rec.flow is not None:
                    self._trees.removed(rec, _now())
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        now = _now()
        with self._lock:
            q = self._q(queue)
            q.expire(now)
            treed = [rec for rec in q.jobs.values() if rec.parent is not None or rec.waiters is not None or rec.flow is not None]
            n = q.clear(schedules)
            q.publish([StorageEvent(CLEARED, "")])
            for rec in treed:  # as remove_job: parents and dependents on other queues count them
                self._trees.removed(rec, now)
            q.wake()  # claims waiting for a slot or a due job look again
        await trio.lowlevel.cancel_shielded_checkpoint()
        return n

    async def queue_names(self) -> list[str]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            return sorted(self._queues.queues)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await trio.lowlevel.checkpoint()
        with self._lock:  # one snapshot
            q = self._q(queue)
            q.expire(_now())
            recs = [q.jobs.get(jid) for jid in job_ids]
            return [None if rec is None else job_record(rec) for rec in recs]

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
            rec = q.jobs.get(job_id)
            return None if rec is None else bytes(rec.envelope)
