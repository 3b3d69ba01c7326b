"""Low-level helpers of :class:`~trioqueue.storage.file.FileStorage`: name encoding, the
job record format, segments and temp files (the group-commit ``fsync`` batcher is in
``_groupcommit``, inotify in ``_inotify``)."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import math
import os
import struct
import threading
import zlib
from collections import OrderedDict, deque


from ..._model._types import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from ..._model._serde import compact_json_encoder
from .._rules import DELAYED
from .._rules import Rec as JobRec

__all__ = [
    "Rec",
    "CorruptRecord",
    "decode_name",
    "encode_name",
    "pack_record",
    "unpack_record",
    "write_atomic",
]

# -- names ------------------------------------------------------------------------------

_MAX_B64 = 120  # longer encodings become a hash (file names are limited to 255 bytes)


def encode_name(s: str) -> str:
    """A file-name-safe, injective encoding of any string: ``b`` + urlsafe base64 of its
    UTF-8 (never ``.``, ``..`` or a ``/``), or ``h`` + SHA-256 hex when that is too long."""
    raw = s.encode("utf-8", "surrogatepass")
    enc = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(enc) <= _MAX_B64:
        return "b" + enc
    return "h" + hashlib.sha256(raw).hexdigest()


def decode_name(name: str) -> str | None:
    """Inverse of :func:`encode_name` for ``b`` names; ``None`` for hashed ones."""
    if not name.startswith("b"):
        return None
    body = name[1:]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeDecodeError):
        return None


# -- records ----------------------------------------------------------------------------

_MAGIC = b"TQJ1 "


class CorruptRecord(Exception):
    pass


class Rec(JobRec):
    """A job's registry entry as stored in ``jobs/<encoded id>``: the lifecycle's record
    (:class:`~.._rules.Rec`) and ``mk``, the name of the marker that files it (its ready
    marker, relative to ``ready/``; or its ``delayed/`` marker, which starts with its due
    time); ``asleep``: a delayed record that a sleep (``SettleKind.SLEEP``) filed, not a
    rate limit (the event the reaper announces again if its settler died)."""

    __slots__ = ("mk", "asleep")

    def __init__(
        self,
        id: str,
        kind: str,
        ts: int,
        attempts: int,
        max_attempts: int,
        result_ttl: float,
        created: int,
        envelope: bytes,
        mk: str | None = None,
        worker: str | None = None,
        exp: float | None = None,
        result: bytes | None = None,
        error: bytes | None = None,
        lease: float | None = None,
    ) -> None:
        JobRec.__init__(self, id, kind, ts, attempts, max_attempts, result_ttl, created, envelope)
        self.mk = mk
        self.asleep = False
        self.worker = worker
        self.exp = exp
        self.result = result
        self.error = error
        self.lease = lease  # lease deadline of a processing record (seconds since the epoch)

    def state(self, due_ms: int | None = None) -> str:
        if due_ms is None and self.kind == DELAYED and self.mk:
            head = self.mk[:16]
            if len(self.mk) > 17 and self.mk[16] == "-":
                try:
                    due_ms = int(head, 16)
                except ValueError:
                    pass
        return JobRec.state(self, due_ms)

    def copy(self) -> Rec:
        """A shallow copy (the bytes fields are immutable): what a cache hands out, so
        that no caller ever mutates a cached record. (Replaced below by a function with
        one assignment per field: a getattr/setattr loop costs three times as much.)"""
        c = Rec.__new__(Rec)
        for name in _SLOTS:
            setattr(c, name, getattr(self, name))
        return c


_SLOTS = JobRec.__slots__ + Rec.__slots__  # every field of a file record


def _make_copy() -> object:
    body = "\n".join(f"    c.{n} = self.{n}" for n in _SLOTS)
    ns: dict[str, object] = {"Rec": Rec}
    exec(f"def copy(self):\n    c = Rec.__new__(Rec)\n{body}\n    return c\n", ns)  # noqa: S102 - fixed source
    return ns["copy"]


Rec.copy = _make_copy()  # type: ignore[method-assign,assignment]


def _extras(r: Rec) -> dict[str, object]:
    """The header's optional last element: fields added after the first format."""
    x: dict[str, object] = {}
    if r.token:
        x["t"] = r.token
    if r.claim is not None:
        x["c"] = r.claim
    if r.claims:
        x["n"] = r.claims
    if r.started:
        x["s"] = 1
    if r.progress is not None:
        x["p"] = base64.b64encode(r.progress).decode("ascii")
    if r.steps is not None:
        x["st"] = base64.b64encode(r.steps).decode("ascii")
    if r.signals is not None:
        x["sg"] = base64.b64encode(r.signals).decode("ascii")
    if r.wait is not None:
        x["ws"] = list(r.wait)
    if r.cancel_requested:
        x["x"] = 1
    if r.priority != DEFAULT_PRIORITY:
        x["pr"] = r.priority
    if r.parent is not None:
        x["pa"] = list(r.parent)
    if r.children is not None:
        x["ch"] = [list(c) for c in r.children]
        x["po"] = r.policy
    if r.group is not None:
        x["gr"] = r.group
    if r.deps is not None:
        x["dp"] = [list(d) for d in r.deps]
        x["po"] = r.policy
    if r.dependents is not None:
        x["ds"] = [list(d) for d in r.dependents]
    if r.asleep:
        x["sl"] = 1
    return x


