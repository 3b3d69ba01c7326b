"""The core of FileStorage, shared by its parts: its settings; the directory's queues, their
locks, records, segments, markers, the event log writer, expiry and promotion."""

from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from ..._model._errors import ValidationError
from .. import _rules as R
from .._base import DELAYED as _DELAYED
from .._base import FAILING as _FAILING
from .._base import PROCESSING as _PROCESSING
from .._base import StorageEvent
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
    CLEAN_INTERVAL,
    DELAYED_LANE,
    LANE_RECHECK,
    EVENTS_MAX,
    FileQueue,
    EnqState,
    event_line,
    log_generation,
    log_header,
    ready_name,
    seq_name,
    split_marker,
    unlink_quiet,
    log,
)

__all__ = ["FileCore", "FileSettings"]

# json.dumps with separators builds an encoder per call: one, built once (same output).
_event_json = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True)
class FileSettings:
    """The options of a :class:`~trioqueue.storage.FileStorage` (see its docstring), read
    by its parts."""

    directory: Path
    fsync: bool = True
    rescan_interval: float = 1.0
    event_log_max_bytes: int = EVENTS_MAX

    def __post_init__(self) -> None:
        n = self.event_log_max_bytes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1024:
            raise ValidationError(f"event_log_max_bytes must be an int >= 1024, got {n!r}")

    @property
    def root(self) -> str:
        return os.fspath(self.directory)


