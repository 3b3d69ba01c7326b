"""FileStorage, producer side: enqueue (coalesced group commits), debounce, cancel,
look-ups, pause, schedules."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Sequence

import trio

from ..._model._types import CancelStatus, EnqueueStatus, UpdateTTLStatus
from .. import _rules as R
from .._base import DELAYED as _DELAYED
from .._base import PROCESSING as _PROCESSING
from .._base import QUEUED as _QUEUED
from .._base import (
    EnqueueOutcome,
    JobRecord,
    NewJob,
    StorageEvent,
    ttl_update_status,
)
from ._fsutil import (
    CorruptRecord,
    Rec,
    encode_name,
    read_rec,
    tmp_name,
    write_atomic,
)
from ._groupcommit import sync_now
from ._base import FileCore, FileSettings
from ._flows import FileTrees
from ._layout import (
    enqueue_outcome,
    FileQueue,
    QUEUED_OUTCOME,
    close_on_error,
    due_event,
    EnqReq,
    EnqState,
    to_job_record,
    ready_name,
    seq_name,
    state_of,
    unlink_quiet,
)

__all__ = ["FileJobs"]


def _named_dirs(q: FileQueue, jobs: Sequence[NewJob]) -> set[int]:
    """The directories an enqueue of ``jobs`` flushes: ``jobs/`` only. Its markers (in the
    lanes, the group lanes or ``delayed/``) are not flushed: each job's record names its
    marker, and the start-up repair (which every process runs on every queue when it opens
    the directory, as all do after a power cut) links back a marker the cut lost, in its
    place in the FIFO. One flush of the disk's cache fewer per group: 2 instead of 3."""
    return {q.jobs_fd}


