"""The core of FileStorage: lifecycle, the queue lock, records, segments, the event log writer, expiry, promotion and the small shared steps."""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import trio

from ..._model._errors import ValidationError
from .. import _rules as R
from .._base import DELAYED as _DELAYED
from .._base import FAILING as _FAILING
from .._base import PROCESSING as _PROCESSING
from .._base import (
    Storage,
    StorageEvent,
)
from ._fsutil import (
    CorruptRecord,
    Rec,
    Segment,
    clean_tmp,
    decode_name,
    encode_name,
    load_fd,
    read_rec,
    replace_link,
    write_atomic,
    write_segment,
)
from ._groupcommit import Syncer, sync_now
from ._layout import (
    _CLEAN_INTERVAL,
    _DELAYED_LANE,
    _LANE_RECHECK,
    _EVENTS_MAX,
    _Q,
    _EnqState,
    _event_line,
    _log_generation,
    _log_header,
    _ready_name,
    _seq_name,
    _split_marker,
    _unlink,
    log,
)

__all__ = ["FileBase"]

# json.dumps with separators builds an encoder per call: one, built once (same output).
_event_json = json.JSONEncoder(separators=(",", ":")).encode


class FileBase(Storage):
    """See :class:`~trioqueue.storage.FileStorage`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = True,
        rescan_interval: float = 1.0,
        event_log_max_bytes: int = _EVENTS_MAX,
    ) -> None:
        super().__init__()
        if isinstance(event_log_max_bytes, bool) or not isinstance(event_log_max_bytes, int) or event_log_max_bytes < 1024:
            raise ValidationError(f"event_log_max_bytes must be an int >= 1024, got {event_log_max_bytes!r}")
        self._events_max = event_log_max_bytes
        self.directory = Path(directory)
        self._root = os.fspath(self.directory)
        self._fsync = fsync
        self._rescan = rescan_interval
        self._queues: dict[str, _Q] = {}
        self._qlock = threading.Lock()
        self._syncers: dict[object, Syncer] = {}
        self._enq: dict[tuple[object, str], _EnqState] = {}
        self._root_fd = -1
        self._locks_dir = os.path.join(self._root, "locks")
        self._locks_fd = -1
        self._tree_dirs: set[str] = set()  # tree/ folders known to exist (see _flows.py)
        self._tree_dirty: set[str] = set()  # queues given notes to act on

    def _repair(self, q: _Q) -> None:
        """Start-up repair of one queue (see :class:`~._recovery.RecoveryOps`)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"FileStorage({self._root!r})"

    async def _connect(self) -> None:
        await trio.to_thread.run_sync(self._connect_sync)

    def _connect_sync(self) -> None:
        os.makedirs(os.path.join(self._root, "q"), exist_ok=True)
        os.makedirs(self._locks_dir, exist_ok=True)
        self._root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._locks_fd = os.open(os.path.join(self._locks_dir, ".flock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        clean_tmp(self._locks_dir)
        for name in self._queue_dirs():
            self._repair(self._q(name))

    def _queue_dirs(self) -> list[str]:
        """The names of the queues that have a directory (blocking: run it in a thread)."""
        names: list[str] = []
        qroot = os.path.join(self._root, "q")
        for enc in os.listdir(qroot):
            path = os.path.join(qroot, enc)
            if not os.path.isdir(path):
                continue
            name = decode_name(enc)
            if name is None:  # a long name: kept in the directory's "name" file
                try:
                    with open(os.path.join(path, "name"), encoding="utf-8") as f:
                        name = f.read()
                except OSError:
                    continue
            names.append(name)
        return names

    async def _disconnect(self) -> None:
        with self._qlock:
            qs = list(self._queues.values())
            self._queues.clear()
        for q in qs:
            q.close()
        for fd in (self._root_fd, self._locks_fd):
            if fd >= 0:
                os.close(fd)
        self._root_fd = self._locks_fd = -1
        self._syncers.clear()
        self._enq.clear()

    def _q(self, name: str) -> _Q:
        q = self._queues.get(name)
        if q is not None:
            return q
        with self._qlock:
            q = self._queues.get(name)
            if q is None:
                if self._root_fd < 0:
                    raise RuntimeError("FileStorage is not open")
                enc = encode_name(name)
                path = os.path.join(self._root, "q", enc)
                fresh = not os.path.isdir(path)
                os.makedirs(path, exist_ok=True)
                if enc.startswith("h"):
                    with open(os.path.join(path, "name"), "w", encoding="utf-8") as f:
                        f.write(name)
                q = _Q(name, path)
                if fresh:
                    if self._fsync:
                        os.fsync(q.jobs_fd)
                        os.fsync(self._root_fd)
                        qfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                        try:
                            os.fsync(qfd)
                        finally:
                            os.close(qfd)
                        qroot = os.open(os.path.join(self._root, "q"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                        try:
                            os.fsync(qroot)
                        finally:
                            os.close(qroot)
                self._queues[name] = q
        return q

    @contextmanager
    def _locked(self, q: _Q) -> Iterator[None]:
        """The queue's lock, blocking: for worker threads only (start-up repair)."""
        with q.tlock:
            fcntl.flock(q.lock_fd, fcntl.LOCK_EX)
            outer = q.owner  # re-entered by this thread (an RLock): the section goes on
            try:
                if not outer:
                    q.begin()
                yield
            finally:
                if not outer:
                    q.end()
                fcntl.flock(q.lock_fd, fcntl.LOCK_UN)

    @asynccontextmanager
    async def _alock(self, q: _Q) -> AsyncIterator[None]:
        """The queue's lock, from a Trio task without ever blocking the Trio thread: the
        tasks of this run queue on a ``trio.Lock``; then the thread lock and the ``flock``
        (shared with other threads and processes) are tried without blocking, retried with
        a short backoff while someone else holds them. Cancellable while waiting; the
        locked section itself is synchronous."""
        async with q.trio_lock():
            delay = 0.0002
            while True:
                if q.tlock.acquire(blocking=False):
                    try:
                        fcntl.flock(q.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        q.tlock.release()
                await trio.sleep(delay)
                delay = min(delay * 2, 0.01)
            try:
                q.begin()
                yield
            finally:
                q.end()
                fcntl.flock(q.lock_fd, fcntl.LOCK_UN)
                q.tlock.release()

    def _marker(self, q: _Q, directory: str, name: str) -> tuple[int, str] | None:
        """``(number, encoded id)`` of a marker in ``ready/`` or ``delayed/``; ``None`` for a
        temp file (skipped) or anything else (quarantined and reported)."""
        if name.startswith(".tmp-"):
            return None
        parsed = _split_marker(name)
        if parsed is None:
            folder = os.path.basename(directory)
            self._quarantine(q, os.path.join(directory, name), f"unexpected file in {folder}/")
        return parsed

    async def _finish(self, fds: list[int], dirs: set[int], wrote: bool) -> None:
        """End of a step: make its writes durable, or only checkpoint if it wrote nothing."""
        if wrote:
            await self._durable(fds, dirs)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _durable(self, fds: list[int], dirs: set[int]) -> None:
        if not self._fsync:
            for fd in fds:
                os.close(fd)
            return
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            sync_now(fds, dirs)
            return
        syncer = self._syncers.get(token)
        if syncer is None:
            syncer = self._syncers[token] = Syncer(self._root_fd)
        await syncer.sync(fds, dirs)

    def _read(self, q: _Q, enc_id: str) -> Rec | None:
        """The record, or None if absent. Corrupt records are quarantined (and None).

        In a locked section, a record this process wrote itself comes from the record
        cache, as a copy (callers mutate what they get): the cache was emptied at the
        section's start if any other process of this code changed records since (the
        generation), and the entry is used only while ``jobs/<id>`` still names the
        segment it was written to (same inode, size and mtime: a writer of the older
        code, which bumps no generation, re-points ``jobs/<id>`` to a new segment, which
        existed before the old one could be freed, so it has another inode)."""
        q.hit = False
        if q.owner == threading.get_ident():
            hit = q.recs.get(enc_id)
            if hit is not None:
                try:
                    st = os.stat(enc_id, dir_fd=q.jobs_fd)
                except FileNotFoundError:
                    q.drop(enc_id)
                    return None
                if st.st_ino == hit[1] and st.st_size == hit[2] and st.st_mtime_ns == hit[3]:
                    q.hit = True
                    return hit[0].copy()
                q.drop(enc_id)
        path = q.jobs + "/" + enc_id
        try:
            return read_rec(path, enc_id)
        except CorruptRecord as exc:
            self._quarantine(q, path, f"corrupt job record: {exc}")
            return None

    def _load(self, q: _Q, enc_id: str, now: float, delete_expired: bool = True) -> Rec | None:
        r = self._read(q, enc_id)
        if r is not None and r.exp is not None and r.exp <= now:
            if delete_expired:
                _unlink(os.path.join(q.jobs, enc_id))
            return None
        return r

    def _commit(
        self,
        q: _Q,
        items: dict[str, Rec],
        fds: list[int] | None,
        new: set[str] | None = None,
        exists: Callable[[str], bool] | None = None,
    ) -> bool:
        """Write ``items`` (encoded id -> record) as one segment and make each
        ``jobs/<id>`` a link to it (lock held). Returns whether an expiry entry was made.

        Order: (0) the generation is bumped (see :meth:`_Q.bump`); (1) the segment is
        written under a temp name in ``tmp/``; (2) if a record
        has an expiry, ``expiry/<min ms>-s<segment id>`` is linked to it; (3) each
        ``jobs/<id>`` is linked (new ids) or atomically re-pointed (link to a temp name +
        rename over), the last one by renaming the temp name itself over it; (4) on an
        error, the temp name is unlinked. A crash before (3) leaves only a temp
        file (removed at start) and perhaps an expiry entry whose records nobody points to
        (dropped by the cleaner); during (3) each job has either its old or its new record.
        With ``fds`` (and fsync on) the descriptor is handed to the caller's group commit,
        else closed. A ``new`` id whose ``jobs/<id>`` exists is re-pointed if
        ``exists(id)`` says so (or there is no ``exists``), else left as it is (and its
        record is not cached): the caller's duplicate."""
        if not items:
            return False
        q.bump()
        tmp, fd, seg = write_segment(q.tmp, list(items.items()))
        keep = False
        try:
            exps = [r.exp for r in items.values() if r.exp is not None]
            if exps:
                ms = min(max(int(min(exps) * 1000), 0), (1 << 64) - 1)
                os.link(tmp, os.path.join(q.expiry, _seq_name(ms, "s" + seg.uid.hex())))
            st = os.fstat(fd) if q.owner == threading.get_ident() else None
            last: str | None = next(reversed(items))
            if new is not None and last in new:
                last = None  # a rename would not notice an existing name
            kept: set[str] = set()
            for enc in items:
                if enc == last:
                    # The last one takes the temp name itself: one rename (atomic over
                    # the old entry) instead of link + rename + unlink.
                    os.rename(tmp, q.jobs + "/" + enc)
                    tmp = ""
                    break
                if new is not None and enc in new:
                    try:
                        os.link(tmp, q.jobs + "/" + enc)
                        continue
                    except FileExistsError:
                        if exists is not None and not exists(enc):
                            kept.add(enc)
                            continue
                replace_link(tmp, q.jobs, enc, q.tmp)
            if st is not None:
                for enc, r in items.items():
                    if enc not in kept:
                        q.remember(enc, r, st.st_ino, st.st_size, st.st_mtime_ns)
            keep = fds is not None and self._fsync
        finally:
            if tmp:
                _unlink(tmp)
            if keep:
                assert fds is not None
                fds.append(fd)
            else:
                os.close(fd)
        return bool(exps)

    def _link_marker(self, q: _Q, enc: str, directory: str, name: str) -> None:
        """Give a job its ready/delayed name: another link to its record's segment."""
        if directory == q.ready:
            q.lane_filled(name)
        elif directory == q.delayed:
            q.lane_empty.pop(_DELAYED_LANE, None)
        try:
            os.link(q.jobs + "/" + enc, directory + "/" + name)
        except FileExistsError:
            pass

    def _quarantine(self, q: _Q, path: str, why: str) -> None:
        name = os.path.basename(path)
        dest = os.path.join(q.quarantine, f"{time.time_ns():x}-{os.path.basename(os.path.dirname(path))}-{name}")
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return
        except OSError:
            _unlink(path)
        log.error("trioqueue FileStorage: quarantined %s (%s) to %s", path, why, dest)
        self._publish(q, [StorageEvent("error", name, None, None, why.encode())])

    def _publish(self, q: _Q, events: list[StorageEvent]) -> None:
        """Append events to the log (lock held). Rotation also happens under the lock, and
        every write first follows a rotation made by another process, so no event is ever
        written to a log file that subscribers have left: a subscriber reads the old file
        to its end once it sees the rotation, then the new one (see :meth:`_tail`)."""
        if not events:
            return
        self._reopen_events_if_rotated(q)
        data = "".join(_event_json(_event_line(ev)) + "\n" for ev in events).encode()
        os.write(q.events_fd, data)
        q.events_written += len(data)
        if q.events_written > min(1 << 20, self._events_max // 4):
            q.events_written = 0
            if os.fstat(q.events_fd).st_size > self._events_max:
                # Rotate: a new file, one generation up; subscribers finish the old one
                # (still open) and switch over.
                write_atomic(q.path, "events", _log_header(_log_generation(q.events_fd) + 1), False)
                self._reopen_events_if_rotated(q)

    def _reopen_events_if_rotated(self, q: _Q) -> None:
        try:
            st = os.stat(q.events)
        except FileNotFoundError:
            st = None
        if st is None or st.st_ino != q.events_ino:
            os.close(q.events_fd)
            q.events_fd = os.open(q.events, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            q.events_ino = os.fstat(q.events_fd).st_ino

    def _worker_enc(self, q: _Q, worker_id: str) -> str:
        enc = encode_name(worker_id)
        if enc.startswith("h"):
            p = os.path.join(q.names, enc)
            if not os.path.exists(p):
                write_atomic(q.names, enc, worker_id.encode("utf-8", "surrogatepass"), False)
        return enc

    def _worker_dec(self, q: _Q, enc: str) -> str | None:
        name = decode_name(enc)
        if name is None:
            try:
                with open(os.path.join(q.names, enc), "rb") as f:
                    name = f.read().decode("utf-8", "surrogatepass")
            except OSError:
                return None
        return name

    def _maybe_clean(self, q: _Q, now: float) -> None:
        if now - q.last_clean >= _CLEAN_INTERVAL:
            q.last_clean = now
            self._clean_expired(q, now)

    def _clean_expired(self, q: _Q, now: float) -> None:
        """Forget terminal jobs whose TTL has passed (lock held).

        ``expiry/<ms>-s<segment id>`` is a link to a segment holding records with an
        expiry, ``ms`` the earliest one not yet handled. A record counts only while its
        ``jobs/<id>`` still points to that segment (same inode: the link keeps the inode
        alive, so its number cannot be reused meanwhile). Once due, expired records are
        unlinked and the entry is renamed to the next expiry, or removed."""
        now_ms = int(now * 1000)
        for name in sorted(os.listdir(q.expiry)):
            parsed = _split_marker(name)
            path = os.path.join(q.expiry, name)
            if parsed is None:
                _unlink(path)
                continue
            ms, rest = parsed
            if ms > now_ms:
                break
            if not rest.startswith("s"):  # a per-job entry of the older layout
                r = self._read(q, rest)
                if r is not None and r.exp is not None and r.exp <= now:
                    _unlink(os.path.join(q.jobs, rest))
                if r is None or r.exp is None or r.exp <= now or int(r.exp * 1000) != ms:
                    _unlink(path)
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                ino = os.fstat(fd).st_ino
                seg = load_fd(fd)
            except CorruptRecord:
                seg = None
            finally:
                os.close(fd)
            if not isinstance(seg, Segment):
                self._quarantine(q, path, "unreadable expiry segment")
                continue
            pending = math.inf
            for enc in seg.encs():
                try:
                    r = seg.rec(enc)
                except CorruptRecord:
                    continue
                if r.exp is None:
                    continue
                jpath = os.path.join(q.jobs, enc)
                try:
                    if os.stat(jpath).st_ino != ino:
                        continue  # re-pointed since: another entry covers it
                except FileNotFoundError:
                    continue
                if r.exp <= now:
                    _unlink(jpath)
                else:
                    pending = min(pending, r.exp)
            if pending == math.inf:
                _unlink(path)
            else:
                ms2 = min(max(int(pending * 1000), 0), (1 << 64) - 1)
                os.rename(path, os.path.join(q.expiry, _seq_name(ms2, rest)))

    def _promote(self, q: _Q, now: float, events: list[StorageEvent]) -> float:
        """Move due retries and delayed jobs to the ready list (lock held). Returns the
        next due time."""
        # Known empty like a lane (see _claim_locked): delayed/ is listed only after the
        # generation moved, this process linked a marker into it, or _LANE_RECHECK.
        empty = q.lane_empty.get(_DELAYED_LANE)
        if empty is not None and 0 <= now - empty < _LANE_RECHECK:
            return math.inf
        names = os.listdir(q.delayed)
        if not names:
            q.lane_empty[_DELAYED_LANE] = now
            return math.inf
        names.sort()
        now_ms = int(now * 1000)
        nxt = front = -1
        next_due = math.inf
        items: dict[str, Rec] = {}
        moves: list[tuple[str, str]] = []
        for name in names:
            parsed = self._marker(q, q.delayed, name)
            if parsed is None:
                continue
            ms, enc = parsed
            if ms > now_ms:
                next_due = ms / 1000
                break
            r = self._read(q, enc)
            if r is None or r.kind not in (_FAILING, _DELAYED) or r.mk != name or enc in items:
                _unlink(os.path.join(q.delayed, name))
                continue
            if nxt < 0:
                nxt, front = q.counters()
            mk = _ready_name(nxt, enc, r.priority, r.group)
            nxt += 1
            events.append(StorageEvent(R.promote(r, now_ms), r.id, token=r.token))
            r.mk = mk
            items[enc] = r
            moves.append((name, mk))
        # Records first (queued, naming their new marker), then the markers move: a crash
        # between leaves queued records without a marker, which start-up repair restores.
        self._commit(q, items, None)
        for name, mk in moves:
            q.lane_filled(mk)
            os.rename(os.path.join(q.delayed, name), os.path.join(q.ready, mk))
        if nxt >= 0:
            q.set_counters(nxt, front)
        return next_due

    def _cancel_claimed(self, q: _Q, r: Rec, worker_id: str, events: list[StorageEvent]) -> None:
        """A rule ended a claimed job cancelled (its proc entry is the caller's to remove)."""
        r.mk = None
        if R.in_tree(r):
            self._tree_ended(q, r)
        events.append(StorageEvent("cancelled", r.id, worker_id, token=r.token))

    # -- trees of jobs: see _flows.py (FileFlows), which overrides these -------------------

    def _tree_ended(self, q: _Q, r: Rec) -> None:
        """``r``, a job of a tree, is about to be written terminal (lock held)."""

    async def _act_on_notes(self, queue: str | None = None) -> None:
        """Act on the notes the steps left (trees of jobs)."""

    def _failed_by_children(self, q: _Q, r: Rec) -> bool:
        """Whether a child of the held parent ``r`` failed under ``cancel`` (lock held)."""
        return False

    def _ancestor_ended(self, q: _Q, r: Rec) -> bool:
        """Whether an ancestor of ``r`` failed or was cancelled (lock of ``q`` held)."""
        return False

    def _held(self, q: _Q, pdir: str, worker_id: str, job_id: str, token: str) -> tuple[str, Rec] | None:
        """``(enc, record)`` of a job ``worker_id`` holds under claim ``token`` (lock held)."""
        enc = encode_name(job_id)
        r = self._read(q, enc)
        if r is None or r.kind != _PROCESSING or r.worker != worker_id or r.claim != token:
            return None
        if not q.hit and not os.path.exists(pdir + "/" + enc):
            return None  # (a hit: this process claimed it, and nobody re-pointed it since)
        return enc, r