def _set_extras(r: Rec, x: object) -> None:
    if not isinstance(x, dict):
        raise CorruptRecord("bad header extras")
    r.token = str(x.get("t", ""))
    c = x.get("c")
    r.claim = None if c is None else str(c)
    r.claims = int(x.get("n", 0))
    r.started = bool(x.get("s", 0))
    p = x.get("p")
    r.progress = None if p is None else base64.b64decode(p)
    st = x.get("st")
    r.steps = None if st is None else base64.b64decode(st)
    sg = x.get("sg")
    r.signals = None if sg is None else base64.b64decode(sg)
    ws = x.get("ws")
    r.wait = None if ws is None else (str(ws[0]), int(ws[1]))
    r.cancel_requested = bool(x.get("x", 0))
    r.priority = int(x.get("pr", DEFAULT_PRIORITY))
    pa = x.get("pa")
    r.parent = None if pa is None else (str(pa[0]), str(pa[1]))
    ch = x.get("ch")
    r.children = None if ch is None else [(str(c[0]), str(c[1])) for c in ch]
    r.policy = str(x.get("po", "cancel"))
    gr = x.get("gr")
    r.group = None if gr is None else str(gr)
    dp = x.get("dp")
    r.deps = None if dp is None else [(str(d[0]), str(d[1])) for d in dp]
    ds = x.get("ds")
    r.dependents = None if ds is None else [(str(d[0]), str(d[1])) for d in ds]
    r.asleep = bool(x.get("sl", 0))
    if not MIN_PRIORITY <= r.priority <= MAX_PRIORITY:
        raise CorruptRecord(f"bad priority {r.priority!r}")


_dumps = compact_json_encoder(ensure_ascii=True, allow_nan=True)  # record headers, segment indexes


def pack_record(r: Rec) -> bytes:
    res = r.result
    err = r.error
    hdr = _dumps(
        [
            r.id,
            r.kind,
            r.ts,
            r.worker,
            r.attempts,
            r.max_attempts,
            r.result_ttl,
            r.created,
            r.exp,
            r.mk,
            len(r.envelope),
            -1 if res is None else len(res),
            -1 if err is None else len(err),
            r.lease,
            _extras(r),
        ]
    ).encode()
    parts = [_MAGIC, hdr, b"\n", r.envelope]
    if res is not None:
        parts.append(res)
    if err is not None:
        parts.append(err)
    return b"".join(parts)


def unpack_record(data: bytes) -> Rec:
    if not data.startswith(_MAGIC):
        raise CorruptRecord("bad magic")
    nl = data.find(b"\n")
    if nl < 0:
        raise CorruptRecord("no header")
    try:
        h = json.loads(data[len(_MAGIC) : nl])
        if len(h) == 13:  # written before the lease field existed
            h.append(None)
        if len(h) == 14:  # written before the extras (tokens, progress...) existed
            h.append({})
        (id_, kind, ts, worker, attempts, max_attempts, ttl, created, exp, mk, le, lr, lx, lease, extras) = h
        if not (isinstance(id_, str) and isinstance(kind, str) and isinstance(le, int)):
            raise CorruptRecord("bad header types")
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(f"bad header: {exc}") from None
    pos = nl + 1
    total = pos + le + max(lr, 0) + max(lx, 0)
    if total != len(data) or le < 0:
        raise CorruptRecord(f"length mismatch ({len(data)} bytes, header says {total})")
    env = data[pos : pos + le]
    pos += le
    res = None
    if lr >= 0:
        res = data[pos : pos + lr]
        pos += lr
    err = None
    if lx >= 0:
        err = data[pos : pos + lx]
    rec = Rec(id_, kind, ts, attempts, max_attempts, ttl, created, env, mk, worker, exp, res, err, lease)
    try:
        _set_extras(rec, extras)
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(f"bad header extras: {exc}") from None
    return rec


