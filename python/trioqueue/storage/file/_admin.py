"""FileStorage's registry queries and administration: counts, listing, retry, purge,
remove and the queue names.

There is no per-state index on disk (it would cost a link per transition on every hot
path): counts, listings and purges scan ``jobs/`` in a worker thread, reading each record
(segments are cached), so their time grows with the number of jobs but their memory does
not: a listing keeps a heap of ``limit + 1`` entries, a purge works in slices of
:data:`_SLICE` ids, each slice checked and unlinked under the queue's lock.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Sequence

import trio

from .. import _rules as R
from .._base import PROCESSING as _PROCESSING
from .._base import QUEUED as _QUEUED
from .._base import STATE_KINDS, JobRecord, StorageEvent, check_active_kind, check_state_kind
from .._cursor import decode_cursor, encode_cursor
from ._fsutil import CorruptRecord, Rec, encode_name, read_rec, tmp_name, write_atomic
from ._base import FileCore
from ._enqueue import FileJobs
from ._flows import FileTrees
from ._layout import close_on_error, to_job_record, ready_name, unlink_quiet

__all__ = ["FileAdmin"]

_SLICE = 1000  # ids a purge checks and unlinks per lock hold


class FileAdmin:
    """The registry queries and administration of :class:`~trioqueue.storage.FileStorage`.
    A part built by the storage with the core, the trees and the producer side it shares."""

    def __init__(self, core: FileCore, trees: FileTrees, jobs: FileJobs) -> None:
        self._core = core
        self._trees = trees
        self._jobs = jobs

    async def counts(self, queue: str) -> dict[str, int]:
        q = self._core.q(queue)

        def scan() -> dict[str, int]:
            out = dict.fromkeys(STATE_KINDS, 0)
            for _, r in self._core.records(q, time.time()):
                out[r.kind] = out.get(r.kind, 0) + 1
            return out

        return await trio.to_thread.run_sync(scan)

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        q = self._core.q(queue)

        def scan() -> int | None:
            return min((r.ts for _, r in self._core.records(q, time.time()) if r.kind == state), default=None)

        ms = await trio.to_thread.run_sync(scan)
        return None if ms is None else ms / 1000

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        check_state_kind(state)
        after = decode_cursor(cursor)
        q = self._core.q(queue)

        def scan() -> list[tuple[tuple[int, str], Rec]]:
            keyed = (((r.ts, r.id), r) for _, r in self._core.records(q, time.time()) if r.kind == state)
            if after is not None:
                keyed = (kr for kr in keyed if kr[0] < after)
            return heapq.nlargest(limit + 1, keyed, key=lambda kr: kr[0])

        top = await trio.to_thread.run_sync(scan)
        page = top[:limit]
        nxt = encode_cursor(*page[-1][0]) if len(top) > limit else None
        return [to_job_record(r) for _, r in page], nxt

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        fds: list[int] = []
        ok = False
        lane_fd = q.ready_fd
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                old = self._core.load(q, enc, now)
                if old is not None and R.retryable(old):
                    nxt, front = q.counters()
                    now_ms = int(now * 1000)
                    lane = old.priority
                    mk = ready_name(nxt, enc, lane, old.group)  # in its own priority's (and group's) lane
                    r = Rec(job_id, _QUEUED, now_ms, 0, old.max_attempts, old.result_ttl, now_ms, old.envelope, mk)
                    r.token = token
                    r.priority = lane
                    r.group = old.group
                    r.steps = R.retried_steps(old, reset_steps)
                    r.signals = old.signals  # its mailbox is kept (Job.wait_for_signal)
                    lane_fd = q.lane_fds[lane]
                    self._core.commit(q, {enc: r}, fds)
                    self._core.link_marker(q, enc, q.ready, mk)
                    q.set_counters(nxt + 1, front)
                    self._core.publish(q, [StorageEvent("enqueued", job_id, token=token)])
                    ok = True
        await self._core.finish(fds, {q.jobs_fd, lane_fd}, ok)
        return ok

    async def remove_job(self, queue: str, job_id: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        ok = False
        await self._trees.forget_completed(queue, job_id)  # (before it goes: not counted as cancelled)
        async with self._core.alock(q):
            r = self._core.load(q, enc, time.time())
            if r is not None and R.removable(r):
                # The marker first: once it is gone the job can no longer be claimed or
                # promoted; a crash before the record goes leaves a job without a marker,
                # which start-up repair gives one back (the removal was not acknowledged).
                if r.mk:
                    unlink_quiet(os.path.join(q.ready if r.kind == _QUEUED else q.delayed, r.mk))
                self._trees.removing(q, r)  # its tree told (notes, first)
                unlink_quiet(os.path.join(q.jobs, enc))
                self._core.publish(q, [StorageEvent("removed", job_id, token=r.token)])
                ok = True
        await self._core.finish([], {q.jobs_fd, q.delayed_fd, *q.lane_fds}, ok)
        if self._trees.dirty:
            await self._trees.act_on_notes()
        return ok

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        q = self._core.q(queue)
        now = time.time()
        cutoff = None if older_than is None else int((now - older_than) * 1000)

        def matches(r: Rec | None) -> bool:  # (not one kept for a parent or dependent: no TTL runs)
            return r is not None and r.kind == state and r.exp is not None and (cutoff is None or r.ts <= cutoff)

        def run() -> int:
            n = 0
            candidates = (enc for enc, r in self._core.records(q, now) if matches(r))
            while True:
                batch = [enc for _, enc in zip(range(_SLICE), candidates)]
                if not batch:
                    return n
                with self._core.locked(q):  # re-checked under the lock: it may have moved on
                    for enc in batch:
                        if matches(self._core.load(q, enc, time.time())):
                            unlink_quiet(os.path.join(q.jobs, enc))
                            n += 1

        n = await trio.to_thread.run_sync(run)
        await self._core.finish([], {q.jobs_fd}, n > 0)
        return n

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        now = time.time()
        out: list[JobRecord | None] = []
        for jid in job_ids:
            enc = encode_name(jid)
            try:
                r = read_rec(os.path.join(q.jobs, enc), enc)
            except CorruptRecord:
                out.append(await self._jobs.get_job(queue, jid))  # (quarantines it if still corrupt)
                continue
            out.append(None if r is None or (r.exp is not None and r.exp <= now) else to_job_record(r))
        return out

    async def queue_names(self) -> list[str]:
        return sorted(await trio.to_thread.run_sync(self._core.queue_dirs))

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        try:
            r = read_rec(os.path.join(q.jobs, enc), enc)
        except CorruptRecord:
            return None
        if r is None or (r.exp is not None and r.exp <= time.time()):
            return None
        return bytes(r.envelope)

    # -- groups ---------------------------------------------------------------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        encg = encode_name(group)
        path = os.path.join(q.grp.paused, encg)
        async with self._core.alock(q):
            changed = os.path.exists(path) != paused
            if changed and paused:
                write_atomic(q.grp.paused, encg, group.encode("utf-8", "surrogatepass"), False)
            elif changed:
                unlink_quiet(path)
                q.bump()
                q.grp.requeue(encg, q.lane_empty)  # back in the rings: claimers see the entries
                wake = os.path.join(q.ready, tmp_name())  # (and wake, as a resume of the queue does)
                os.close(os.open(wake, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                unlink_quiet(wake)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def paused_groups(self, queue: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        out = []
        for name in os.listdir(q.grp.paused):
            if name.startswith("."):
                continue
            try:
                with open(os.path.join(q.grp.paused, name), "rb") as f:
                    out.append(f.read().decode("utf-8", "surrogatepass"))
            except FileNotFoundError:
                pass
        return sorted(out)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        q = self._core.q(queue)

        def scan() -> dict[str, dict[str, int]]:
            out: dict[str, dict[str, int]] = {}
            for _, r in self._core.records(q, time.time()):
                if r.kind in (_QUEUED, _PROCESSING):
                    counts = out.setdefault(r.group or "", {_QUEUED: 0, _PROCESSING: 0})
                    counts[r.kind] += 1
            return out

        return await trio.to_thread.run_sync(scan)
