"""FileStorage: a persistent, single-node backend on a plain directory, without a server.

Layout (every queue name, job id and worker id is encoded with
:func:`~trioqueue.storage._fsutil.encode_name`: never a raw file name)::

    <directory>/
      locks/                  leader locks: one JSON file per lock name, ``.flock`` guards them
      q/<queue>/
        lock                  flock(2) of the queue's critical sections; holds the two
                              sequence counters (next FIFO number, next front number)
        events                append-only event log (JSON lines), rotated when large
        jobs/<id>             the job registry: a hard link to the segment holding the
                              job's current record (state, attempts, lease, TTLs, envelope,
                              result/error); re-pointed atomically (link to temp + rename)
        ready/<seq>-<id>      the ready list, FIFO by the 16-hex-digit sequence number
                              (released jobs get numbers below all others)
        proc/<worker>/<id>    a worker's processing list (the lease is in the record)
        delayed/<ms>-<id>     retries waiting until ``ms``
        expiry/<ms>-s<seg>    a link to a segment with expiring records; ``ms`` is the
                              earliest expiry still to handle (the cleaner's index)
        workers/<worker>      heartbeat files; mtime is the expiry
        names/<worker>        original id of a hashed (very long) worker name
        quarantine/           unreadable files moved aside

**Segments.** Creating an inode costs ~0.5 ms here while a link or rename costs ~20 us, so
no step creates an inode per job: each batch (an enqueue call, or the concurrent enqueue
calls of one Trio run coalesced into one group; a claim; a settlement; a heartbeat; a
reaper pass...) writes *one* segment file holding all its records, with an index by
encoded id and a CRC (see ``_fsutil``), and every name of a job is a hard link to a
segment: ``jobs/<id>``, and the markers in ``ready/``, ``delayed/`` and ``proc/`` (their
content is never read: only their names count). A segment is never written after its first
link, so readers (other processes too, without the lock) only ever see complete data;
processes cache parsed segments by their random id. The file system frees a segment when
its last link goes: no garbage collection.

**Write order** (all under the queue's ``flock``; the temp names are ``jobs/.tmp-<pid>-*``,
removed at start when their process is dead):

- enqueue: segment (temp name) -> ``jobs/<id>`` links -> ``ready/`` links -> temp name
  unlinked -> counters. Then the group commit fdatasyncs the segment and fsyncs
  ``jobs/`` and ``ready/`` before the call returns (acknowledged = on disk). Crash before
  a ``jobs/`` link: the job does not exist (it was not acknowledged). After it but before
  its ``ready/`` link: start-up repair re-links the marker under its original name.
- claim: ``rename(ready/<seq>-<id>, proc/<worker>/<id>)`` *is* the claim (atomic, so two
  consumers never both get a job); then one segment of processing records (attempts + 1,
  worker, lease) re-points ``jobs/<id>``. Crash between: the record still says queued with
  its old marker name: ``recover_stalled`` renames the entry back to ``ready/`` (the
  attempt did not happen).
- settle: segment -> ``expiry/`` link -> ``jobs/<id>`` re-pointed -> ``delayed/`` links of
  retries -> proc entries unlinked; group commit (segment, ``jobs/``, ``delayed/``,
  ``expiry/``). Crash before a re-point: the job is still processing and the reaper
  recovers it (the settlement was not acknowledged). After it: the reaper drops the stale
  proc entry; a failing record without its ``delayed/`` link gets it back at start.
- release / reaper requeue / retry promotion: the records are re-pointed first (queued,
  naming their new ready marker), then the marker is renamed into ``ready/``. Crash
  between: a queued record whose entry is still in ``proc/`` is moved back by the reaper
  ("claim interrupted"); one whose ``delayed/`` entry was not moved is restored at start.
- heartbeat: one segment with the extended leases re-points the running jobs' records.

Corrupt segments (bad magic/CRC/index) are quarantined name by name as they are met,
with an ``error`` event; a damaged segment affects every job whose current record is in
it. Blocking ``dequeue`` and ``subscribe`` wake on inotify notifications, with a slow
re-scan as a safety net. No ``syncfs``: only the group's few segment files and the touched
directories are flushed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import math
import os
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import trio

from .._core import format_state
from .._errors import ValidationError
from .._models import CancelStatus, EnqueueStatus, JobError, UpdateTTLStatus
from .._serde import encode_error
from ._base import (
    Claim,
    EnqueueOutcome,
    JobRecord,
    NewJob,
    Settlement,
    SettleKind,
    Storage,
    StorageEvent,
    ttl_update_status,
)
from ._fsutil import (
    tmp_name,
    IN_CREATE,
    IN_MODIFY,
    IN_MOVED_TO,
    CorruptRecord,
    Watch,
    Rec,
    Syncer,
    clean_tmp,
    decode_name,
    encode_name,
    Segment,
    load_fd,
    read_rec,
    replace_link,
    sync_now,
    write_atomic,
    write_segment,
)

__all__ = ["FileStorage"]

log = logging.getLogger("trioqueue.storage.file")

from ._base import CANCELLED as _CANCELLED
from ._base import COMPLETED as _COMPLETED
from ._base import DELAYED as _DELAYED
from ._base import FAILED as _FAILED
from ._base import FAILING as _FAILING
from ._base import PROCESSING as _PROCESSING
from ._base import QUEUED as _QUEUED

_QUEUED_OUTCOME = EnqueueOutcome(EnqueueStatus.QUEUED)

_SEQ_START = 1 << 62
_COUNTERS = struct.Struct("<QQ")
_EVENTS_MAX = 4 << 20  # rotate the event log past 4 MiB
_EVENT_PAYLOAD_MAX = 64 << 10  # results/errors larger than this are not copied into events
_CLEAN_INTERVAL = 1.0


def _seq_name(seq: int, enc_id: str) -> str:
    return f"{seq:016x}-{enc_id}"


def _split_marker(name: str) -> tuple[int, str] | None:
    if len(name) < 18 or name[16] != "-":
        return None
    try:
        return int(name[:16], 16), name[17:]
    except ValueError:
        return None


def _state(r: Rec) -> str:
    if r.kind == _PROCESSING:
        return format_state(_PROCESSING, r.ts, r.worker)
    if r.kind == _FAILING:
        return format_state(_FAILING, r.ts, r.attempts)
    if r.kind == _DELAYED:
        parsed = _split_marker(r.mk) if r.mk else None
        return format_state(_DELAYED, r.ts, parsed[0] if parsed else r.ts)
    return format_state(r.kind, r.ts)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _b64(b: bytes | None) -> str | None:
    if b is None or len(b) > _EVENT_PAYLOAD_MAX:
        return None
    return base64.b64encode(b).decode("ascii")


def _event_line(ev: StorageEvent) -> dict[str, object]:
    d: dict[str, object] = {"k": ev.kind, "j": ev.job_id}
    if ev.worker_id is not None:
        d["w"] = ev.worker_id
    if ev.token is not None:
        d["t"] = ev.token
    r = _b64(ev.result)
    if r is not None:
        d["r"] = r
    e = _b64(ev.error)
    if e is not None:
        d["e"] = e
    return d


def _parse_event(line: bytes) -> StorageEvent | None:
    try:
        d = json.loads(line)
        if d.get("k") == "_log":  # a log file's header line
            return StorageEvent("_log", "")
        r = d.get("r")
        e = d.get("e")
        t = d.get("t")
        return StorageEvent(
            str(d["k"]),
            str(d["j"]),
            d.get("w"),
            None if r is None else base64.b64decode(r),
            None if e is None else base64.b64decode(e),
            None if t is None else str(t),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _log_header(generation: int) -> bytes:
    """The first line of an event log file: its generation (one more per rotation)."""
    return b'{"k":"_log","g":%d}\n' % generation


def _log_generation(fd: int) -> int:
    """The generation of the event log open as ``fd`` (0: a log without a header)."""
    head = os.pread(fd, 64, 0)
    if not head.startswith(b'{"k":"_log","g":'):
        return 0
    try:
        return int(head[len(b'{"k":"_log","g":') : head.index(b"}")])
    except ValueError:
        return 0


def _stalled_error(job_id: str, worker_id: str, attempts: int) -> JobError:
    return JobError(
        "StalledJobError",
        f"job {job_id!r} stalled on worker {worker_id!r} (lease expired or worker died) "
        f"and has used all {attempts} attempts",
    )


class _Q:
    """This process's handles on one queue directory."""

    __slots__ = (
        "name",
        "path",
        "jobs",
        "ready",
        "proc",
        "delayed",
        "expiry",
        "workers",
        "names",
        "quarantine",
        "events",
        "lock_fd",
        "events_fd",
        "jobs_fd",
        "ready_fd",
        "delayed_fd",
        "expiry_fd",
        "tlock",
        "cache",
        "cache_front",
        "proc_dirs",
        "last_clean",
        "events_written",
        "watches",
        "trio_locks",
        "schedules",
        "paused",
    )

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path
        self.jobs = os.path.join(path, "jobs")
        self.ready = os.path.join(path, "ready")
        self.proc = os.path.join(path, "proc")
        self.delayed = os.path.join(path, "delayed")
        self.expiry = os.path.join(path, "expiry")
        self.workers = os.path.join(path, "workers")
        self.names = os.path.join(path, "names")
        self.quarantine = os.path.join(path, "quarantine")
        self.events = os.path.join(path, "events")
        self.schedules = os.path.join(path, "schedules")
        self.paused = os.path.join(path, "paused")
        for d in (
            self.jobs,
            self.ready,
            self.proc,
            self.delayed,
            self.expiry,
            self.workers,
            self.names,
            self.quarantine,
            self.schedules,
        ):
            os.makedirs(d, exist_ok=True)
        self.lock_fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.events_fd = os.open(self.events, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.jobs_fd = os.open(self.jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.ready_fd = os.open(self.ready, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.delayed_fd = os.open(self.delayed, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.expiry_fd = os.open(self.expiry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.tlock = threading.RLock()
        self.cache: deque[str] = deque()
        self.cache_front = -1
        self.proc_dirs: set[str] = set()
        self.last_clean = 0.0
        self.events_written = 0
        self.watches: dict[tuple[object, str], Watch] = {}
        self.trio_locks: dict[object, trio.Lock] = {}

    def trio_lock(self) -> trio.Lock:
        """This Trio run's lock for the queue: tasks of one run take turns without spinning."""
        key = trio.lowlevel.current_trio_token()
        lock = self.trio_locks.get(key)
        if lock is None:
            lock = self.trio_locks[key] = trio.Lock()
        return lock

    def watch(self, what: str) -> Watch:
        """This Trio run's shared watch of the ready list (``ready``) or events (``events``)."""
        key = (trio.lowlevel.current_trio_token(), what)
        w = self.watches.get(key)
        if w is None:
            if what == "ready":
                w = Watch([self.ready, self.delayed], IN_CREATE | IN_MOVED_TO)
            else:
                w = Watch([self.path], IN_MODIFY | IN_CREATE | IN_MOVED_TO)
            self.watches[key] = w
        return w

    def close(self) -> None:
        for w in self.watches.values():
            w.close()
        self.watches.clear()
        for fd in (self.lock_fd, self.events_fd, self.jobs_fd, self.ready_fd, self.delayed_fd, self.expiry_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- counters (call with the lock held) ---------------------------------------------

    def counters(self) -> tuple[int, int]:
        data = os.pread(self.lock_fd, _COUNTERS.size, 0)
        if len(data) < _COUNTERS.size:
            return _SEQ_START, _SEQ_START - 1
        return _COUNTERS.unpack(data)

    def set_counters(self, nxt: int, front: int) -> None:
        os.pwrite(self.lock_fd, _COUNTERS.pack(nxt, front), 0)

    def proc_dir(self, enc_worker: str) -> str:
        d = os.path.join(self.proc, enc_worker)
        if enc_worker not in self.proc_dirs:
            os.makedirs(d, exist_ok=True)
            self.proc_dirs.add(enc_worker)
        return d


class _EnqReq:
    """One enqueue call waiting for its jobs to be written by the group it joined."""

    __slots__ = ("jobs", "out", "error", "done", "moved")

    def __init__(self, jobs: Sequence[NewJob]) -> None:
        self.jobs = jobs
        self.out: list[EnqueueOutcome] | None = None
        self.error: BaseException | None = None
        self.done = trio.Event()
        self.moved = trio.Event()  # set when the group carrying it is done or gave it back


class _EnqState:
    """The enqueue coalescer of one queue in one Trio run: calls that arrive while a group
    is being written form the next group."""

    __slots__ = ("pending", "running", "idle")

    def __init__(self) -> None:
        self.pending: list[_EnqReq] = []
        self.running = False
        self.idle = trio.Event()


@contextmanager
def _close_on_error(fds: list[int]) -> Iterator[None]:
    """Close the segment descriptors a failed step opened (a finished step hands them to
    the group commit, which closes them)."""
    try:
        yield
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class FileStorage(Storage):
    """Durable storage in a directory shared by any number of processes on one machine.

    ``fsync=False`` skips the flushes (faster, survives process crashes but not power
    loss). ``rescan_interval`` is the safety-net period at which blocked ``dequeue`` calls
    and subscriptions re-check the files even without a notification. The event log is
    rotated past ``event_log_max_bytes``.
    """

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

    def __repr__(self) -> str:
        return f"FileStorage({self._root!r})"

    # -- lifecycle ---------------------------------------------------------------------

    async def _connect(self) -> None:
        await trio.to_thread.run_sync(self._connect_sync)

    def _connect_sync(self) -> None:
        os.makedirs(os.path.join(self._root, "q"), exist_ok=True)
        os.makedirs(self._locks_dir, exist_ok=True)
        self._root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._locks_fd = os.open(os.path.join(self._locks_dir, ".flock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        clean_tmp(self._locks_dir)
        qroot = os.path.join(self._root, "q")
        for enc in os.listdir(qroot):
            path = os.path.join(qroot, enc)
            if not os.path.isdir(path):
                continue
            name = decode_name(enc)
            if name is None:
                try:
                    with open(os.path.join(path, "name"), encoding="utf-8") as f:
                        name = f.read()
                except OSError:
                    continue
            self._repair(self._q(name))

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
            try:
                yield
            finally:
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
                yield
            finally:
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

    # -- records (with the lock held) ---------------------------------------------------

    def _read(self, q: _Q, enc_id: str) -> Rec | None:
        """The record, or None if absent. Corrupt records are quarantined (and None)."""
        path = os.path.join(q.jobs, enc_id)
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

    def _commit(self, q: _Q, items: dict[str, Rec], fds: list[int] | None, new: set[str] | None = None) -> bool:
        """Write ``items`` (encoded id -> record) as one segment and make each
        ``jobs/<id>`` a link to it (lock held). Returns whether an expiry entry was made.

        Order: (1) the segment is written under a temp name in ``jobs/``; (2) if a record
        has an expiry, ``expiry/<min ms>-s<segment id>`` is linked to it; (3) each
        ``jobs/<id>`` is linked (new ids) or atomically re-pointed (link to a temp name +
        rename over); (4) the temp name is unlinked. A crash before (3) leaves only a temp
        file (removed at start) and perhaps an expiry entry whose records nobody points to
        (dropped by the cleaner); during (3) each job has either its old or its new record.
        With ``fds`` (and fsync on) the descriptor is handed to the caller's group commit,
        else closed."""
        if not items:
            return False
        tmp, fd, seg = write_segment(q.jobs, list(items.items()))
        keep = False
        try:
            exps = [r.exp for r in items.values() if r.exp is not None]
            if exps:
                ms = min(max(int(min(exps) * 1000), 0), (1 << 64) - 1)
                os.link(tmp, os.path.join(q.expiry, _seq_name(ms, "s" + seg.uid.hex())))
            for enc in items:
                if new is not None and enc in new:
                    try:
                        os.link(tmp, os.path.join(q.jobs, enc))
                        continue
                    except FileExistsError:
                        pass
                replace_link(tmp, q.jobs, enc)
            keep = fds is not None and self._fsync
        finally:
            _unlink(tmp)
            if keep:
                assert fds is not None
                fds.append(fd)
            else:
                os.close(fd)
        return bool(exps)

    def _link_marker(self, q: _Q, enc: str, directory: str, name: str) -> None:
        """Give a job its ready/delayed name: another link to its record's segment."""
        try:
            os.link(os.path.join(q.jobs, enc), os.path.join(directory, name))
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
        data = "".join(json.dumps(_event_line(ev), separators=(",", ":")) + "\n" for ev in events).encode()
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
        if st is None or st.st_ino != os.fstat(q.events_fd).st_ino:
            os.close(q.events_fd)
            q.events_fd = os.open(q.events, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

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

    # -- producers ---------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        """Concurrent calls of one Trio run on one queue are coalesced: calls arriving while
        a group is being written and flushed form the next group, written as one segment
        and flushed together (each call still takes effect atomically, in arrival order).

        Cancellation: a call cancelled before its group took the lock writes nothing (and
        never strands the others: the group goes on without it); once its group holds the
        lock, the write and the flush finish (shielded) and the call then raises
        ``Cancelled``, its jobs enqueued."""
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        key = (trio.lowlevel.current_trio_token(), queue)
        st = self._enq.get(key)
        if st is None:
            st = self._enq[key] = _EnqState()
        req = _EnqReq(jobs)
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

    async def _write_group(self, q: _Q, st: _EnqState, leader: _EnqReq) -> None:
        """Lead one group: take every pending call, lock, write, unlock, flush."""
        st.running = True
        st.idle = trio.Event()
        group, st.pending = st.pending, []
        for r in group:
            r.moved = trio.Event()
        try:
            try:
                lock = self._alock(q)
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
                        await self._durable(fds, {q.jobs_fd, q.ready_fd, q.delayed_fd})
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

    def _enqueue_locked(self, q: _Q, jobs: Sequence[NewJob]) -> tuple[list[EnqueueOutcome], list[int], bool]:
        """One segment for every new job, then its ``jobs/`` and ``ready/`` (or
        ``delayed/``) links (lock held).

        Order: segment (temp name) -> ``jobs/<id>`` links -> ``ready/<seq>-<id>`` links ->
        temp name unlinked; the group commit then fdatasyncs the segment and fsyncs
        ``jobs/`` and ``ready/`` before any caller returns. A crash after a ``jobs/`` link
        but before its ``ready/`` link leaves a queued record without a marker: start-up
        repair links a new marker (the job was not acknowledged, but it is not lost)."""
        now = time.time()
        now_ms = int(now * 1000)
        outcomes: list[EnqueueOutcome] = []
        events: list[StorageEvent] = []
        fds: list[int] = []
        seen: dict[str, Rec] = {}
        items: dict[str, Rec] = {}
        with _close_on_error(fds):
            nxt, front = q.counters()
            start = nxt
            for job in jobs:
                enc = encode_name(job.id)
                r = seen.get(enc)
                if r is None:
                    r = self._load(q, enc, now)
                if r is None or r.kind == _CANCELLED:  # unknown, or a new incarnation
                    if job.run_at is not None and job.run_at > now:
                        kind, mk = _DELAYED, _seq_name(int(job.run_at * 1000), enc)
                    else:
                        kind, mk = _QUEUED, _seq_name(nxt, enc)
                        nxt += 1
                    r = Rec(job.id, kind, now_ms, 0, job.max_attempts, job.result_ttl, now_ms, job.envelope, mk)
                    r.token = job.token
                    items[enc] = r
                    seen[enc] = r
                    outcomes.append(_QUEUED_OUTCOME)
                    events.append(StorageEvent("enqueued", job.id, token=job.token))
                elif r.kind == _COMPLETED and r.result is not None:
                    outcomes.append(EnqueueOutcome(EnqueueStatus.COMPLETED, _state(r), r.result, r.token))
                else:
                    outcomes.append(EnqueueOutcome(EnqueueStatus.DUPLICATE, _state(r), token=r.token))
            if items:
                self._commit(q, items, fds, new=set(items))
                for enc, r in items.items():
                    assert r.mk is not None
                    self._link_marker(q, enc, q.ready if r.kind == _QUEUED else q.delayed, r.mk)
            if nxt != start:
                q.set_counters(nxt, front)
            self._publish(q, events)
            self._maybe_clean(q, now)
        return outcomes, fds, bool(items)

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        enc = encode_name(job_id)
        fds: list[int] = []
        wrote = False
        async with self._alock(q):
            with _close_on_error(fds):
                now = time.time()
                r = self._load(q, enc, now)
                if r is None:
                    status = CancelStatus.NOT_FOUND
                elif r.kind in (_QUEUED, _FAILING, _DELAYED):
                    marker = r.mk
                    folder = q.ready if r.kind == _QUEUED else q.delayed
                    r.kind = _CANCELLED
                    r.ts = int(now * 1000)
                    r.mk = None
                    r.exp = now + r.result_ttl
                    self._commit(q, {enc: r}, fds)
                    if marker:
                        _unlink(os.path.join(folder, marker))
                    status = CancelStatus.CANCELLED
                    wrote = True
                    self._publish(q, [StorageEvent("cancelled", job_id, token=r.token)])
                elif r.kind == _CANCELLED:
                    status = CancelStatus.CANCELLED
                elif r.kind == _PROCESSING:
                    status = CancelStatus.CANCELLED
                    if not r.cancel_requested:
                        r.cancel_requested = True
                        self._commit(q, {enc: r}, fds)
                        wrote = True
                        self._publish(q, [StorageEvent("cancel_requested", job_id, r.worker, token=r.token)])
                else:
                    status = CancelStatus(r.kind)
        await self._finish(fds, {q.jobs_fd, q.ready_fd, q.delayed_fd, q.expiry_fd}, wrote)
        return status

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        q = self._q(queue)
        enc = encode_name(job_id)
        path = os.path.join(q.jobs, enc)
        try:
            r = read_rec(path, enc)
        except CorruptRecord:
            async with self._alock(q):
                r = self._read(q, enc)  # quarantines it if still corrupt
        if r is None:
            return None
        if r.exp is not None and r.exp <= time.time():
            return None
        return JobRecord(
            r.id, _state(r), r.created, r.attempts, r.max_attempts, r.result, r.error, r.token, r.progress
        )

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        enc = encode_name(job_id)
        now = time.time()
        fds: list[int] = []
        async with self._alock(q):
            r = self._load(q, enc, now)
            refused = ttl_update_status(*((r.kind, r.result, r.error) if r else (None, None, None)))
            if refused is not None:
                status = refused
            else:
                assert r is not None
                r.exp = now + ttl
                self._commit(q, {enc: r}, fds)
                status = UpdateTTLStatus.UPDATED
        await self._finish(fds, {q.jobs_fd, q.expiry_fd}, status is UpdateTTLStatus.UPDATED)
        return status

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

    # -- consumers ---------------------------------------------------------------------

    def _promote(self, q: _Q, now: float, events: list[StorageEvent]) -> float:
        """Move due retries and delayed jobs to the ready list (lock held). Returns the
        next due time."""
        names = os.listdir(q.delayed)
        if not names:
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
            mk = _seq_name(nxt, enc)
            nxt += 1
            events.append(StorageEvent("requeued" if r.kind == _FAILING else "promoted", r.id, token=r.token))
            r.kind = _QUEUED
            r.ts = now_ms
            r.mk = mk
            items[enc] = r
            moves.append((name, mk))
        # Records first (queued, naming their new marker), then the markers move: a crash
        # between leaves queued records without a marker, which start-up repair restores.
        self._commit(q, items, None)
        for name, mk in moves:
            os.rename(os.path.join(q.delayed, name), os.path.join(q.ready, mk))
        if nxt >= 0:
            q.set_counters(nxt, front)
        return next_due

    def _claim_locked(
        self, q: _Q, worker_id: str, max_jobs: int, lease: float, start: int
    ) -> tuple[list[Claim], float]:
        claims: list[Claim] = []
        events: list[StorageEvent] = []
        now = time.time()
        next_due = self._promote(q, now, events)
        if os.path.exists(q.paused):
            self._publish(q, events)
            return claims, next_due
        now_ms = int(now * 1000)
        deadline = now + lease
        enc_w = self._worker_enc(q, worker_id)
        pdir = q.proc_dir(enc_w)
        _, front = q.counters()
        if front != q.cache_front:
            q.cache.clear()
        listed = False
        items: dict[str, Rec] = {}
        while len(claims) < max_jobs:
            if not q.cache:
                if listed:
                    break
                listed = True
                q.cache = deque(sorted(os.listdir(q.ready)))
                q.cache_front = front
                if not q.cache:
                    break
            name = q.cache.popleft()
            parsed = self._marker(q, q.ready, name)
            if parsed is None:
                continue
            enc = parsed[1]
            target = os.path.join(pdir, enc)
            try:
                os.rename(os.path.join(q.ready, name), target)
            except FileNotFoundError:
                continue  # claimed by someone else, or cancelled
            r = self._read(q, enc)
            if r is None or r.kind != _QUEUED or r.mk != name:
                _unlink(target)  # stale marker (cancelled job, or an old copy)
                continue
            r.kind = _PROCESSING
            r.ts = now_ms
            r.worker = worker_id
            r.claims += 1
            r.claim = f"{r.token}.{r.claims}"
            r.started = len(claims) < start
            if r.started:
                r.attempts += 1
            r.mk = None
            r.lease = deadline
            items[enc] = r
            claims.append(Claim(r.id, r.envelope, r.attempts + (not r.started), r.claim, r.started))
        # The renames above are the claims; then one segment of processing records
        # (attempts, worker, lease). A crash between leaves proc entries whose record is
        # still queued: recover_stalled puts them back in ready/ (no attempt counted).
        self._commit(q, items, None)
        self._publish(q, events)
        self._maybe_clean(q, now)
        return claims, next_due

    async def _claim(
        self, q: _Q, worker_id: str, max_jobs: int, lease: float, start: int
    ) -> tuple[list[Claim], float]:
        async with self._alock(q):
            return self._claim_locked(q, worker_id, max_jobs, lease, start)

    async def dequeue(
        self, queue: str, worker_id: str, max_jobs: int, timeout: float, lease: float, start: int | None = None
    ) -> list[Claim]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        start = max_jobs if start is None else start
        give_up = trio.current_time() + timeout
        watch = q.watch("ready")
        while True:
            gen = watch.gen
            # The lock wait is the only cancellable step: once claimed, the claims are returned.
            claims, next_due = await self._claim(q, worker_id, max_jobs, lease, start)
            if claims:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return claims
            left = give_up - trio.current_time()
            if left <= 0:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return []
            await watch.wait(gen, min(left, self._rescan, max(next_due - time.time(), 0.0) + 0.001))

    def _cancel_claimed(self, q: _Q, r: Rec, now: float, worker_id: str, events: list[StorageEvent]) -> None:
        """End a claimed job as cancelled (its proc entry is the caller's to remove)."""
        r.kind = _CANCELLED
        r.ts = int(now * 1000)
        r.worker = None
        r.lease = None
        r.started = False
        r.mk = None
        r.exp = now + r.result_ttl
        events.append(StorageEvent("cancelled", r.id, worker_id, token=r.token))

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """One segment for the whole call. Order: segment -> expiry entry -> ``jobs/<id>``
        re-pointed -> ``delayed/`` links of retries -> proc entries unlinked; then the
        group commit. A crash before a job's record is re-pointed leaves it processing
        (the reaper recovers it: the settlement was not acknowledged); after it, the stale
        proc entry is dropped by the reaper, and a missing ``delayed/`` link of a failing
        record is restored at start. Fenced by the claim token; a settlement of a claim
        that is already settled (a retried call) answers True and changes nothing."""
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        out: list[bool] = []
        events: list[StorageEvent] = []
        fds: list[int] = []
        dirs = {q.jobs_fd}
        items: dict[str, Rec] = {}
        retries: list[tuple[str, str]] = []
        async with self._alock(q):
            with _close_on_error(fds):
                now = time.time()
                now_ms = int(now * 1000)
                pdir = os.path.join(q.proc, self._worker_enc(q, worker_id))
                for s in settlements:
                    enc = encode_name(s.id)
                    marker = os.path.join(pdir, enc)
                    r = self._read(q, enc) if enc not in items else None
                    held = (
                        r is not None
                        and r.kind == _PROCESSING
                        and r.worker == worker_id
                        and r.claim == s.token
                        and os.path.exists(marker)
                    )
                    if r is None or not held:
                        if r is not None and r.claim == s.token and r.kind != _PROCESSING:
                            out.append(True)  # settled by this very claim already: a retried call
                            continue
                        out.append(False)
                        events.append(StorageEvent("fenced", s.id, worker_id, token=r.token if r else None))
                        continue
                    out.append(True)
                    if not r.started and s.kind is not SettleKind.CANCEL:
                        r.attempts += 1  # settled without start(): the attempt happened
                    r.ts = now_ms
                    r.worker = None
                    r.lease = None
                    if s.kind is SettleKind.CANCEL or (s.kind is SettleKind.RETRY and r.cancel_requested):
                        self._cancel_claimed(q, r, now, worker_id, events)
                    elif s.kind is SettleKind.COMPLETE:
                        r.kind = _COMPLETED
                        r.result = s.data
                        r.exp = now + s.ttl
                        events.append(StorageEvent("completed", s.id, worker_id, result=s.data, token=r.token))
                    elif s.kind is SettleKind.FAIL:
                        r.kind = _FAILED
                        r.error = s.data
                        r.exp = now + s.ttl
                        events.append(StorageEvent("failed", s.id, worker_id, error=s.data, token=r.token))
                    else:
                        run_ms = int((now + s.delay) * 1000)
                        mk = _seq_name(run_ms, enc)
                        r.kind = _FAILING
                        r.error = s.data
                        r.mk = mk
                        retries.append((enc, mk))
                        events.append(StorageEvent("failing", s.id, worker_id, error=s.data, token=r.token))
                    items[enc] = r
                if self._commit(q, items, fds):
                    dirs.add(q.expiry_fd)
                for enc, mk in retries:
                    self._link_marker(q, enc, q.delayed, mk)
                if retries:
                    dirs.add(q.delayed_fd)
                for enc in items:
                    _unlink(os.path.join(pdir, enc))
                self._publish(q, events)
        await self._finish(fds, dirs, bool(items))
        return out

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str]) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        events: list[StorageEvent] = []
        n = 0
        async with self._alock(q):
            now = time.time()
            now_ms = int(now * 1000)
            pdir = os.path.join(q.proc, self._worker_enc(q, worker_id))
            nxt, front = q.counters()
            # Released jobs go before everything, in the order given.
            todo = []
            cancelled: dict[str, Rec] = {}
            seen: set[str] = set()
            for job_id in job_ids:
                enc = encode_name(job_id)
                marker = os.path.join(pdir, enc)
                if enc in seen or not os.path.exists(marker):
                    continue
                r = self._read(q, enc)
                if r is None or r.kind != _PROCESSING or r.worker != worker_id:
                    _unlink(marker)
                    continue
                seen.add(enc)
                if r.cancel_requested:
                    self._cancel_claimed(q, r, now, worker_id, events)
                    cancelled[enc] = r
                    continue
                todo.append((enc, marker, r))
            front -= len(todo)
            items: dict[str, Rec] = dict(cancelled)
            for i, (enc, marker, r) in enumerate(todo):
                r.kind = _QUEUED
                r.ts = now_ms
                r.worker = None
                r.lease = None
                r.started = False
                r.claim = None
                r.mk = _seq_name(front + 1 + i, enc)
                items[enc] = r
            # Records first, then the markers move back (a crash between: the reaper sees a
            # queued record whose marker is still in proc/ and moves it to ready/).
            self._commit(q, items, None)
            for enc in cancelled:
                _unlink(os.path.join(pdir, enc))
            for enc, marker, r in todo:
                assert r.mk is not None
                os.rename(marker, os.path.join(q.ready, r.mk))
                events.append(StorageEvent("requeued", r.id, worker_id, token=r.token))
                n += 1
            if todo:
                q.set_counters(nxt, front)
            self._publish(q, events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return n

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        q = self._q(queue)
        pdir = os.path.join(q.proc, encode_name(worker_id))
        try:
            names = os.listdir(pdir)
        except FileNotFoundError:
            return []
        out = []
        for enc in names:
            if enc.startswith("."):
                continue
            job_id = decode_name(enc)
            if job_id is None:
                r = self._read(q, enc)
                if r is None:
                    continue
                job_id = r.id
            out.append(job_id)
        return out

    def _held(self, q: _Q, pdir: str, worker_id: str, job_id: str, token: str) -> tuple[str, Rec] | None:
        """``(enc, record)`` of a job ``worker_id`` holds under claim ``token`` (lock held)."""
        enc = encode_name(job_id)
        if not os.path.exists(os.path.join(pdir, enc)):
            return None
        r = self._read(q, enc)
        if r is None or r.kind != _PROCESSING or r.worker != worker_id or r.claim != token:
            return None
        return enc, r

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        out: list[bool] = []
        events: list[StorageEvent] = []
        items: dict[str, Rec] = {}
        fds: list[int] = []
        async with self._alock(q):
            with _close_on_error(fds):
                now = time.time()
                pdir = os.path.join(q.proc, self._worker_enc(q, worker_id))
                gone: list[str] = []
                for job_id, token in claims:
                    found = self._held(q, pdir, worker_id, job_id, token)
                    if found is None:
                        out.append(False)
                        continue
                    enc, r = found
                    if r.cancel_requested and not r.started:
                        self._cancel_claimed(q, r, now, worker_id, events)
                        items[enc] = r
                        gone.append(enc)
                        out.append(False)
                        continue
                    if not r.started:
                        r.started = True
                        r.attempts += 1
                        items[enc] = r
                    out.append(True)
                self._commit(q, items, fds)
                for enc in gone:
                    _unlink(os.path.join(pdir, enc))
                self._publish(q, events)
        await self._finish(fds, {q.jobs_fd, q.expiry_fd}, bool(items))
        return out

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        now = time.time()
        enc_w = self._worker_enc(q, worker_id)
        wpath = os.path.join(q.workers, enc_w)
        exp = now + ttl
        try:
            os.utime(wpath, (exp, exp))
        except FileNotFoundError:
            os.close(os.open(wpath, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            os.utime(wpath, (exp, exp))
        requested: list[str] = []
        if claims:
            # The lease lives in the processing record: one new segment for all of them.
            pdir = os.path.join(q.proc, enc_w)
            deadline = now + lease
            items: dict[str, Rec] = {}
            async with self._alock(q):
                for job_id, token in claims:
                    found = self._held(q, pdir, worker_id, job_id, token)
                    if found is None or found[0] in items:
                        continue
                    enc, r = found
                    r.lease = deadline
                    items[enc] = r
                    if r.cancel_requested:
                        requested.append(job_id)
                self._commit(q, items, None)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return requested

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        enc_w = encode_name(worker_id)
        async with self._alock(q):
            _unlink(os.path.join(q.workers, enc_w))
            try:
                os.rmdir(os.path.join(q.proc, enc_w))
                q.proc_dirs.discard(enc_w)
            except OSError:
                pass
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint()
        q = self._q(queue)
        now = time.time()
        out = {}
        for enc in os.listdir(q.workers):
            if enc.startswith("."):
                continue
            t = _mtime(os.path.join(q.workers, enc))
            if t is None or (t <= now and not include_expired):
                continue
            w = self._worker_dec(q, enc)
            if w is not None:
                out[w] = t
        return out

    # -- progress, pause, schedules ----------------------------------------------------

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        async with self._alock(q):
            pdir = os.path.join(q.proc, self._worker_enc(q, worker_id))
            found = self._held(q, pdir, worker_id, job_id, token)
            if found is not None:
                enc, r = found
                r.progress = progress
                self._commit(q, {enc: r}, None)
                self._publish(q, [StorageEvent("progress", job_id, worker_id, result=progress, token=r.token)])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found is not None

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        async with self._alock(q):
            changed = os.path.exists(q.paused) != paused
            if changed:
                if paused:
                    write_atomic(q.path, "paused", b"", False)
                else:
                    _unlink(q.paused)
                    # Wake blocked claims (they watch ready/): a temp file created and removed.
                    wake = os.path.join(q.ready, tmp_name())
                    os.close(os.open(wake, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                    _unlink(wake)
                self._publish(q, [StorageEvent("paused" if paused else "resumed", "")])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return changed

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        return os.path.exists(self._q(queue).paused)

    async def put_schedule(self, queue: str, name: str, spec: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        async with self._alock(q):
            _, last = self._schedule(q, name) or (b"", None)
            self._write_schedule(q, name, spec, last)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        async with self._alock(q):
            found = _unlink(os.path.join(q.schedules, encode_name(name)))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint()
        q = self._q(queue)
        out: dict[str, tuple[bytes, float | None]] = {}
        for enc in os.listdir(q.schedules):
            if enc.startswith("."):
                continue
            entry = self._schedule_file(q, enc)
            if entry is not None:
                out[entry[0]] = (entry[1], entry[2])
        return out

    async def advance_schedule(self, queue: str, name: str, tick: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        async with self._alock(q):
            entry = self._schedule(q, name)
            ok = entry is not None and (entry[1] is None or tick > entry[1])
            if entry is not None and ok:
                self._write_schedule(q, name, entry[0], tick)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    def _schedule(self, q: _Q, name: str) -> tuple[bytes, float | None] | None:
        entry = self._schedule_file(q, encode_name(name))
        return None if entry is None else (entry[1], entry[2])

    def _schedule_file(self, q: _Q, enc: str) -> tuple[str, bytes, float | None] | None:
        path = os.path.join(q.schedules, enc)
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            last = d["last"]
            return str(d["name"]), base64.b64decode(d["spec"]), None if last is None else float(last)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            self._quarantine(q, path, f"unreadable schedule: {exc}")
            return None

    def _write_schedule(self, q: _Q, name: str, spec: bytes, last: float | None) -> None:
        data = json.dumps({"name": name, "spec": base64.b64encode(spec).decode("ascii"), "last": last}).encode()
        fd = write_atomic(q.schedules, encode_name(name), data, self._fsync)
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dfd = os.open(q.schedules, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        recovered: list[tuple[str, str]] = []
        events: list[StorageEvent] = []
        next_deadline = math.inf
        fds: list[int] = []
        dirs = {q.jobs_fd, q.ready_fd}
        async with self._alock(q):
            with _close_on_error(fds):
                now = time.time()
                now_ms = int(now * 1000)
                self._clean_expired(q, now)
                q.last_clean = now
                next_deadline = self._promote(q, now, events)
                nxt, front = q.counters()
                start = nxt
                items: dict[str, Rec] = {}
                requeue: list[tuple[str, str]] = []  # (proc entry, new ready name)
                drop: list[str] = []
                dead: list[str] = []
                for enc_w in os.listdir(q.proc):
                    pdir = os.path.join(q.proc, enc_w)
                    alive_until = _mtime(os.path.join(q.workers, enc_w)) or 0.0
                    try:
                        names = os.listdir(pdir)
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    worker_id = None
                    for enc in names:
                        if enc.startswith(".") or enc in items:
                            continue
                        marker = os.path.join(pdir, enc)
                        r = self._read(q, enc)
                        if r is None or r.kind != _PROCESSING:
                            if r is not None and r.kind == _QUEUED and r.mk and not os.path.exists(
                                os.path.join(q.ready, r.mk)
                            ):
                                # Claim interrupted before the record was updated: undo it.
                                os.rename(marker, os.path.join(q.ready, r.mk))
                            else:
                                _unlink(marker)
                            continue
                        lease = r.lease if r.lease is not None else _mtime(marker)
                        if lease is None:
                            continue
                        if lease > now and alive_until > now:
                            next_deadline = min(next_deadline, lease, alive_until)
                            continue
                        if worker_id is None:
                            worker_id = self._worker_dec(q, enc_w) or enc_w
                        events.append(StorageEvent("stalled", r.id, worker_id, token=r.token))
                        r.worker = None
                        r.lease = None
                        r.claim = None
                        r.ts = now_ms
                        if r.cancel_requested:
                            self._cancel_claimed(q, r, now, worker_id, events)
                            drop.append(marker)
                            recovered.append((r.id, "cancelled"))
                        elif not r.started or r.attempts < r.max_attempts:
                            # A reserved claim never ran: it goes back at no cost.
                            mk = _seq_name(nxt, enc)
                            nxt += 1
                            r.kind = _QUEUED
                            r.started = False
                            r.mk = mk
                            requeue.append((marker, mk))
                            events.append(StorageEvent("requeued", r.id, worker_id, token=r.token))
                            recovered.append((r.id, "requeued"))
                        else:
                            r.kind = _FAILED
                            r.error = encode_error(_stalled_error(r.id, worker_id, r.attempts))
                            r.exp = now + r.result_ttl
                            drop.append(marker)
                            events.append(StorageEvent("failed", r.id, worker_id, error=r.error, token=r.token))
                            recovered.append((r.id, "failed"))
                        items[enc] = r
                    if alive_until <= now:
                        dead.append(enc_w)
                # Records first, then the proc entries move back to ready/ (or go): a crash
                # between leaves queued records whose entry is still in proc/, which the
                # next pass moves back ("claim interrupted"), and failed records whose stale
                # entry it drops.
                if self._commit(q, items, fds):
                    dirs.add(q.expiry_fd)
                for marker, mk in requeue:
                    os.rename(marker, os.path.join(q.ready, mk))
                for marker in drop:
                    _unlink(marker)
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
                    expiry = _mtime(os.path.join(q.workers, enc_w))
                    if expiry is not None and expiry <= now:
                        pdir = os.path.join(q.proc, enc_w)
                        if not os.path.isdir(pdir) or not [n for n in os.listdir(pdir) if not n.startswith(".")]:
                            _unlink(os.path.join(q.workers, enc_w))
                            try:
                                os.rmdir(pdir)
                                q.proc_dirs.discard(enc_w)
                            except OSError:
                                pass
                if nxt != start:
                    q.set_counters(nxt, front)
                self._publish(q, events)
        await self._finish(fds, dirs, bool(items))
        return recovered, (None if next_deadline == math.inf else next_deadline)

    @contextmanager
    def _locks_locked(self) -> Iterator[None]:
        if self._locks_fd < 0:
            raise RuntimeError("FileStorage is not open")
        fcntl.flock(self._locks_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._locks_fd, fcntl.LOCK_UN)

    def _lock_holder(self, path: str) -> tuple[str, float] | None:
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            return str(d["owner"]), float(d["exp"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):
            return None  # damaged: treat as free

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        enc = encode_name(name)
        path = os.path.join(self._locks_dir, enc)
        with self._locks_locked():
            now = time.time()
            holder = self._lock_holder(path)
            ok = holder is None or holder[0] == owner or holder[1] <= now
            if ok:
                data = json.dumps({"name": name, "owner": owner, "exp": now + ttl}).encode()
                write_atomic(self._locks_dir, enc, data, False)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        path = os.path.join(self._locks_dir, encode_name(name))
        with self._locks_locked():
            holder = self._lock_holder(path)
            ok = holder is not None and holder[0] == owner
            if ok:
                _unlink(path)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    # -- events ------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(self, queue: str) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        q = self._q(queue)
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        watch = q.watch("events")
        fd = os.open(q.events, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        offset = os.fstat(fd).st_size
        gen = watch.gen
        await trio.lowlevel.checkpoint()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tail, q, watch, gen, fd, offset, send)
            try:
                yield receive
            finally:
                nursery.cancel_scope.cancel()
                receive.close()

    async def _tail(
        self, q: _Q, watch: Watch, gen: int, fd: int, offset: int, send: trio.MemorySendChannel[list[StorageEvent]]
    ) -> None:
        """Follow the event log across rotations without losing an event: when the path
        names a new file, the old one is read to its end *after* the rotation was seen (all
        writes to it happened before the rotation, under the lock), then the new one from
        its start. Only a reader that fell more than a whole file behind (the generation
        jumped) or a damaged line gets a ``resync``."""
        buf = b""
        log_gen = _log_generation(fd)
        try:
            while True:
                await watch.wait(gen, self._rescan)
                gen = watch.gen
                batch: list[StorageEvent] = []
                while True:
                    data = os.pread(fd, 1 << 20, offset)
                    if data:
                        offset += len(data)
                        buf += data
                        end = buf.rfind(b"\n")
                        if end >= 0:
                            lines, buf = buf[: end + 1], buf[end + 1 :]
                            for line in lines.splitlines():
                                ev = _parse_event(line)
                                if ev is None:
                                    batch.append(StorageEvent("resync", ""))
                                elif ev.kind != "_log":
                                    batch.append(ev)
                        if len(data) == 1 << 20:
                            continue
                    size = os.fstat(fd).st_size
                    if size < offset:  # truncated under us
                        batch.append(StorageEvent("resync", ""))
                        offset = 0
                        buf = b""
                        continue
                    try:
                        st = os.stat(q.events)
                    except FileNotFoundError:
                        break
                    if st.st_ino != os.fstat(fd).st_ino:
                        # Rotated. Finish the old file first: it may have grown since the
                        # last read (before the rotation we just saw).
                        while data := os.pread(fd, 1 << 20, offset):
                            offset += len(data)
                            buf += data
                        for line in buf.splitlines():
                            ev = _parse_event(line)
                            if ev is not None and ev.kind != "_log":
                                batch.append(ev)
                        os.close(fd)
                        fd = os.open(q.events, os.O_RDONLY | os.O_CLOEXEC)
                        offset = 0
                        buf = b""
                        new_gen = _log_generation(fd)
                        if new_gen != log_gen + 1:  # a whole file went by unread
                            batch.append(StorageEvent("resync", ""))
                        log_gen = new_gen
                        continue
                    break
                if batch:
                    try:
                        send.send_nowait(batch)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        return
        finally:
            os.close(fd)
            send.close()

    # -- start-up repair -----------------------------------------------------------------

    def _repair(self, q: _Q) -> None:
        """At start: remove temp files of dead processes, put back ready markers that a
        crash between the record write and the marker creation left missing, and
        quarantine unreadable records."""
        with self._locked(q):
            for d in (q.path, q.jobs, q.ready, q.delayed, q.names):
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
            for name in os.listdir(q.ready):
                parsed = _split_marker(name)
                if parsed is not None:
                    max_seq = max(max_seq, parsed[0])
            nxt = max_seq + 1
            now = time.time()
            items: dict[str, Rec] = {}
            relink: list[tuple[str, str]] = []
            delayed: list[tuple[str, str]] = []
            for enc in os.listdir(q.jobs):
                if enc.startswith("."):
                    continue
                r = self._read(q, enc)
                if r is None:
                    continue
                if r.exp is not None and r.exp <= now:
                    _unlink(os.path.join(q.jobs, enc))
                    continue
                if r.kind == _QUEUED:
                    parsed = _split_marker(r.mk) if r.mk else None
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
                elif r.kind in (_FAILING, _DELAYED):
                    if r.mk and not os.path.exists(os.path.join(q.delayed, r.mk)):
                        delayed.append((enc, r.mk))
            for enc, r in sorted(items.items(), key=lambda kv: kv[1].created):
                r.mk = _seq_name(nxt, enc)
                nxt += 1
            # New records (naming the new markers) first, then the markers: links to them.
            fds: list[int] = []
            self._commit(q, items, fds)
            for enc, r in items.items():
                assert r.mk is not None
                self._link_marker(q, enc, q.ready, r.mk)
            for enc, mk in relink:
                self._link_marker(q, enc, q.ready, mk)
            for enc, mk in delayed:
                self._link_marker(q, enc, q.delayed, mk)
            fixed = len(items) + len(relink) + len(delayed)
            q.set_counters(nxt, front)
            if fixed:
                log.warning("trioqueue FileStorage: restored %d ready markers in %s", fixed, q.path)
            if self._fsync:
                sync_now(fds, {q.jobs_fd, q.ready_fd, q.delayed_fd})
