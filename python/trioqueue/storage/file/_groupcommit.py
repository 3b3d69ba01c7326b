"""FileStorage's group commit: the ``fsync`` batcher. Concurrent calls that wrote files
hand their descriptors (and the directories that got names) to one :class:`Syncer`, which
flushes them together in a worker thread; every caller learns the batch's outcome."""

from __future__ import annotations

import os
from collections.abc import Callable

import outcome
import trio

__all__ = ["Flusher", "Syncer", "sync_now"]


class Flusher:
    """Runs a Trio run's flushes (and, between them, chores such as making spare segment
    files) in Trio's cached threads through :func:`trio.lowlevel.start_thread_soon`:
    cheaper than ``trio.to_thread.run_sync`` (no capacity limiter, no context copy, no
    cancellation machinery), and no thread of its own to start, idle out or outlive
    its use."""

    def post(self, fn: Callable[[], object], done: Callable[[], None] | None = None) -> None:
        """Run ``fn`` in a thread, then ``done`` there (a chore: a failure, such as a
        spare file not made, is retried by a later chore)."""

        def deliver(result: object) -> None:
            if done is not None:
                done()

        trio.lowlevel.start_thread_soon(fn, deliver)

    async def run(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in a thread and wait for it (not cancellable: callers shield); what
        it raises is raised here."""
        token = trio.lowlevel.current_trio_token()
        finished = trio.Event()
        box: list[outcome.Outcome[object]] = []

        def deliver(result: outcome.Outcome[object]) -> None:
            box.append(result)
            try:
                token.run_sync_soon(finished.set)
            except trio.RunFinishedError:
                pass

        trio.lowlevel.start_thread_soon(fn, deliver)
        await finished.wait()
        box[0].unwrap()


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
