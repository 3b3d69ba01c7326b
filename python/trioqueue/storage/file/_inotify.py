"""inotify through ``ctypes``, and the shared :class:`Watch` FileStorage's blocking calls
wait on (split out of ``_fsutil``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import trio

__all__ = ["Inotify", "Watch"]

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