# -- segments ---------------------------------------------------------------------------
#
# A segment is one immutable file holding the records of a whole batch (an enqueue, a
# claim, a settlement...). Every name a job has (``jobs/<id>``, ``ready/<seq>-<id>``,
# ``delayed/...``, ``expiry/...``) is a *hard link* to a segment: one new inode per batch
# instead of several per job. A segment is never modified after it got its first link, so
# a reader holding any of its names sees complete, checksummed data; the file system frees
# it when its last link goes.
#
#   b"TQS1" | 16 random bytes (segment id) | u32 crc32 of the rest | u32 index length |
#   index (JSON list of [encoded id, offset, length]) | records (pack_record format)

_SEG_MAGIC = b"TQS1"
_SEG_HEAD = struct.Struct("<4s16sII")
_SEG_CACHE_BYTES = 32 << 20


class Segment:
    __slots__ = ("uid", "data", "index", "base")

    def __init__(self, uid: bytes, data: bytes, index: dict[str, tuple[int, int]], base: int) -> None:
        self.uid = uid
        self.data = data
        self.index = index
        self.base = base

    def rec(self, enc: str) -> Rec:
        loc = self.index.get(enc)
        if loc is None:
            raise CorruptRecord(f"segment has no record for {enc}")
        off = self.base + loc[0]
        return unpack_record(self.data[off : off + loc[1]])

    def encs(self) -> list[str]:
        return list(self.index)


_seg_cache: OrderedDict[bytes, Segment] = OrderedDict()
_seg_cache_bytes = 0
_seg_lock = threading.Lock()


def _cache_put(seg: Segment) -> None:
    global _seg_cache_bytes
    with _seg_lock:
        if seg.uid in _seg_cache:
            return
        _seg_cache[seg.uid] = seg
        _seg_cache_bytes += len(seg.data)
        while _seg_cache_bytes > _SEG_CACHE_BYTES and len(_seg_cache) > 1:
            _, old = _seg_cache.popitem(last=False)
            _seg_cache_bytes -= len(old.data)


def _cache_get(uid: bytes) -> Segment | None:
    with _seg_lock:
        seg = _seg_cache.get(uid)
        if seg is not None:
            _seg_cache.move_to_end(uid)
        return seg


def parse_segment(data: bytes) -> Segment:
    if len(data) < _SEG_HEAD.size:
        raise CorruptRecord("short segment")
    magic, uid, crc, ilen = _SEG_HEAD.unpack_from(data)
    if magic != _SEG_MAGIC:
        raise CorruptRecord("bad magic")
    if zlib.crc32(memoryview(data)[_SEG_HEAD.size :]) != crc:
        raise CorruptRecord("segment checksum mismatch")
    base = _SEG_HEAD.size + ilen
    try:
        index = {e: (o, n) for e, o, n in json.loads(data[_SEG_HEAD.size : base])}
    except (ValueError, TypeError) as exc:
        raise CorruptRecord(f"bad segment index: {exc}") from None
    return Segment(uid, data, index, base)


def pack_segment(items: list[tuple[str, Rec]]) -> Segment:
    parts = []
    idx: list[tuple[str, int, int]] = []
    off = 0
    for enc, r in items:
        b = pack_record(r)
        idx.append((enc, off, len(b)))
        parts.append(b)
        off += len(b)
    index = _dumps(idx).encode()
    body = index + b"".join(parts)
    uid = os.urandom(16)
    data = _SEG_HEAD.pack(_SEG_MAGIC, uid, zlib.crc32(body), len(index)) + body
    # A later entry for the same name wins (the dict keeps the last offset).
    return Segment(uid, data, {e: (o, n) for e, o, n in idx}, _SEG_HEAD.size + len(index))


