"""Low-level helpers of :class:`~trioqueue.storage.file.FileStorage`: name encoding, the
job record format, inotify through ``ctypes`` and the group-commit ``fsync`` batcher."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import threading

import trio

__all__ = [
    "Inotify",
    "Rec",
    "Syncer",
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


class Rec:
    """A job's registry entry as stored in ``jobs/<encoded id>``."""

    __slots__ = (
        "id",
        "kind",
        "ts",
        "worker",
        "attempts",
        "max_attempts",
        "result_ttl",
        "created",
        "exp",
        "mk",
        "envelope",
        "result",
        "error",
    )

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
    ) -> None:
        self.id = id
        self.kind = kind
        self.ts = ts
        self.worker = worker
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.result_ttl = result_ttl
        self.created = created
        self.exp = exp
        self.mk = mk
        self.envelope = envelope
        self.result = result
        self.error = error


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


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
        (id_, kind, ts, worker, attempts, max_attempts, ttl, created, exp, mk, le, lr, lx) = h
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
    return Rec(id_, kind, ts, attempts, max_attempts, ttl, created, env, mk, worker, exp, res, err)


# -- files ------------------------------------------------------------------------------

_tmp_counter = iter(range(1 << 62))
_tmp_lock = threading.Lock()


def tmp_name() -> str:
    with _tmp_lock:
        n = next(_tmp_counter)
    return f".tmp-{os.getpid()}-{threading.get_ident() & 0xFFFF:x}-{n}"


def write_atomic(directory: str, name: str, data: bytes, keep_fd: bool) -> int | None:
    """Write ``directory/name`` atomically (temp file + rename). With ``keep_fd`` the open
    descriptor is returned (the caller fsyncs and closes it), else ``None``."""
    tmp = os.path.join(directory, tmp_name())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if keep_fd:
        return fd
    os.close(fd)
    return None


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
        if not name.startswith(".tmp-"):
            continue
        try:
            pid = int(name.split("-")[1])
        except (IndexError, ValueError):
            pid = -1
        if pid == me or not pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
    return removed


# -- inotify ----------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_HAS_SYNCFS = hasattr(_libc, "syncfs")

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


class Inotify:
    """A non-blocking inotify descriptor, waited on with ``trio.lowlevel.wait_readable``."""

    def __init__(self) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd

    def add(self, path: str, mask: int) -> None:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch({path}): {os.strerror(e)}")

    def drain(self) -> bytes:
        chunks = []
        while True:
            try:
                b = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)

    async def wait(self, timeout: float) -> bool:
        """Wait until a change is reported (True) or ``timeout`` passes (False)."""
        if timeout <= 0:
            await trio.lowlevel.checkpoint()
            return bool(self.drain())
        with trio.move_on_after(timeout):
            await trio.lowlevel.wait_readable(self.fd)
            self.drain()
            return True
        return False

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                trio.lowlevel.notify_closing(fd)
            except Exception:
                pass
            os.close(fd)


# -- group commit -----------------------------------------------------------------------


class _Batch:
    __slots__ = ("fds", "dirs", "done", "error")

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.dirs: set[int] = set()
        self.done = trio.Event()
        self.error: BaseException | None = None

    def flush(self, syncfs_fd: int) -> None:
        try:
            if len(self.fds) >= 8 and _HAS_SYNCFS:
                # One syncfs() writes every dirty file of the store's file system: much
                # cheaper than one journal commit per file for a large group.
                if _libc.syncfs(syncfs_fd) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"syncfs: {os.strerror(e)}")
            else:
                for fd in self.fds:
                    os.fdatasync(fd)
            for d in self.dirs:
                os.fsync(d)
        finally:
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass


class Syncer:
    """Group commit: concurrent callers' files and directories share one flush, run in a
    worker thread while the next group accumulates."""

    def __init__(self, syncfs_fd: int) -> None:
        self._syncfs_fd = syncfs_fd
        self._batch = _Batch()
        self._running = False
        self._idle = trio.Event()

    async def sync(self, fds: list[int], dirs: set[int]) -> None:
        b = self._batch
        b.fds.extend(fds)
        b.dirs |= dirs
        with trio.CancelScope(shield=True):
            while not b.done.is_set():
                if self._running:
                    await self._idle.wait()
                    continue
                self._running = True
                self._idle = trio.Event()
                try:
                    cur = self._batch
                    self._batch = _Batch()
                    try:
                        await trio.to_thread.run_sync(cur.flush, self._syncfs_fd)
                    except BaseException as exc:  # noqa: BLE001 - handed to the waiters
                        cur.error = exc
                    cur.done.set()
                finally:
                    self._running = False
                    self._idle.set()
        if b.error is not None:
            raise OSError(f"fsync failed: {b.error}") from b.error


def sync_now(fds: list[int], dirs: set[int]) -> None:
    """Synchronous flush, for callers outside Trio's thread."""
    b = _Batch()
    b.fds = fds
    b.dirs = dirs
    b.flush(-1)


INF = math.inf
__all__ += ["INF", "clean_tmp", "errno", "pid_alive", "sync_now", "tmp_name"]


class Watch:
    """A shared inotify watch of some directories, for any number of tasks of one Trio run.

    One waiting task at a time reads the descriptor (``wait_readable`` admits one) and bumps
    ``gen``; the others park on an event. A waiter passes the ``gen`` it saw *before*
    checking the files, so a change between its check and its wait is never missed.
    (Creating and closing an inotify instance per wait costs ~1 ms in ``close``: hence one
    long-lived watch per queue.)
    """

    def __init__(self, paths: list[str], mask: int) -> None:
        self.ino = Inotify()
        try:
            for p in paths:
                self.ino.add(p, mask)
        except BaseException:
            self.ino.close()
            raise
        self.gen = 0
        self._reading = False
        self._event = trio.Event()

    async def wait(self, since: int, timeout: float) -> None:
        deadline = trio.current_time() + timeout
        while self.gen == since:
            left = deadline - trio.current_time()
            if left <= 0:
                await trio.lowlevel.checkpoint()
                return
            if not self._reading:
                self._reading = True
                try:
                    with trio.move_on_after(left):
                        await trio.lowlevel.wait_readable(self.ino.fd)
                        self.ino.drain()
                        self.gen += 1
                finally:
                    self._reading = False
                    ev, self._event = self._event, trio.Event()
                    ev.set()
            else:
                with trio.move_on_after(left):
                    await self._event.wait()

    def close(self) -> None:
        self.ino.close()
