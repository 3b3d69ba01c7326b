"""FileStorage's on-disk layout and the helpers every part uses (see the package docstring)."""

from __future__ import annotations

import base64
import json
import logging
import mmap
import os
import struct
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio

from ..._model._types import DEFAULT_PRIORITY, MAX_PRIORITY, EnqueueStatus
from .. import _rules as R
from .._base import JobRecord, EnqueueOutcome, NewJob, StorageEvent, job_record
from ._fsutil import Rec, Spares
from ._fsutil import unlink_quiet as unlink_quiet  # re-exported: the parts import it from here
from ._groups import GroupDisk, group_marker
from ._inotify import IN_CREATE, IN_MODIFY, IN_MOVED_TO, Watch

log = logging.getLogger("trioqueue.storage.file")

from .._rules import TERMINAL_KINDS as _TERMINAL  # records the cache does not keep


def _rec_bytes(r: Rec) -> int:
    return 256 + len(r.envelope) + len(r.result or b"") + len(r.error or b"") + len(r.progress or b"") + len(r.steps or b"") + len(r.signals or b"")

QUEUED_OUTCOME = EnqueueOutcome(EnqueueStatus.QUEUED)

_SEQ_START = 1 << 62
_COUNTERS = struct.Struct("<QQ")
_HEAD = struct.Struct("<QQQ")  # the lock file: the two counters, then the generation
_GEN = struct.Struct("<Q")
_RECS_MAX = 32768  # records in a queue's record cache
_RECS_BYTES = 16 << 20  # ... and their payload bytes
LANE_RECHECK = 0.05  # seconds a lane known to be empty is not listed again (see FileQueue)
DELAYED_LANE = -1  # delayed/'s key in FileQueue.lane_empty
EVENTS_MAX = 4 << 20  # rotate the event log past 4 MiB
_EVENT_PAYLOAD_MAX = 64 << 10  # results/errors larger than this are not copied into events
CLEAN_INTERVAL = 1.0


def seq_name(seq: int, enc_id: str) -> str:
    return f"{seq:016x}-{enc_id}"


def due_event(delayed: list[tuple[str, str]]) -> StorageEvent:
    """The ``due`` event of jobs that entered ``delayed/`` (``(enc, marker name)`` pairs):
    the earliest due time of them (a marker's name starts with it)."""
    return StorageEvent("due", "", result=b"%d" % int(min(mk for _, mk in delayed)[:16], 16))


def ready_name(seq: int, enc_id: str, priority: int, group: str | None = None) -> str:
    """A ready marker's name, relative to ``ready/``: the default priority's lane is
    ``ready/`` itself (the layout before priorities), the others ``ready/p<n>/``; a
    job of a group is in its group's lane (``ready/g/<group>/p<n>/``, see ``_groups``)."""
    name = seq_name(seq, enc_id)
    if group is not None:
        return group_marker(name, priority, group)
    return name if priority == DEFAULT_PRIORITY else f"p{priority}/{name}"


def split_ready(mk: str) -> tuple[int, str] | None:
    """``(number, encoded id)`` of a ready marker name made by :func:`ready_name`."""
    if mk[:2] == "g/":
        return split_marker(mk.rsplit("/", 1)[-1])
    return split_marker(mk[3:] if mk[:1] == "p" and mk[2:3] == "/" else mk)


def is_lane_dir(name: str) -> bool:
    """A directory of ``ready/``: a priority's lane, the group lanes or the rings."""
    return (len(name) == 2 and name[0] == "p" and name[1].isdigit()) or name in ("g", "ring")


def split_marker(name: str) -> tuple[int, str] | None:
    if len(name) < 18 or name[16] != "-":
        return None
    try:
        return int(name[:16], 16), name[17:]
    except ValueError:
        return None


def state_of(r: Rec) -> str:
    return r.state()  # (a delayed job's due time is in its marker's name: Rec.state)


def to_job_record(r: Rec) -> JobRecord:
    """The storage-interface view of a record."""
    return job_record(r)


def enqueue_outcome(r: Rec) -> EnqueueOutcome:
    """The outcome of enqueueing an id that has the record ``r``."""
    if (result := R.existing_outcome(r)) is not None:
        return EnqueueOutcome(EnqueueStatus.COMPLETED, state_of(r), result, r.token)
    return EnqueueOutcome(EnqueueStatus.DUPLICATE, state_of(r), token=r.token)