def load_fd(fd: int) -> Segment | Rec:
    """The segment (cached by its id) or the single legacy record behind an open file."""
    head = os.pread(fd, _SEG_HEAD.size, 0)
    if head[:4] == _SEG_MAGIC and len(head) == _SEG_HEAD.size:
        seg = _cache_get(head[4:20])
        if seg is not None:
            return seg
    size = os.fstat(fd).st_size
    chunks = []
    pos = 0
    while pos < size:
        b = os.pread(fd, size - pos, pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
    data = b"".join(chunks)
    if data[:4] == _SEG_MAGIC:
        seg = parse_segment(data)
        _cache_put(seg)
        return seg
    return unpack_record(data)


def read_rec(path: str, enc: str) -> Rec | None:
    """The record of ``enc`` behind ``path`` (a segment link or a legacy record file);
    None if the path does not exist; raises CorruptRecord."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        obj = load_fd(fd)
    finally:
        os.close(fd)
    if isinstance(obj, Segment):
        return obj.rec(enc)
    return obj


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _discard(fd: int, tmp: str) -> None:
    """Close and remove a temp file whose writing failed."""
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


class Spares:
    """Empty files made ahead in a queue's ``tmp/`` (``.spare-<pid>-*``), off the event
    loop (by the group commit's flusher thread): a segment takes one instead of creating
    its inode while the queue's lock is held. Creating an inode waits for the file
    system's journal, which every flush commits: ~0.3-0.5 ms here when other programs
    flush too, more than the rest of a one-job enqueue's locked section."""

    __slots__ = ("directory", "files", "want", "filling", "closed")

    def __init__(self, directory: str, want: int = 4) -> None:
        self.directory = directory
        self.files: deque[tuple[str, int]] = deque()
        self.want = want
        self.filling = False  # a fill is posted and not done
        self.closed = False

    def take(self) -> tuple[str, int] | None:
        try:
            return self.files.popleft()
        except IndexError:
            return None

    def wanted(self) -> bool:
        """Whether a fill should be posted now (marks it posted)."""
        if self.filling or self.closed or len(self.files) >= self.want:
            return False
        self.filling = True
        return True

    def fill(self) -> None:
        try:
            while len(self.files) < self.want and not self.closed:
                path = os.path.join(self.directory, f".spare-{_pid}-{_next_tmp()}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                self.files.append((path, fd))
        finally:
            self.filling = False
            if self.closed:
                self.close()

    def close(self) -> None:
        self.closed = True
        while (f := self.take()) is not None:
            os.close(f[1])
            unlink_quiet(f[0])


def write_segment(directory: str, items: list[tuple[str, Rec]], spares: Spares | None = None) -> tuple[str, int, Segment]:
    """Write a new segment under a temp name in ``directory`` (FileStorage: the queue's
    small ``tmp/``; a spare file from ``spares`` if there is one); returns (temp path,
    open descriptor, segment). The caller links its names, unlinks the temp name, and
    closes the descriptor."""
    seg = pack_segment(items)
    spare = None if spares is None else spares.take()
    if spare is not None:
        tmp, fd = spare
    else:
        tmp = os.path.join(directory, tmp_name())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, seg.data)
    except BaseException:
        _discard(fd, tmp)
        raise
    _cache_put(seg)
    return tmp, fd, seg


def replace_link(src: str, directory: str, name: str, tmpdir: str | None = None) -> None:
    """Atomically make ``directory/name`` another name of ``src`` (link to a temp name in
    ``tmpdir``, default ``directory``, on the same file system; then rename over the old
    entry). A small ``tmpdir`` is cheaper to add a name to than a big ``directory``."""
    tmp = (directory if tmpdir is None else tmpdir) + "/" + tmp_name()
    os.link(src, tmp)
    try:
        os.rename(tmp, directory + "/" + name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- files ------------------------------------------------------------------------------

_tmp_counter = iter(range(1 << 62))
_tmp_lock = threading.Lock()
_pid = os.getpid()  # os.getpid() is a system call each time: cached, refreshed after fork


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _next_tmp() -> str:
    with _tmp_lock:
        n = next(_tmp_counter)
    return f"{threading.get_ident() & 0xFFFF:x}-{n}"


def tmp_name() -> str:
    return f".tmp-{_pid}-{_next_tmp()}"


def write_atomic(directory: str, name: str, data: bytes, durable: bool) -> None:
    """Write ``directory/name`` atomically (temp file + rename). ``durable``: the data is
    flushed before the rename names it (a power cut never leaves the name on data that
    did not reach the disk); the caller flushes ``directory`` if the name must survive."""
    tmp = os.path.join(directory, tmp_name())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
        if durable:
            os.fdatasync(fd)
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        _discard(fd, tmp)
        raise
    os.close(fd)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_tmp(directory: str) -> int:
    """Remove temp files of dead processes (and of this one: called at start)."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    me = os.getpid()
    for name in names:
        spare = name.startswith(".spare-")  # (another FileStorage of this process may use them)
        if not (spare or name.startswith(".tmp-")):
            continue
        try:
            pid = int(name.split("-")[1])
        except (IndexError, ValueError):
            pid = -1
        if (pid == me and not spare) or not pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
    return removed




INF = math.inf
__all__ += [
    "INF",
    "Segment",
    "Spares",
    "clean_tmp",
    "errno",
    "load_fd",
    "parse_segment",
    "pid_alive",
    "read_rec",
    "replace_link",
    "tmp_name",
    "write_segment",
]


def unlink_quiet(path: str) -> bool:
    """Remove ``path``; False if it was not there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
