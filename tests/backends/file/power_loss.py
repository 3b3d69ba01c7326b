"""A crash-consistency checker for FileStorage: it records the file-system operations the
storage makes under one directory (writes, creates, links, renames, unlinks, mkdirs and
fsyncs; every operation is the real one, done for real), then rebuilds each state a power
loss could leave, and the tests open the storage on each.

The persistence model (what survives a power cut), that of a journaling file system with
delayed allocation (ext4 ``data=ordered`` without ``auto_da_alloc``, XFS):

- name operations (create, link, rename, unlink, mkdir, rmdir) reach the disk in order,
  each with the first flush of anything (``fsync``/``fdatasync`` of any file or directory)
  made after it: the journal commits every earlier name change;
- a file's data reaches the disk only with an ``fsync``/``fdatasync`` of that very file
  made after the write; unflushed data is lost (a new file keeps its names but not its
  bytes);
- a flush counts from the moment it starts: what happens while it runs may miss it.

A crash state is taken right after each flush starts (the durable set only grows there)
and at the end: the set of writes not yet flushed dropped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Snapshot:
    dirs: set[str]
    names: dict[str, int]  # path (relative to the root) -> inode
    data: dict[int, bytes]


@dataclass
class DiskLog:
    """The operations under ``root``, recorded while :meth:`record` is active."""

    root: str
    ops: list[tuple] = field(default_factory=list)
    start: Snapshot | None = None
    _names: dict[str, int] = field(default_factory=dict)  # live: path -> inode
    _size: dict[int, int] = field(default_factory=dict)  # live: inode -> size
    _fds: dict[int, tuple[int, bool]] = field(default_factory=dict)  # fd -> (inode, O_APPEND)
    _pos: dict[int, int] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _rel(self, path: object) -> str | None:
        p = os.path.normpath(os.fsdecode(path))  # type: ignore[arg-type]
        if p == self.root or p.startswith(self.root + "/"):
            return os.path.relpath(p, self.root)
        return None

    def _fd_target(self, fd: int) -> tuple[str, object] | None:
        """("file", inode) / ("dir", path) of a descriptor under the root."""
        if fd in self._fds:
            return "file", self._fds[fd][0]
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        rel = self._rel(p.removesuffix(" (deleted)"))
        if rel is None:
            return None
        if rel in self._names and not p.endswith(" (deleted)"):
            return "file", self._names[rel]
        return ("dir", rel) if os.path.isdir(p) else None

    def mark(self, what: str) -> None:
        """Something the caller was told is done (an acknowledged call)."""
        with self._lock:
            self.ops.append(("ack", what))

    def snapshot(self) -> None:
        """The starting state (made durable first: ``os.sync``)."""
        os.sync()
        s = Snapshot({"."}, {}, {})
        by_ino: dict[int, int] = {}
        for d, subdirs, files in os.walk(self.root):
            for sd in subdirs:
                s.dirs.add(os.path.relpath(os.path.join(d, sd), self.root))
            for f in files:
                p = os.path.join(d, f)
                st = os.stat(p)
                if st.st_ino not in by_ino:
                    by_ino[st.st_ino] = self._next
                    self._next += 1
                    s.data[by_ino[st.st_ino]] = Path(p).read_bytes()
                s.names[os.path.relpath(p, self.root)] = by_ino[st.st_ino]
        self.start = s
        self._names = dict(s.names)
        self._size = {i: len(b) for i, b in s.data.items()}

    def record(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Wrap the ``os`` functions the storage mutates the disk with (each still does
        the real call; the recording is a side note)."""
        real = {n: getattr(os, n) for n in ("open", "write", "pwrite", "close", "link", "rename", "unlink", "mkdir", "rmdir", "fsync", "fdatasync")}

        def open_(path, flags, mode=0o777, *, dir_fd=None):  # noqa: ANN001, ANN202
            rel = None if dir_fd is not None else self._rel(path)
            existed = rel is not None and rel in self._names
            fd = real["open"](path, flags, mode, dir_fd=dir_fd)
            if rel is not None and not flags & os.O_DIRECTORY and not os.path.isdir(path):
                with self._lock:
                    if not existed and flags & os.O_CREAT:
                        ino = self._next
                        self._next += 1
                        self._names[rel] = ino
                        self._size[ino] = 0
                        self.ops.append(("create", rel, ino))
                    ino = self._names.get(rel, -1)
                    if ino >= 0:
                        if flags & os.O_TRUNC:
                            self._size[ino] = 0
                            self.ops.append(("write", ino, 0, b"", True))
                        self._fds[fd] = (ino, bool(flags & os.O_APPEND))
                        self._pos[fd] = 0
            return fd

        def write(fd, data):  # noqa: ANN001, ANN202
            n = real["write"](fd, data)
            with self._lock:
                t = self._fd_target(fd)
                if t is not None and t[0] == "file":
                    ino = t[1]
                    append = self._fds.get(fd, (0, True))[1]
                    off = self._size.get(ino, 0) if append else self._pos.get(fd, 0)
                    self._pos[fd] = off + n
                    self._size[ino] = max(self._size.get(ino, 0), off + n)
                    self.ops.append(("write", ino, off, bytes(data[:n]), False))
            return n

        def pwrite(fd, data, off):  # noqa: ANN001, ANN202
            n = real["pwrite"](fd, data, off)
            with self._lock:
                t = self._fd_target(fd)
                if t is not None and t[0] == "file":
                    self._size[t[1]] = max(self._size.get(t[1], 0), off + n)
                    self.ops.append(("write", t[1], off, bytes(data[:n]), False))
            return n

        def close(fd):  # noqa: ANN001, ANN202
            with self._lock:
                self._fds.pop(fd, None)
                self._pos.pop(fd, None)
            return real["close"](fd)

        def link(src, dst, **kw):  # noqa: ANN001, ANN202
            real["link"](src, dst, **kw)
            s, d = self._rel(src), self._rel(dst)
            if d is not None:
                with self._lock:
                    ino = self._names[s] if s in self._names else -1
                    self._names[d] = ino
                    self.ops.append(("link", ino, d))

        def rename(src, dst, **kw):  # noqa: ANN001, ANN202
            real["rename"](src, dst, **kw)
            s, d = self._rel(src), self._rel(dst)
            if s is not None or d is not None:
                with self._lock:
                    if os.path.isdir(dst):
                        self.ops.append(("renamedir", s, d))
                        for k in [k for k in self._names if k.startswith(f"{s}/")]:
                            self._names[f"{d}/{k[len(s) + 1:]}"] = self._names.pop(k)
                        return
                    ino = self._names.pop(s, -1) if s is not None else -1
                    if d is not None:
                        self._names[d] = ino
                    self.ops.append(("rename", s, d, ino))

        def unlink(path, **kw):  # noqa: ANN001, ANN202
            real["unlink"](path, **kw)
            rel = self._rel(path)
            if rel is not None:
                with self._lock:
                    self._names.pop(rel, None)
                    self.ops.append(("unlink", rel))

        def mkdir(path, mode=0o777, **kw):  # noqa: ANN001, ANN202
            real["mkdir"](path, mode, **kw)
            rel = self._rel(path)
            if rel is not None:
                with self._lock:
                    self.ops.append(("mkdir", rel))

        def rmdir(path, **kw):  # noqa: ANN001, ANN202
            real["rmdir"](path, **kw)
            rel = self._rel(path)
            if rel is not None:
                with self._lock:
                    self.ops.append(("rmdir", rel))

        def syncer(name: str) -> Callable[[int], None]:
            def sync(fd):  # noqa: ANN001, ANN202
                with self._lock:  # recorded as it starts: what comes later may miss it
                    t = self._fd_target(fd)
                    if t is not None:
                        self.ops.append(("sync", t[0], t[1]))
                return real[name](fd)

            return sync

        wrappers = {
            "open": open_, "write": write, "pwrite": pwrite, "close": close, "link": link, "rename": rename,
            "unlink": unlink, "mkdir": mkdir, "rmdir": rmdir, "fsync": syncer("fsync"), "fdatasync": syncer("fdatasync"),
        }
        for n, f in wrappers.items():
            monkeypatch.setattr(os, n, f)

    # -- crash states --------------------------------------------------------------------

    def crash_points(self) -> list[int]:
        """Op counts of the states to check: right after each flush starts, and the end."""
        return [i + 1 for i, op in enumerate(self.ops) if op[0] == "sync"] + [len(self.ops)]

    def acked(self, upto: int) -> list[str]:
        return [op[1] for op in self.ops[:upto] if op[0] == "ack"]

    def state(self, upto: int) -> Snapshot:
        """What a power cut right after ``ops[:upto]`` leaves on the disk."""
        assert self.start is not None
        ops = self.ops[:upto]
        last_sync = max((i for i, op in enumerate(ops) if op[0] == "sync"), default=-1)
        synced_at: dict[int, int] = {}  # inode -> index of its last flush
        for i, op in enumerate(ops):
            if op[0] == "sync" and op[1] == "file":
                synced_at[op[2]] = i
        s = Snapshot(set(self.start.dirs), dict(self.start.names), dict(self.start.data))
        for i, op in enumerate(ops):
            kind = op[0]
            if kind == "write":
                _, ino, off, data, trunc = op
                if synced_at.get(ino, -1) > i:
                    old = b"" if trunc else s.data.get(ino, b"")
                    buf = bytearray(old.ljust(off, b"\0"))
                    buf[off : off + len(data)] = data
                    s.data[ino] = bytes(buf)
                continue
            if kind in ("sync", "ack") or i > last_sync:
                continue  # name operations after the last flush are lost
            if kind == "create":
                s.names[op[1]] = op[2]
            elif kind == "link":
                s.names[op[2]] = op[1]
            elif kind == "rename":
                _, src, dst, ino = op
                if src is not None:
                    s.names.pop(src, None)
                if dst is not None:
                    s.names[dst] = ino
            elif kind == "renamedir":
                _, src, dst = op
                for k in [k for k in s.names if k.startswith(f"{src}/")]:
                    s.names[f"{dst}/{k[len(src) + 1:]}"] = s.names.pop(k)
                s.dirs = {dst + d[len(src):] if d == src or d.startswith(f"{src}/") else d for d in s.dirs}
            elif kind == "unlink":
                s.names.pop(op[1], None)
            elif kind == "mkdir":
                s.dirs.add(op[1])
            elif kind == "rmdir":
                s.dirs.discard(op[1])
        return s

    def materialize(self, s: Snapshot, dest: Path) -> None:
        """Write a crash state into ``dest`` (hard links for an inode's other names)."""
        made: dict[int, Path] = {}
        for d in sorted(s.dirs):
            (dest / d).mkdir(parents=True, exist_ok=True)
        for name, ino in sorted(s.names.items()):
            p = dest / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if ino in made:
                os.link(made[ino], p)
            else:
                p.write_bytes(s.data.get(ino, b""))
                made[ino] = p