class FileCore:
    """What every part of :class:`~trioqueue.storage.FileStorage` shares: the directory
    and its queues (their locks, caches and event logs), the group commit, and the steps
    on them (records, segments, markers, events, expiry, promotion)."""

    def __init__(self, settings: FileSettings) -> None:
        self.settings = settings
        self.root = settings.root
        self.queues: dict[str, FileQueue] = {}
        self._qlock = threading.Lock()
        self._syncers: dict[object, Syncer] = {}
        self.enq: dict[tuple[object, str], EnqState] = {}  # per (Trio run, queue): its enqueue groups
        self._root_fd = -1
        self.locks_dir = os.path.join(self.root, "locks")
        self.locks_fd = -1

    def open(self) -> None:
        """Create the directory's layout and open it (blocking: run it in a thread)."""
        os.makedirs(os.path.join(self.root, "q"), exist_ok=True)
        os.makedirs(self.locks_dir, exist_ok=True)
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.locks_fd = os.open(os.path.join(self.locks_dir, ".flock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        clean_tmp(self.locks_dir)

    def queue_dirs(self) -> list[str]:
        """The names of the queues that have a directory (blocking: run it in a thread)."""
        names: list[str] = []
        qroot = os.path.join(self.root, "q")
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

    def close(self) -> None:
        with self._qlock:
            qs = list(self.queues.values())
            self.queues.clear()
        for q in qs:
            q.close()
        for fd in (self._root_fd, self.locks_fd):
            if fd >= 0:
                os.close(fd)
        self._root_fd = self.locks_fd = -1
        self._syncers.clear()
        self.enq.clear()

    def q(self, name: str) -> FileQueue:
        q = self.queues.get(name)
        if q is not None:
            return q
        with self._qlock:
            q = self.queues.get(name)
            if q is None:
                if self._root_fd < 0:
                    raise RuntimeError("FileStorage is not open")
                enc = encode_name(name)
                path = os.path.join(self.root, "q", enc)
                fresh = not os.path.isdir(path)
                os.makedirs(path, exist_ok=True)
                if enc.startswith("h"):
                    with open(os.path.join(path, "name"), "w", encoding="utf-8") as f:
                        f.write(name)
                q = FileQueue(name, path)
                if fresh:
                    if self.settings.fsync:
                        os.fsync(q.jobs_fd)
                        os.fsync(self._root_fd)
                        qfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                        try:
                            os.fsync(qfd)
                        finally:
                            os.close(qfd)
                        qroot = os.open(os.path.join(self.root, "q"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                        try:
                            os.fsync(qroot)
                        finally:
                            os.close(qroot)
                self.queues[name] = q
        return q

    @contextmanager
    def locked(self, q: FileQueue) -> Iterator[None]:
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
    async def alock(self, q: FileQueue) -> AsyncIterator[None]:
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

    def marker(self, q: FileQueue, directory: str, name: str) -> tuple[int, str] | None:
        """``(number, encoded id)`` of a marker in ``ready/`` or ``delayed/``; ``None`` for a
        temp file (skipped) or anything else (quarantined and reported)."""
        if name.startswith(".tmp-"):
            return None
        parsed = split_marker(name)
        if parsed is None:
            folder = os.path.basename(directory)
            self.quarantine(q, os.path.join(directory, name), f"unexpected file in {folder}/")
        return parsed

    async def finish(self, fds: list[int], dirs: set[int], wrote: bool) -> None:
        """End of a step: make its writes durable, or only checkpoint if it wrote nothing."""
        if wrote:
            await self.durable(fds, dirs)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def durable(self, fds: list[int], dirs: set[int]) -> None:
        if not self.settings.fsync:
            for fd in fds:
                os.close(fd)
            return
        try:
            syncer = self._syncer()
        except RuntimeError:
            sync_now(fds, dirs)
            return
        await syncer.sync(fds, dirs)

    def _syncer(self) -> Syncer:
        token = trio.lowlevel.current_trio_token()
        syncer = self._syncers.get(token)
        if syncer is None:
            syncer = self._syncers[token] = Syncer(self._root_fd)
        return syncer

    def _fill_spares(self, q: FileQueue) -> None:
        """Have the flusher thread make ``q``'s spare segment files (outside Trio, e.g.
        the start-up repair: none are made, segments create their files)."""
        try:
            flusher = self._syncer().flusher
        except RuntimeError:
            q.spares.filling = False
            return
        flusher.post(q.spares.fill)

    def read(self, q: FileQueue, enc_id: str) -> Rec | None:
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
            self.quarantine(q, path, f"corrupt job record: {exc}")
            return None

    def load(self, q: FileQueue, enc_id: str, now: float, delete_expired: bool = True) -> Rec | None:
        r = self.read(q, enc_id)
        if r is not None and r.exp is not None and r.exp <= now:
            if delete_expired:
                unlink_quiet(os.path.join(q.jobs, enc_id))
            return None
        return r

    def commit(
        self,
        q: FileQueue,
        items: dict[str, Rec],
        fds: list[int] | None,
        new: set[str] | None = None,
        exists: Callable[[str], bool] | None = None,
    ) -> bool:
        """Write ``items`` (encoded id -> record) as one segment and make each
        ``jobs/<id>`` a link to it (lock held). Returns whether an expiry entry was made.

        Order: (0) the generation is bumped (see :meth:`FileQueue.bump`); (1) the segment is
        written under a temp name in ``tmp/`` and, with fsync on, its data flushed
        (``fdatasync``) before anything names it: any later flush (this step's, or another
        step's or process's flush of ``jobs/``) may make the names below durable, and a
        name must never survive a power cut without the data it names; (2) if a record
        has an expiry, ``expiry/<min ms>-s<segment id>`` is linked to it; (3) each
        ``jobs/<id>`` is linked (new ids) or atomically re-pointed (link to a temp name +
        rename over), the last one by renaming the temp name itself over it; (4) on an
        error, the temp name is unlinked. A crash before (3) leaves only a temp
        file (removed at start) and perhaps an expiry entry whose records nobody points to
        (dropped by the cleaner); during (3) each job has either its old or its new record.
        The names become durable with the caller's flush of ``jobs/`` (its group commit),
        where the change must survive (``fds``: kept for the callers' descriptors of other
        files; the segment's is closed here). A ``new`` id whose ``jobs/<id>`` exists is re-pointed if
        ``exists(id)`` says so (or there is no ``exists``), else left as it is (and its
        record is not cached): the caller's duplicate."""
        if not items:
            return False
        q.bump()
        tmp, fd, seg = write_segment(q.tmp, list(items.items()), q.spares)
        if q.spares.wanted():
            self._fill_spares(q)
        try:
            if self.settings.fsync:
                os.fdatasync(fd)
            exps = [r.exp for r in items.values() if r.exp is not None]
            if exps:
                ms = min(max(int(min(exps) * 1000), 0), (1 << 64) - 1)
                os.link(tmp, os.path.join(q.expiry, seq_name(ms, "s" + seg.uid.hex())))
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
        finally:
            if tmp:
                unlink_quiet(tmp)
            os.close(fd)
        return bool(exps)

    def link_marker(self, q: FileQueue, enc: str, directory: str, name: str) -> None:
        """Give a job its ready/delayed name: another link to its record's segment."""
        if directory == q.ready:
            q.lane_filled(name)
        elif directory == q.delayed:
            q.lane_empty.pop(DELAYED_LANE, None)
        try:
            os.link(q.jobs + "/" + enc, directory + "/" + name)
        except FileExistsError:
            pass

    def quarantine(self, q: FileQueue, path: str, why: str) -> None:
        name = os.path.basename(path)
        dest = os.path.join(q.quarantine, f"{time.time_ns():x}-{os.path.basename(os.path.dirname(path))}-{name}")
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return
        except OSError:
            unlink_quiet(path)
        log.error("trioqueue FileStorage: quarantined %s (%s) to %s", path, why, dest)
        self.publish(q, [StorageEvent("error", name, None, None, why.encode())])

    def publish(self, q: FileQueue, events: list[StorageEvent]) -> None:
        """Append events to the log (lock held). Rotation also happens under the lock, and
        every write first follows a rotation made by another process, so no event is ever
        written to a log file that subscribers have left: a subscriber reads the old file
        to its end once it sees the rotation, then the new one (see :meth:`_tail`)."""
        if not events:
            return
        self._reopen_events_if_rotated(q)
        data = "".join(_event_json(event_line(ev)) + "\n" for ev in events).encode()
        os.write(q.events_fd, data)
        q.events_written += len(data)
        if q.events_written > min(1 << 20, self.settings.event_log_max_bytes // 4):
            q.events_written = 0
            if os.fstat(q.events_fd).st_size > self.settings.event_log_max_bytes:
                # Rotate: a new file, one generation up; subscribers finish the old one
                # (still open) and switch over.
                write_atomic(q.path, "events", log_header(log_generation(q.events_fd) + 1), False)
                self._reopen_events_if_rotated(q)

    def _reopen_events_if_rotated(self, q: FileQueue) -> None:
        try:
            st = os.stat(q.events)
        except FileNotFoundError:
            st = None
        if st is None or st.st_ino != q.events_ino:
            os.close(q.events_fd)
            q.events_fd = os.open(q.events, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            q.events_ino = os.fstat(q.events_fd).st_ino

    def worker_enc(self, q: FileQueue, worker_id: str) -> str:
        enc = encode_name(worker_id)
        if enc.startswith("h"):
            p = os.path.join(q.names, enc)
            if not os.path.exists(p):
                write_atomic(q.names, enc, worker_id.encode("utf-8", "surrogatepass"), False)
        return enc

    def worker_dec(self, q: FileQueue, enc: str) -> str | None:
        name = decode_name(enc)
        if name is None:
            try:
                with open(os.path.join(q.names, enc), "rb") as f:
                    name = f.read().decode("utf-8", "surrogatepass")
            except OSError:
                return None
        return name

    def maybe_clean(self, q: FileQueue, now: float) -> None:
        if now - q.last_clean >= CLEAN_INTERVAL:
            q.last_clean = now
            self.clean_expired(q, now)

    def clean_expired(self, q: FileQueue, now: float) -> None:
        """Forget terminal jobs whose TTL has passed (lock held).

        ``expiry/<ms>-s<segment id>`` is a link to a segment holding records with an
        expiry, ``ms`` the earliest one not yet handled. A record counts only while its
        ``jobs/<id>`` still points to that segment (same inode: the link keeps the inode
        alive, so its number cannot be reused meanwhile). Once due, expired records are
        unlinked and the entry is renamed to the next expiry, or removed."""
        now_ms = int(now * 1000)
        for name in sorted(os.listdir(q.expiry)):
            parsed = split_marker(name)
            path = os.path.join(q.expiry, name)
            if parsed is None:
                unlink_quiet(path)
                continue
            ms, rest = parsed
            if ms > now_ms:
                break
            if not rest.startswith("s"):  # a per-job entry of the older layout
                r = self.read(q, rest)
                if r is not None and r.exp is not None and r.exp <= now:
                    unlink_quiet(os.path.join(q.jobs, rest))
                if r is None or r.exp is None or r.exp <= now or int(r.exp * 1000) != ms:
                    unlink_quiet(path)
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
                self.quarantine(q, path, "unreadable expiry segment")
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
                    unlink_quiet(jpath)
                else:
                    pending = min(pending, r.exp)
            if pending == math.inf:
                unlink_quiet(path)
            else:
                ms2 = min(max(int(pending * 1000), 0), (1 << 64) - 1)
                os.rename(path, os.path.join(q.expiry, seq_name(ms2, rest)))

    def promote(self, q: FileQueue, now: float, events: list[StorageEvent]) -> float:
        """Move due retries and delayed jobs to the ready list (lock held). Returns the
        next due time."""
        # Known empty like a lane (see _claim_locked): delayed/ is listed only after the
        # generation moved, this process linked a marker into it, or LANE_RECHECK.
        empty = q.lane_empty.get(DELAYED_LANE)
        if empty is not None and 0 <= now - empty < LANE_RECHECK:
            return math.inf
        names = os.listdir(q.delayed)
        if not names:
            q.lane_empty[DELAYED_LANE] = now
            return math.inf
        names.sort()
        now_ms = int(now * 1000)
        nxt = front = -1
        next_due = math.inf
        items: dict[str, Rec] = {}
        moves: list[tuple[str, str]] = []
        for name in names:
            parsed = self.marker(q, q.delayed, name)
            if parsed is None:
                continue
            ms, enc = parsed
            if ms > now_ms:
                next_due = ms / 1000
                break
            r = self.read(q, enc)
            if r is None or r.kind not in (_FAILING, _DELAYED, R.WAITING_SIGNAL) or r.mk != name or enc in items:
                unlink_quiet(os.path.join(q.delayed, name))
                continue
            if nxt < 0:
                nxt, front = q.counters()
            mk = ready_name(nxt, enc, r.priority, r.group)
            nxt += 1
            events.append(StorageEvent(R.promote(r, now_ms), r.id, token=r.token))
            r.mk = mk
            items[enc] = r
            moves.append((name, mk))
        # Records first (queued, naming their new marker), then the markers move: a crash
        # between leaves queued records without a marker, which start-up repair restores.
        self.commit(q, items, None)
        for name, mk in moves:
            q.lane_filled(mk)
            os.rename(os.path.join(q.delayed, name), os.path.join(q.ready, mk))
        if nxt >= 0:
            q.set_counters(nxt, front)
        return next_due

    def records(self, q: FileQueue, now: float) -> Iterator[tuple[str, Rec]]:
        """Every live record ``(encoded id, record)`` of ``q``, streamed from ``jobs/``
        without the lock (a segment is complete before its first link). Unreadable ones
        are skipped (the next locked step that meets them quarantines them)."""
        with os.scandir(q.jobs) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    r = read_rec(entry.path, name)
                except CorruptRecord:
                    continue
                if r is not None and (r.exp is None or r.exp > now):
                    yield name, r

    def held(self, q: FileQueue, pdir: str, worker_id: str, job_id: str, token: str) -> tuple[str, Rec] | None:
        """``(enc, record)`` of a job ``worker_id`` holds under claim ``token`` (lock held)."""
        enc = encode_name(job_id)
        r = self.read(q, enc)
        if r is None or r.kind != _PROCESSING or r.worker != worker_id or r.claim != token:
            return None
        if not q.hit and not os.path.exists(pdir + "/" + enc):
            return None  # (a hit: this process claimed it, and nobody re-pointed it since)
        return enc, r
