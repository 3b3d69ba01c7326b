"""FileStorage: one class, the list of what the backend does, delegating to parts it
builds in ``__init__``, each handed what it needs: the :class:`~._base.FileSettings` (the
constructor's options, one frozen dataclass) and the :class:`~._base.FileCore` (the
directory's queues, their locks, caches and event logs, the group commit, and the steps on
records, segments and markers they share). The parts: :class:`~._enqueue.FileJobs`
(enqueue, debounce, cancel, look-ups, pause, schedules), :class:`~._claims.FileClaims`
(claims, starts, settlements, releases, heartbeats, progress, workers),
:class:`~._recovery.FileRecovery` (the reaper, start-up repair, leader locks),
:class:`~._flows.FileTrees` (trees of jobs and their notes), :class:`~._retention.FileRetention`
(clear, count-based retention), :class:`~._admin.FileAdmin` (registry queries,
administration, groups) and :class:`~._eventlog.FileEvents` (subscriptions)."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio

from ..._model._types import CancelStatus, UpdateTTLStatus
from .._base import (
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    FlowJob,
    HeartbeatReply,
    JobRecord,
    NewJob,
    Settlement,
    StorageEvent,
)
from .._capabilities import Administration, Debounce, Groups, Schedules, Signals, Trees
from .. import _rules as R
from .._steps import decode_signals, decode_steps, encode_step
from ._admin import FileAdmin
from ._base import FileCore, FileSettings
from ._claims import FileClaims
from ._enqueue import FileJobs
from ._eventlog import FileEvents
from ._flows import FileTrees
from ._fsutil import CorruptRecord, Rec, encode_name, read_rec
from ._layout import EVENTS_MAX, close_on_error, ready_name, unlink_quiet
from ._recovery import FileRecovery
from ._retention import FileRetention

__all__ = ["FileStorage"]


class FileStorage(Trees, Schedules, Groups, Debounce, Administration, Signals):
    """Durable storage in a directory shared by any number of processes on one machine.

    ``fsync=False`` skips the flushes (faster, survives process crashes but not power
    loss). ``rescan_interval`` is the safety-net period at which blocked ``dequeue`` calls
    and subscriptions re-check the files even without a notification. The event log is
    rotated past ``event_log_max_bytes``. Count-based retention (``keep_completed``,
    ``keep_failed``) is swept in batches of :attr:`keep_every` settled jobs per process
    (see :mod:`trioqueue.storage.file._retention`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = True,
        rescan_interval: float = 1.0,
        event_log_max_bytes: int = EVENTS_MAX,
    ) -> None:
        super().__init__()
        self._settings = settings = FileSettings(Path(directory), fsync, rescan_interval, event_log_max_bytes)
        # The parts, each handed what it needs.
        self._core = core = FileCore(settings)
        self._trees = FileTrees(core)
        self._retention = FileRetention(core, self._trees)
        self._jobs = FileJobs(core, settings, self._trees)
        self._claims = FileClaims(core, settings, self._trees, self._retention)
        self._recovery = FileRecovery(core, settings, self._trees)
        self._admin = FileAdmin(core, self._trees, self._jobs)
        self._events = FileEvents(core, settings)

    @property
    def directory(self) -> Path:
        """The storage's directory."""
        return self._settings.directory

    @property
    def keep_every(self) -> int:
        """Jobs a process's settlements add to a state with a ``keep`` between two trims of
        it (at least; ``keep // 4`` when larger): the growth past ``keep`` each process
        allows (see :mod:`trioqueue.storage.file._retention`)."""
        return self._retention.keep_every

    @keep_every.setter
    def keep_every(self, value: int) -> None:
        self._retention.keep_every = value

    def __repr__(self) -> str:
        return f"FileStorage({self._core.root!r})"

    async def _connect(self) -> None:
        await trio.to_thread.run_sync(self._open)

    def _open(self) -> None:
        """Open the directory, and repair each of its queues (start-up repair)."""
        self._core.open()
        for name in self._core.queue_dirs():
            self._recovery.repair(self._core.q(name))

    async def _disconnect(self) -> None:
        self._core.close()

    # -- producers -----------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        """Concurrent calls of one Trio run on one queue are coalesced: calls arriving while
        a group is being written and flushed form the next group, written as one segment
        and flushed together (each call still takes effect atomically, in arrival order).

        Cancellation: a call cancelled before its group took the lock writes nothing (and
        never strands the others: the group goes on without it); once its group holds the
        lock, the write and the flush finish (shielded) and the call then raises
        ``Cancelled``, its jobs enqueued."""
        return await self._jobs.enqueue(queue, jobs)

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        return await self._jobs.debounce(queue, jobs, delay, max_wait)

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        return await self._jobs.cancel(queue, job_id)

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        return await self._jobs.get_job(queue, job_id)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return await self._admin.get_jobs(queue, job_ids)

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        return await self._admin.get_envelope(queue, job_id)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        return await self._jobs.update_result_ttl(queue, job_id, ttl)

    # -- consumers -----------------------------------------------------------------

    async def dequeue(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        timeout: float,
        lease: float,
        start: int | None = None,
        limits: ClaimLimits | None = None,
    ) -> list[Claim]:
        return await self._claims.dequeue(queue, worker_id, max_jobs, timeout, lease, start, limits)

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        return await self._claims.start(queue, worker_id, claims)

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """One segment for the whole call. Order: segment -> expiry entry -> ``jobs/<id>``
        re-pointed -> ``delayed/`` links of retries -> proc entries unlinked; then the
        group commit. A crash before a job's record is re-pointed leaves it processing
        (the reaper recovers it: the settlement was not acknowledged); after it, the stale
        proc entry is dropped by the reaper, and a missing ``delayed/`` link of a failing
        record is restored at start. Fenced by the claim token; a settlement of a claim
        that is already settled (a retried call) answers True and changes nothing."""
        return await self._claims.settle(queue, worker_id, settlements)

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        return await self._claims.release(queue, worker_id, job_ids, refund=refund)

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        return await self._claims.held_jobs(queue, worker_id)

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        return await self._claims.heartbeat(queue, worker_id, ttl, claims, lease)

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        return await self._claims.set_progress(queue, worker_id, job_id, token, progress)

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        return await self._claims.unregister_worker(queue, worker_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        return await self._claims.workers(queue, include_expired=include_expired)

    # -- reaper --------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        return await self._recovery.recover_stalled(queue)

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        return await self._recovery.acquire_lock(name, owner, ttl)

    async def release_lock(self, name: str, owner: str) -> bool:
        return await self._recovery.release_lock(name, owner)

    # -- events --------------------------------------------------------------------

    def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        """Every subscriber tails the queue's one event log; ``kinds`` filters what it
        reads before delivering (see :meth:`Storage.subscribe`)."""
        return self._events.subscribe(queue, kinds)

    # -- pause and schedules -------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> bool:
        return await self._jobs.set_paused(queue, paused)

    async def is_paused(self, queue: str) -> bool:
        return await self._jobs.is_paused(queue)

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        return await self._jobs.put_schedule(queue, name, spec, expected)

    async def remove_schedule(self, queue: str, name: str) -> bool:
        return await self._jobs.remove_schedule(queue, name)

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        return await self._jobs.get_schedules(queue)

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        """The tick's job is enqueued by the step :meth:`enqueue` runs under the queue's
        lock, and made durable (still under it) before the last tick is written: a crash
        never leaves a tick recorded whose job was lost."""
        return await self._jobs.tick_schedule(queue, name, tick, job)

    # -- groups --------------------------------------------------------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        return await self._admin.set_group_paused(queue, group, paused)

    async def paused_groups(self, queue: str) -> list[str]:
        return await self._admin.paused_groups(queue)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        return await self._admin.group_counts(queue)

    # -- trees ---------------------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        return await self._trees.enqueue_flow(jobs)

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        return await self._trees.add_children(queue, worker_id, job_id, token, children, policy)

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        return await self._trees.get_children(queue, job_id)

    # -- registry queries and administration ---------------------------------------

    async def counts(self, queue: str) -> dict[str, int]:
        return await self._admin.counts(queue)

    async def oldest(self, queue: str, state: str) -> float | None:
        return await self._admin.oldest(queue, state)

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        return await self._admin.list_jobs(queue, state, limit=limit, cursor=cursor)

    async def queue_names(self) -> list[str]:
        return await self._admin.queue_names()

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        return await self._admin.retry_job(queue, job_id, token, reset_steps=reset_steps)

    async def remove_job(self, queue: str, job_id: str) -> bool:
        return await self._admin.remove_job(queue, job_id)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        return await self._admin.purge(queue, state, older_than=older_than)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        return await self._retention.clear(queue, schedules=schedules)

    # -- steps -------------------------------------------------------------------------

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        """One step under the queue's lock: the held record re-written with the entry
        appended (its fsync in the group commit, as a settlement's)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        core = self._core
        q = core.q(queue)
        entry = encode_step(name, value)
        fds: list[int] = []
        ok = False
        async with core.alock(q):
            with close_on_error(fds):
                pdir = os.path.join(q.proc, core.worker_enc(q, worker_id))
                found = core.held(q, pdir, worker_id, job_id, token)
                if found is not None:
                    enc, r = found
                    ok = R.save_step(r, worker_id, token, entry)
                    if ok:
                        core.commit(q, {enc: r}, fds)
        await core.finish(fds, {q.jobs_fd}, ok)
        return ok

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        r = await self._live_record(queue, job_id)
        return {} if r is None else decode_steps(r.steps)

    async def _live_record(self, queue: str, job_id: str) -> Rec | None:
        """``job_id``'s record, read without the queue's lock (taken only to quarantine a
        corrupt one); ``None`` when unknown or expired."""
        await trio.lowlevel.checkpoint()
        core = self._core
        q = core.q(queue)
        enc = encode_name(job_id)
        try:
            r = read_rec(os.path.join(q.jobs, enc), enc)
        except CorruptRecord:
            async with core.alock(q):
                r = core.read(q, enc)  # quarantines it if still corrupt
        if r is None or (r.exp is not None and r.exp <= time.time()):
            return None
        return r

    # -- signals -----------------------------------------------------------------------

    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        """One step under the queue's lock: the record re-written with the message
        appended; a job it wakes gets its ready marker (its deadline's marker goes), which
        wakes every process's claims (inotify)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        core = self._core
        q = core.q(queue)
        enc = encode_name(job_id)
        entry = encode_step(name, payload)
        fds: list[int] = []
        outcome = "not_found"
        dirs = {q.jobs_fd}
        async with core.alock(q):
            with close_on_error(fds):
                now = time.time()
                r = core.load(q, enc, now)
                deadline = None if r is None else r.mk
                outcome = R.signal(r, entry, int(now * 1000))
                if r is not None and outcome != "not_found":
                    if outcome == "woken":
                        nxt, front = q.counters()
                        r.mk = ready_name(nxt, enc, r.priority, r.group)
                    core.commit(q, {enc: r}, fds)
                    if outcome == "woken":
                        assert r.mk is not None
                        if deadline:
                            unlink_quiet(os.path.join(q.delayed, deadline))
                        core.link_marker(q, enc, q.ready, r.mk)
                        q.set_counters(nxt + 1, front)
                        dirs.update((q.delayed_fd, q.lane_fds[r.priority]))
                        core.publish(q, [StorageEvent("promoted", job_id, token=r.token)])
        await core.finish(fds, dirs, outcome != "not_found")
        return "not_found" if outcome == "not_found" else "delivered"

    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        r = await self._live_record(queue, job_id)
        return [] if r is None else decode_signals(r.signals)