class FileJobs:
    """The producer side of :class:`~trioqueue.storage.FileStorage`. A part built by the
    storage with the core and the trees it shares."""

    def __init__(self, core: FileCore, settings: FileSettings, trees: FileTrees) -> None:
        self._core = core
        self._settings = settings
        self._trees = trees

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        key = (trio.lowlevel.current_trio_token(), queue)
        st = self._core.enq.get(key)
        if st is None:
            st = self._core.enq[key] = EnqState()
        req = EnqReq(jobs)
        st.pending.append(req)
        try:
            while not req.done.is_set():
                if st.running:
                    await st.idle.wait()
                    continue
                await self._write_group(q, st, req)
        except BaseException:
            # Never written: withdraw. Carried by a group: wait (shielded) until that group
            # is written, or gives it back because its carrier was cancelled before the lock.
            with trio.CancelScope(shield=True):
                while not req.done.is_set():
                    if req in st.pending:
                        st.pending.remove(req)
                        break
                    await req.moved.wait()
            raise
        if req.error is not None:
            if isinstance(req.error, OSError):
                raise OSError(req.error.errno, str(req.error)) from req.error
            raise req.error
        assert req.out is not None
        return req.out

    async def _write_group(self, q: FileQueue, st: EnqState, leader: EnqReq) -> None:
        """Lead one group: take every pending call, lock, write, unlock, flush."""
        st.running = True
        st.idle = trio.Event()
        group, st.pending = st.pending, []
        for r in group:
            r.moved = trio.Event()
        try:
            try:
                lock = self._core.alock(q)
                await lock.__aenter__()
            except BaseException:
                # Cancelled waiting for the lock: the whole group goes back, first in line
                # (each call withdraws itself if it is cancelled too).
                st.pending[:0] = group
                for r in group:
                    r.moved.set()
                raise
            with trio.CancelScope(shield=True):
                fds: list[int] = []
                try:
                    try:
                        flat = [j for r in group for j in r.jobs]
                        outcomes, fds, any_new = self._enqueue_locked(q, flat)
                    finally:
                        await lock.__aexit__(None, None, None)
                    pos = 0
                    for r in group:
                        r.out = outcomes[pos : pos + len(r.jobs)]
                        pos += len(r.jobs)
                    if any_new:
                        await self._core.durable(fds, _named_dirs(q, flat))
                except BaseException as exc:  # noqa: BLE001 - handed to every caller of the group
                    for r in group:
                        r.error = exc
                finally:
                    for r in group:
                        r.done.set()
                        r.moved.set()
        finally:
            st.running = False
            st.idle.set()

    def _enqueue_locked(self, q: FileQueue, jobs: Sequence[NewJob]) -> tuple[list[EnqueueOutcome], list[int], bool]:
        """One segment for every new job, then its ``jobs/`` and ``ready/`` (or
        ``delayed/``) links (lock held).

        Order: segment (temp name) -> ``jobs/<id>`` links -> ``ready/<seq>-<id>`` links ->
        temp name unlinked (the segment's data flushed before the first link); the group commit then fsyncs
        ``jobs/`` and ``ready/`` before any caller returns. A crash after a ``jobs/`` link
        but before its ``ready/`` link leaves a queued record without a marker: start-up
        repair links a new marker (the job was not acknowledged, but it is not lost). The
        segment may hold records of ids that turned out to exist (duplicates): nothing
        links them."""
        now = time.time()
        now_ms = int(now * 1000)
        outcomes: list[EnqueueOutcome] = []
        events: dict[str, StorageEvent] = {}
        fds: list[int] = []
        seen: dict[str, Rec] = {}
        items: dict[str, Rec] = {}
        # An id this process has no record of is presumed new: its jobs/<id> is linked
        # without a look first (the link fails if it exists: then it is read, and is a
        # duplicate unless cancelled or expired). Saves a failed open per new job.
        places: dict[str, list[int]] = {}  # presumed-new id -> its places in outcomes
        found: dict[str, Rec] = {}  # presumed-new ids that existed after all

        def exists(enc: str) -> bool:
            """``jobs/<enc>`` exists: True to replace it (a new incarnation)."""
            r0 = self._core.load(q, enc, now)
            if r0 is None or R.replaceable(r0):
                return True
            found[enc] = r0
            return False

        with close_on_error(fds):
            nxt, front = q.counters()
            start = nxt
            for job in jobs:
                enc = encode_name(job.id)
                r = seen.get(enc)
                if r is None and enc in q.recs:
                    r = self._core.load(q, enc, now)  # known here (a cache hit): no guess
                elif r is None:
                    places[enc] = []
                if r is None or R.replaceable(r):  # unknown, or a new incarnation
                    kind = R.enqueue_kind(job.run_at, now)
                    if kind == _DELAYED:
                        assert job.run_at is not None
                        mk = seq_name(int(job.run_at * 1000), enc)
                    else:
                        mk = ready_name(nxt, enc, job.priority, job.group)
                        nxt += 1
                    r = Rec(job.id, kind, now_ms, 0, job.max_attempts, job.result_ttl, now_ms, job.envelope, mk)
                    r.token = job.token
                    r.priority = job.priority
                    r.group = job.group
                    items[enc] = r
                    seen[enc] = r
                    outcomes.append(QUEUED_OUTCOME)
                    events[enc] = StorageEvent("enqueued", job.id, token=job.token)
                else:
                    outcomes.append(enqueue_outcome(r))
                if enc in places:
                    places[enc].append(len(outcomes) - 1)
            if items:
                self._core.commit(q, items, fds, new=set(items), exists=exists)
                for enc, r0 in found.items():  # duplicates after all: every place says so
                    del items[enc], events[enc]
                    for i in places.get(enc, ()):
                        outcomes[i] = enqueue_outcome(r0)
                delayed = []
                for enc, r in items.items():
                    assert r.mk is not None
                    self._core.link_marker(q, enc, q.ready if r.kind == _QUEUED else q.delayed, r.mk)
                    if r.kind != _QUEUED:
                        delayed.append((enc, r.mk))
                if delayed:
                    events["\0due"] = due_event(delayed)  # (a key no encoded id has)
            if nxt != start:
                q.set_counters(nxt, front)
            self._core.publish(q, list(events.values()))
            self._core.maybe_clean(q, now)
        return outcomes, fds, bool(items)

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        fds: list[int] = []
        wrote = False
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                r = self._core.load(q, enc, now)
                marker = None if r is None else r.mk
                folder = q.ready if r is not None and r.kind == _QUEUED else q.delayed
                status, event = R.cancel(r, now)
                if r is not None and event == "cancelled":
                    r.mk = None
                    if R.in_tree(r):
                        self._trees.tree_ended(q, r)  # its parent re-evaluated, its children cancelled
                    self._core.commit(q, {enc: r}, fds)
                    if marker:
                        unlink_quiet(os.path.join(folder, marker))
                    wrote = True
                    self._core.publish(q, [StorageEvent("cancelled", job_id, token=r.token)])
                elif r is not None and r.kind == _PROCESSING:
                    if r.children is not None or r.deps is not None:
                        self._trees.tree_ended(q, r)  # its children (added while it runs) are cancelled
                    if event is not None:  # a cancel request, new
                        self._core.commit(q, {enc: r}, fds)
                        wrote = True
                        self._core.publish(q, [StorageEvent(event, job_id, r.worker, token=r.token)])
        await self._core.finish(fds, {q.jobs_fd, q.ready_fd, q.delayed_fd, q.expiry_fd}, wrote)
        if self._trees.dirty:
            await self._trees.act_on_notes()
        return status

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        path = os.path.join(q.jobs, enc)
        try:
            r = read_rec(path, enc)
        except CorruptRecord:
            async with self._core.alock(q):
                r = self._core.read(q, enc)  # quarantines it if still corrupt
        if r is None:
            return None
        if r.exp is not None and r.exp <= time.time():
            return None
        return to_job_record(r)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        enc = encode_name(job_id)
        now = time.time()
        fds: list[int] = []
        async with self._core.alock(q):
            r = self._core.load(q, enc, now)
            refused = ttl_update_status(*((r.kind, r.result, r.error) if r else (None, None, None)))
            if refused is not None:
                status = refused
            else:
                assert r is not None
                r.exp = now + ttl
                self._core.commit(q, {enc: r}, fds)
                status = UpdateTTLStatus.UPDATED
        await self._core.finish(fds, {q.jobs_fd, q.expiry_fd}, status is UpdateTTLStatus.UPDATED)
        return status

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        async with self._core.alock(q):
            changed = os.path.exists(q.paused) != paused
            if changed:
                if paused:
                    write_atomic(q.path, "paused", b"", False)
                else:
                    unlink_quiet(q.paused)
                    # Wake blocked claims (they watch ready/): a temp file created and removed.
                    wake = os.path.join(q.ready, tmp_name())
                    os.close(os.open(wake, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                    unlink_quiet(wake)
                self._core.publish(q, [StorageEvent("paused" if paused else "resumed", "")])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        return os.path.exists(self._core.q(queue).paused)

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        async with self._core.alock(q):
            entry = self._schedule(q, name)
            ok = (None if entry is None else entry[0]) == expected
            if ok:
                self._write_schedule(q, name, spec, None if entry is None else entry[1])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        async with self._core.alock(q):
            found = unlink_quiet(os.path.join(q.schedules, encode_name(name)))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        out: dict[str, tuple[bytes, float | None]] = {}
        for enc in os.listdir(q.schedules):
            if enc.startswith("."):
                continue
            entry = self._schedule_file(q, enc)
            if entry is not None:
                out[entry[0]] = (entry[1], entry[2])
        return out

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        async with self._core.alock(q):
            entry = self._schedule(q, name)
            ok = entry is not None and (entry[1] is None or tick > entry[1])
            if entry is not None and ok:
                if job is not None:
                    _, fds, new = self._enqueue_locked(q, [job])
                    if new and self._settings.fsync:
                        sync_now(fds, _named_dirs(q, [job]))  # (closes them)
                    else:
                        for fd in fds:
                            os.close(fd)
                self._write_schedule(q, name, entry[0], tick)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    def _schedule(self, q: FileQueue, name: str) -> tuple[bytes, float | None] | None:
        entry = self._schedule_file(q, encode_name(name))
        return None if entry is None else (entry[1], entry[2])

    def _schedule_file(self, q: FileQueue, enc: str) -> tuple[str, bytes, float | None] | None:
        path = os.path.join(q.schedules, enc)
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            last = d["last"]
            return str(d["name"]), base64.b64decode(d["spec"]), None if last is None else float(last)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            self._core.quarantine(q, path, f"unreadable schedule: {exc}")
            return None

    def _write_schedule(self, q: FileQueue, name: str, spec: bytes, last: float | None) -> None:
        data = json.dumps({"name": name, "spec": base64.b64encode(spec).decode("ascii"), "last": last}).encode()
        write_atomic(q.schedules, encode_name(name), data, self._settings.fsync)
        if self._settings.fsync:
            dfd = os.open(q.schedules, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        fds: list[int] = []
        outcomes: list[EnqueueOutcome] = []
        wrote = False
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                events: list[StorageEvent] = []
                for job in jobs:
                    enc = encode_name(job.id)
                    r = self._core.load(q, enc, now)
                    if r is None or not R.debounces(r):
                        out, more, new = self._enqueue_locked(q, [job._replace(run_at=now + R.debounce_delay(delay, max_wait))])
                        fds += more
                        wrote |= new
                        outcomes += out
                        continue
                    run_at = R.debounce(r, job.envelope, job.max_attempts, job.result_ttl, now, delay, max_wait)
                    old = mk = r.mk
                    if run_at is not None:  # a delayed job: due later (its marker's name says when)
                        r.mk = mk = seq_name(int(run_at * 1000), enc)
                    self._core.commit(q, {enc: r}, fds)
                    if old is not None and mk is not None and mk != old:  # a new due time: a new marker
                        self._core.link_marker(q, enc, q.delayed, mk)
                        unlink_quiet(os.path.join(q.delayed, old))
                        if mk < old:
                            events.append(due_event([(enc, mk)]))
                    wrote = True
                    outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, state_of(r), token=r.token))
                self._core.publish(q, events)
        await self._core.finish(fds, {q.jobs_fd, q.delayed_fd, *(q.lane_fds[j.priority] for j in jobs)}, wrote)
        return outcomes