def mtime_of(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _b64(b: bytes | None) -> str | None:
    if b is None or len(b) > _EVENT_PAYLOAD_MAX:
        return None
    return base64.b64encode(b).decode("ascii")


def event_line(ev: StorageEvent) -> dict[str, object]:
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


def parse_event(line: bytes) -> StorageEvent | None:
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


def log_header(generation: int) -> bytes:
    """The first line of an event log file: its generation (one more per rotation)."""
    return b'{"k":"_log","g":%d}\n' % generation


def log_generation(fd: int) -> int:
    """The generation of the event log open as ``fd`` (0: a log without a header)."""
    head = os.pread(fd, 64, 0)
    if not head.startswith(b'{"k":"_log","g":'):
        return 0
    try:
        return int(head[len(b'{"k":"_log","g":') : head.index(b"}")])
    except ValueError:
        return 0


class FileQueue:
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
        "lanes",
        "lane_fds",
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
        "tmp",
        "owner",
        "gen",
        "bumped",
        "ctr",
        "recs",
        "recs_bytes",
        "lane_empty",
        "hit",
        "events_ino",
        "head",
        "grp",
        "spares",
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
        self.tmp = os.path.join(path, "tmp")  # temp names (segments being written, re-points)
        for d in (
            self.tmp,
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
        self.events_ino = os.fstat(self.events_fd).st_ino  # to notice a rotation by another process
        self.jobs_fd = os.open(self.jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.ready_fd = os.open(self.ready, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # The ready list's lanes by priority (0 first): ``ready/`` for the default, else
        # ``ready/p<n>/``; each is FIFO by marker number.
        self.lanes = [
            self.ready if p == DEFAULT_PRIORITY else os.path.join(self.ready, f"p{p}") for p in range(MAX_PRIORITY + 1)
        ]
        made = False
        for lane in self.lanes:
            if lane != self.ready and not os.path.isdir(lane):
                os.makedirs(lane, exist_ok=True)
                made = True
        if made:
            os.fsync(self.ready_fd)
        self.lane_fds = [
            self.ready_fd if lane == self.ready else os.open(lane, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            for lane in self.lanes
        ]
        self.delayed_fd = os.open(self.delayed, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.expiry_fd = os.open(self.expiry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.tlock = threading.RLock()
        self.cache: list[deque[str]] = [deque() for _ in self.lanes]  # per lane: sorted names
        self.cache_front = -1
        self.proc_dirs: set[str] = set()
        self.last_clean = 0.0
        self.events_written = 0
        self.watches: dict[tuple[object, str], Watch] = {}
        self.trio_locks: dict[object, trio.Lock] = {}
        # The locked section's state (see begin()): the thread holding the lock, the
        # generation seen at its start, whether this section bumped it, the counters.
        self.owner = 0
        self.gen = -1
        self.bumped = False
        self.ctr: tuple[int, int] | None = None
        # The record cache: encoded id -> (record, segment inode, size, mtime_ns) of the
        # records this process wrote itself (not terminal ones), valid while the
        # generation is the one seen after this process's last write and jobs/<id> still
        # names that very file (see FileCore.read).
        self.recs: dict[str, tuple[Rec, int, int, int]] = {}
        self.recs_bytes = 0
        # Lanes a claim found empty (and delayed/, as DELAYED_LANE): lane -> time listed. Forgotten when another process
        # bumps the generation (every enqueue, release, promotion... commits records
        # first), when this process adds a marker to the lane, and after LANE_RECHECK
        # (a writer of the older code, which bumps no generation, is seen that late).
        self.lane_empty: dict[int, float] = {}
        self.hit = False  # the last FileCore.read came from the record cache
        # The lock file's counters and generation, mapped (at the first section): read
        # and written without a system call, and without the inotify IN_MODIFY a write
        # would send to everyone watching the queue directory for events (mmap writes
        # send none). The older code's pread/pwrite of the counters see the same pages.
        self.head: mmap.mmap | None = None
        self.grp = GroupDisk(path, self.ready)  # groups: rings, group lanes (see _groups)
        self.spares = Spares(self.tmp)  # empty files for segments, made ahead (see Spares)

    # -- the locked section (call with the lock held) -----------------------------------

    def begin(self) -> None:
        """Start of a locked section: the counters and the generation read (from the
        mapped lock file). A generation other than the one this process left means
        another process changed records (or ready markers) since: the record cache and
        lane knowledge go."""
        head = self.head
        if head is None:
            head = self._map_head()
        nxt, front, gen = _HEAD.unpack_from(head, 0)
        self.ctr = (nxt, front)
        if gen != self.gen:
            self.forget()
            self.gen = gen
        self.bumped = False
        self.owner = threading.get_ident()

    def _map_head(self) -> mmap.mmap:
        """Map the lock file's first 24 bytes (lock held): a shorter file (new, or of
        the older code) first gets its counters (the defaults if absent) and generation 0
        written, so the map never reaches past its end."""
        data = os.pread(self.lock_fd, _HEAD.size, 0)
        if len(data) < _HEAD.size:
            nxt, front = _COUNTERS.unpack_from(data) if len(data) >= _COUNTERS.size else (_SEQ_START, _SEQ_START - 1)
            os.pwrite(self.lock_fd, _HEAD.pack(nxt, front, 0), 0)
        self.head = mmap.mmap(self.lock_fd, _HEAD.size)
        return self.head

    def end(self) -> None:
        self.owner = 0
        self.ctr = None

    def bump(self) -> None:
        """Before this section's first change of a record or a ready marker: the
        generation goes up (written before the change, so a crash after it costs only a
        spurious invalidation), and other processes drop their caches at their next
        section."""
        if self.owner != threading.get_ident():
            # Not in a section of this thread (a caller holding the lock some other way):
            # bump the file only; this process's own caches go at its next section too.
            data = os.pread(self.lock_fd, _HEAD.size, 0)
            if len(data) < _COUNTERS.size:
                data = _COUNTERS.pack(_SEQ_START, _SEQ_START - 1)
            gen = _GEN.unpack_from(data, 16)[0] + 1 if len(data) >= _HEAD.size else 1
            os.pwrite(self.lock_fd, data[: _COUNTERS.size] + _GEN.pack(gen), 0)
            return
        if self.bumped:
            return
        self.gen += 1
        assert self.head is not None  # mapped by begin()
        _GEN.pack_into(self.head, 16, self.gen)
        self.bumped = True

    def forget(self) -> None:
        self.recs.clear()
        self.recs_bytes = 0
        self.lane_empty.clear()
        self.grp.changes += 1  # (rings found empty may be listed again: see GroupDisk.list_at)

    def remember(self, enc: str, r: Rec, ino: int, size: int, mtime_ns: int) -> None:
        """Cache a copy of a record this process just wrote (segment ``ino``...)."""
        old = self.recs.pop(enc, None)
        if old is not None:
            self.recs_bytes -= _rec_bytes(old[0])
        if r.kind in _TERMINAL:
            return
        n = _rec_bytes(r)
        while self.recs and (len(self.recs) >= _RECS_MAX or self.recs_bytes + n > _RECS_BYTES):
            k = next(iter(self.recs))
            self.recs_bytes -= _rec_bytes(self.recs.pop(k)[0])
        self.recs[enc] = (r.copy(), ino, size, mtime_ns)
        self.recs_bytes += n

    def drop(self, enc: str) -> None:
        old = self.recs.pop(enc, None)
        if old is not None:
            self.recs_bytes -= _rec_bytes(old[0])

    def lane_filled(self, mk: str) -> None:
        """This process adds the ready marker ``mk``: its lane is not empty any more."""
        if mk[:2] == "g/":
            self.grp.filled(mk, self.lane_empty)
        elif self.lane_empty:
            self.lane_empty.pop(int(mk[1]) if mk[:1] == "p" and mk[2:3] == "/" else DEFAULT_PRIORITY, None)

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
                w = Watch([*self.lanes, self.delayed, self.grp.ring], IN_CREATE | IN_MOVED_TO)
            else:
                w = Watch([self.path], IN_MODIFY | IN_CREATE | IN_MOVED_TO)
            self.watches[key] = w
        return w

    def close(self) -> None:
        self.spares.close()
        for w in self.watches.values():
            w.close()
        self.watches.clear()
        if self.head is not None:
            self.head.close()
            self.head = None
        lanes = [fd for fd in self.lane_fds if fd != self.ready_fd]
        for fd in (self.lock_fd, self.events_fd, self.jobs_fd, self.ready_fd, self.delayed_fd, self.expiry_fd, *lanes):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- counters (call with the lock held) ---------------------------------------------

    def counters(self) -> tuple[int, int]:
        if self.ctr is not None and self.owner == threading.get_ident():
            return self.ctr  # read by begin(): nobody else changes them while we hold the lock
        data = os.pread(self.lock_fd, _COUNTERS.size, 0)
        if len(data) < _COUNTERS.size:
            return _SEQ_START, _SEQ_START - 1
        return _COUNTERS.unpack(data)

    def set_counters(self, nxt: int, front: int) -> None:
        if self.owner == threading.get_ident() and self.head is not None:
            _COUNTERS.pack_into(self.head, 0, nxt, front)
            self.ctr = (nxt, front)
        else:
            os.pwrite(self.lock_fd, _COUNTERS.pack(nxt, front), 0)

    def proc_dir(self, enc_worker: str) -> str:
        d = os.path.join(self.proc, enc_worker)
        if enc_worker not in self.proc_dirs:
            os.makedirs(d, exist_ok=True)
            self.proc_dirs.add(enc_worker)
        return d


class EnqReq:
    """One enqueue call waiting for its jobs to be written by the group it joined."""

    __slots__ = ("jobs", "out", "error", "done", "moved")

    def __init__(self, jobs: Sequence[NewJob]) -> None:
        self.jobs = jobs
        self.out: list[EnqueueOutcome] | None = None
        self.error: BaseException | None = None
        self.done = trio.Event()
        self.moved = trio.Event()  # set when the group carrying it is done or gave it back


class EnqState:
    """The enqueue coalescer of one queue in one Trio run: calls that arrive while a group
    is being written form the next group."""

    __slots__ = ("pending", "running", "idle")

    def __init__(self) -> None:
        self.pending: list[EnqReq] = []
        self.running = False
        self.idle = trio.Event()


@contextmanager
def close_on_error(fds: list[int]) -> Iterator[None]:
    """Close the segment descriptors a failed step opened (a finished step hands them to
    the group commit, which closes them)."""
    try:
        yield
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
