"""FileStorage, reaper side: stalled-job recovery, leader locks and start-up repair."""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from .. import _rules as R
from .._base import CANCELLED as _CANCELLED
from .._base import COMPLETED as _COMPLETED
from .._base import DELAYED as _DELAYED
from .._base import FAILED as _FAILED
from .._base import FAILING as _FAILING
from .._base import PROCESSING as _PROCESSING
from .._base import QUEUED as _QUEUED
from .._base import (
    StorageEvent,
)
from ._fsutil import (
    CorruptRecord,
    Rec,
    Segment,
    clean_tmp,
    load_fd,
    encode_name,
    write_atomic,
)
from ._groupcommit import sync_now
from ._base import FileCore, FileSettings
from ._flows import FileTrees
from ._limits import slot_freed
from ._layout import (
    FileQueue,
    close_on_error,
    mtime_of,
    ready_name,
    seq_name,
    split_marker,
    split_ready,
    unlink_quiet,
    log,
)

__all__ = ["FileRecovery"]


class FileRecovery:
    """The reaper side of :class:`~trioqueue.storage.FileStorage`. A part built by the
    storage with the core and the trees it shares."""

    def __init__(self, core: FileCore, settings: FileSettings, trees: FileTrees) -> None:
        self._core = core
        self._settings = settings
        self._trees = trees

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        recovered: list[tuple[str, str]] = []
        events: list[StorageEvent] = []
        next_deadline = math.inf
        fds: list[int] = []
        dirs = {q.jobs_fd, *q.lane_fds}
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                self._core.clean_expired(q, now)
                q.last_clean = now
                next_deadline = self._core.promote(q, now, events)
                nxt, front = q.counters()
                start = nxt
                items: dict[str, Rec] = {}
                requeue: list[tuple[str, str]] = []  # (proc entry, new ready name)
                drop: list[str] = []
                dead: list[str] = []
                stale: list[str] = []  # proc entries of settled jobs: dropped after the events
                for enc_w in os.listdir(q.proc):
                    pdir = os.path.join(q.proc, enc_w)
                    alive_until = mtime_of(os.path.join(q.workers, enc_w)) or 0.0
                    try:
                        names = os.listdir(pdir)
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    worker_id = None
                    for enc in names:
                        if enc.startswith(".") or enc in items:
                            continue
                        marker = os.path.join(pdir, enc)
                        r = self._core.read(q, enc)
                        if r is None or r.kind != _PROCESSING:
                            if r is not None and r.kind == _QUEUED and r.mk and not os.path.exists(
                                os.path.join(q.ready, r.mk)
                            ):
                                # Claim interrupted before the record was updated: undo it.
                                q.bump()
                                q.lane_filled(r.mk)
                                os.rename(marker, os.path.join(q.ready, r.mk))
                            else:
                                if r is not None:
                                    if worker_id is None:
                                        worker_id = self._core.worker_dec(q, enc_w) or enc_w
                                    self._reannounce(r, worker_id, events)
                                stale.append(marker)
                            continue
                        lease = r.lease if r.lease is not None else mtime_of(marker)
                        if lease is None:
                            continue
                        if lease > now and alive_until > now:
                            next_deadline = min(next_deadline, lease, alive_until)
                            continue
                        if worker_id is None:
                            worker_id = self._core.worker_dec(q, enc_w) or enc_w
                        events.append(StorageEvent("stalled", r.id, worker_id, token=r.token))
                        # cancelled (a cancel request), requeued (attempts left, or a reserved
                        # claim that never ran: back at no cost) or failed (StalledJobError)
                        verdict = R.recover(r, now, worker_id)
                        recovered.append((r.id, verdict))
                        if verdict == "cancelled":
                            self._trees.cancel_claimed(q, r, worker_id, events)
                            drop.append(marker)
                        elif verdict == "requeued":
                            mk = ready_name(nxt, enc, r.priority, r.group)
                            nxt += 1
                            r.mk = mk
                            requeue.append((marker, mk))
                            events.append(StorageEvent("requeued", r.id, worker_id, token=r.token))
                        else:
                            if R.in_tree(r):
                                self._trees.tree_ended(q, r)
                            drop.append(marker)
                            events.append(StorageEvent("failed", r.id, worker_id, error=r.error, token=r.token))
                        items[enc] = r
                    if alive_until <= now:
                        dead.append(enc_w)
                # Records first, then the proc entries move back to ready/ (or go): a crash
                # between leaves queued records whose entry is still in proc/, which the
                # next pass moves back ("claim interrupted"), and failed records whose stale
                # entry it drops.
                if self._core.commit(q, items, fds):
                    dirs.add(q.expiry_fd)
                for marker, mk in requeue:
                    q.lane_filled(mk)
                    os.rename(marker, os.path.join(q.ready, mk))
                # The events before the proc entries of ended jobs go: a crash between
                # leaves the entries, and the next pass announces them again.
                self._core.publish(q, events)
                events = []
                for marker in drop + stale:
                    unlink_quiet(marker)
                q.grp.left_all(items.items(), q.lane_empty)
                for enc_w in dead:
                    try:
                        os.rmdir(os.path.join(q.proc, enc_w))
                        q.proc_dirs.discard(enc_w)
                    except OSError:
                        pass
                # Dead workers holding nothing leave the registry.
                for enc_w in os.listdir(q.workers):
                    if enc_w.startswith("."):
                        continue
                    expiry = mtime_of(os.path.join(q.workers, enc_w))
                    if expiry is not None and expiry <= now:
                        pdir = os.path.join(q.proc, enc_w)
                        if not os.path.isdir(pdir) or not [n for n in os.listdir(pdir) if not n.startswith(".")]:
                            unlink_quiet(os.path.join(q.workers, enc_w))
                            try:
                                os.rmdir(pdir)
                                q.proc_dirs.discard(enc_w)
                            except OSError:
                                pass
                if nxt != start:
                    q.set_counters(nxt, front)
                if items:
                    slot_freed(q)
                self._core.publish(q, events)
        await self._core.finish(fds, dirs, bool(items))
        await self._trees.act_on_notes(queue)  # this step's, and any a crash left
        return recovered, (None if next_deadline == math.inf else next_deadline)

    @staticmethod
    def _reannounce(r: Rec, worker_id: str, events: list[StorageEvent]) -> None:
        """The event of an ended job whose proc entry is still there: the settling process
        (or a reaper failing a stalled job) died between re-pointing its record and
        writing its events (they come before the entries go), or just after writing them
        (then it is announced twice: events are at-least-once; a waiter takes the first).
        A queued record is not announced (a claim or release interrupted: see above)."""
        if r.kind == _COMPLETED:
            events.append(StorageEvent("completed", r.id, worker_id, result=r.result, token=r.token))
        elif r.kind == _FAILED:
            events.append(StorageEvent("failed", r.id, worker_id, error=r.error, token=r.token))
        elif r.kind == _CANCELLED:
            events.append(StorageEvent("cancelled", r.id, worker_id, token=r.token))
        elif r.kind == _FAILING:
            events.append(StorageEvent("failing", r.id, worker_id, error=r.error, token=r.token))
        elif r.kind == _DELAYED:
            events.append(StorageEvent("sleeping" if r.asleep else "rate_limited", r.id, worker_id, token=r.token))
        elif r.kind == R.WAITING_SIGNAL:
            events.append(StorageEvent("waiting_signal", r.id, worker_id, token=r.token))

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        enc = encode_name(name)
        path = os.path.join(self._core.locks_dir, enc)
        with self._locks_locked():
            now = time.time()
            holder = self._lock_holder(path)
            ok = holder is None or holder[0] == owner or holder[1] <= now
            if ok:
                data = json.dumps({"name": name, "owner": owner, "exp": now + ttl}).encode()
                write_atomic(self._core.locks_dir, enc, data, False)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        path = os.path.join(self._core.locks_dir, encode_name(name))
        with self._locks_locked():
            holder = self._lock_holder(path)
            ok = holder is not None and holder[0] == owner
            if ok:
                unlink_quiet(path)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    def repair(self, q: FileQueue) -> None:
        """At start: remove temp files of dead processes, put back ready markers that a
        crash between the record write and the marker creation left missing, and
        quarantine unreadable records."""
        with self._core.locked(q):
            q.bump()  # markers may be relinked: other processes re-list the lanes
            for d in (q.path, q.tmp, q.jobs, *q.lanes, q.delayed, q.names, os.path.join(q.path, "tree")):
                clean_tmp(d)
            for d in os.listdir(q.proc):
                clean_tmp(os.path.join(q.proc, d))
            in_proc: set[str] = set()
            for d in os.listdir(q.proc):
                try:
                    in_proc.update(os.listdir(os.path.join(q.proc, d)))
                except NotADirectoryError:
                    pass
            nxt, front = q.counters()
            max_seq = nxt - 1
            for lane in q.lanes:
                for name in os.listdir(lane):
                    parsed = split_marker(name)
                    if parsed is not None:
                        max_seq = max(max_seq, parsed[0])
            nxt = max_seq + 1
            now = time.time()
            items: dict[str, Rec] = {}
            relink: list[tuple[str, str]] = []
            delayed: list[tuple[str, str]] = []
            expiring: list[str] = []  # records with a TTL still to run
            for enc in os.listdir(q.jobs):
                if enc.startswith("."):
                    continue
                r = self._core.read(q, enc)
                if r is None:
                    continue
                if r.exp is not None and r.exp <= now:
                    unlink_quiet(os.path.join(q.jobs, enc))
                    continue
                if r.exp is not None:
                    expiring.append(enc)
                if r.kind == _QUEUED:
                    parsed = split_ready(r.mk) if r.mk else None
                    if parsed is not None and parsed[1] == enc:
                        nxt = max(nxt, parsed[0] + 1)  # the crashed batch may not have saved it
                    if r.mk and os.path.exists(os.path.join(q.ready, r.mk)):
                        continue
                    if enc in in_proc:
                        continue  # a claim in progress or interrupted: the reaper sees it
                    if r.mk is not None and parsed is not None and parsed[1] == enc:
                        relink.append((enc, r.mk))  # its own place in the FIFO
                        continue
                    items[enc] = r
                elif r.kind in (_FAILING, _DELAYED, R.WAITING_SIGNAL):
                    if r.mk and not os.path.exists(os.path.join(q.delayed, r.mk)):
                        delayed.append((enc, r.mk))
            for enc, r in sorted(items.items(), key=lambda kv: kv[1].created):
                r.mk = ready_name(nxt, enc, r.priority, r.group)
                nxt += 1
            # New records (naming the new markers) first, then the markers: links to them.
            fds: list[int] = []
            self._core.commit(q, items, fds)
            for enc, r in items.items():
                assert r.mk is not None
                self._core.link_marker(q, enc, q.ready, r.mk)
            for enc, mk in relink:
                self._core.link_marker(q, enc, q.ready, mk)
            for enc, mk in delayed:
                self._core.link_marker(q, enc, q.delayed, mk)
            fixed = len(items) + len(relink) + len(delayed)
            q.set_counters(nxt, front)
            if fixed:
                log.warning("trioqueue FileStorage: restored %d ready markers in %s", fixed, q.path)
            if expiring and (n := self._restore_expiry(q, expiring)):
                log.warning("trioqueue FileStorage: restored %d expiry entries in %s", n, q.path)
            if self._settings.fsync:
                sync_now(fds, {q.jobs_fd, *q.lane_fds, q.delayed_fd, q.expiry_fd})

    @staticmethod
    def _restore_expiry(q: FileQueue, expiring: list[str]) -> int:
        """Link back ``expiry/<ms>-s<segment id>`` for each segment holding records with a
        TTL (``expiring``, encoded ids) that no expiry entry names: settlements do not
        flush ``expiry/``, so a power cut may lose an entry, never the record (lock held).
        Returns how many entries were made."""
        have: set[int] = set()
        for name in os.listdir(q.expiry):
            try:
                have.add(os.stat(os.path.join(q.expiry, name)).st_ino)
            except FileNotFoundError:
                pass
        made = 0
        for enc in expiring:
            path = os.path.join(q.jobs, enc)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                ino = os.fstat(fd).st_ino
                if ino in have:
                    continue
                seg = load_fd(fd)
            except CorruptRecord:
                continue  # (read() has quarantined what it could not parse)
            finally:
                os.close(fd)
            have.add(ino)
            if not isinstance(seg, Segment):
                continue  # a single record of the older layout: its own entries, if any
            exps = []
            for e in seg.encs():
                try:
                    x = seg.rec(e).exp
                except CorruptRecord:
                    continue
                if x is not None:
                    exps.append(x)
            if not exps:
                continue
            ms = min(max(int(min(exps) * 1000), 0), (1 << 64) - 1)
            try:
                os.link(path, os.path.join(q.expiry, seq_name(ms, "s" + seg.uid.hex())))
                made += 1
            except FileExistsError:
                pass
        return made

    @contextmanager
    def _locks_locked(self) -> Iterator[None]:
        if self._core.locks_fd < 0:
            raise RuntimeError("FileStorage is not open")
        fcntl.flock(self._core.locks_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._core.locks_fd, fcntl.LOCK_UN)

    def _lock_holder(self, path: str) -> tuple[str, float] | None:
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            return str(d["owner"]), float(d["exp"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):
            return None  # damaged: treat as free
