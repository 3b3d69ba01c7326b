"""FileStorage's group commit: the ``fsync`` batcher. Concurrent calls that wrote files
hand their descriptors (and the directories that got names) to one :class:`Syncer`, which
flushes them together in a worker thread; every caller learns the batch's outcome."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import trio

__all__ = ["Flusher", "Syncer", "sync_now"]

_IDLE = 1.0  # seconds a flusher thread waits for work before it ends (started again on demand)


class Flusher:
    """One dedicated thread that runs a Trio run's flushes (and, between them, chores
    such as making spare segment files): handing a call to it through a queue and being
    woken through the run's token costs less than ``trio.to_thread.run_sync`` (no thread
    pool, no context copy). The thread ends after a second without work and starts again
    on demand, so none outlives its use."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[tuple[Callable[[], object], Callable[[], None] | None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def post(self, fn: Callable[[], object], done: Callable[[], None] | None = None) -> None:
        """Run ``fn`` in the thread, then ``done`` (a chore: errors are ``done``'s to learn)."""
        self._inbox.put((fn, done))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="trioqueue-file-flusher", daemon=True)
                self._thread.start()

    async def run(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the thread and wait for it (not cancellable: callers shield);
        what it raises is raised here."""
        token = trio.lowlevel.current_trio_token()
        finished = trio.Event()
        box: list[BaseException | None] = []

        def call() -> None:
            try:
                fn()
                box.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting task
                box.append(exc)

        def wake() -> None:
            try:
                token.run_sync_soon(finished.set)
            except trio.RunFinishedError:
                pass

        self.post(call, wake)
        await finished.wait()
        if box[0] is not None:
            raise box[0]

    def _main(self) -> None:
        while True:
            try:
                fn, done = self._inbox.get(timeout=_IDLE)
            except queue.Empty:
                with self._lock:
                    if self._inbox.empty():
                        self._thread = None
                        return
                continue
            try:
                fn()
            except Exception:  # noqa: BLE001 - a chore that failed (a spare file not made) is retried later
                pass
            if done is not None:
                done()


class _Batch:
    __slots__ = ("fds", "dirs", "done", "error")

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.dirs: set[int] = set()
        self.done = trio.Event()
        self.error: BaseException | None = None

    def flush(self, syncfs_fd: int) -> None:
        # Batches write one segment each, so a group has few files: fdatasync each (no
        # syncfs, which would flush every other program's data on the file system too).
        try:
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

    def __init__(self, syncfs_fd: int, flusher: Flusher | None = None) -> None:
        self._syncfs_fd = syncfs_fd
        self.flusher = flusher or Flusher()
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
                        await self.flusher.run(lambda: cur.flush(self._syncfs_fd))
                    except BaseException as exc:
                        cur.error = exc  # the group's other callers get an OSError
                        if not isinstance(exc, Exception):
                            raise  # KeyboardInterrupt & co. stay what they are for the carrier
                    finally:
                        cur.done.set()
                finally:
                    self._running = False
                    self._idle.set()
        if b.error is not None:
            raise OSError(f"fsync failed: {b.error!r}") from b.error


def sync_now(fds: list[int], dirs: set[int]) -> None:
    """Synchronous flush, for callers outside Trio's thread."""
    b = _Batch()
    b.fds = fds
    b.dirs = dirs
    b.flush(-1)
