"""FileStorage's :meth:`~trioqueue.storage.Storage.clear`: a queue emptied in one locked
section (a mixin kept apart from ``_admin.py``).

Every name is unlinked under the queue's lock, in a worker thread: the ready and delayed
markers first (once they are gone nothing of the queue can be claimed or promoted), then
the processing entries, the registry links, the expiry index, the flow-control state and,
if asked, the schedules; the segments go with their last links. Every other step of every
process takes the same lock, so none sees a queue half cleared; a read without the lock
(``get_job``) during the section may find some jobs gone and others not yet. A crash in
the middle leaves a queue partly cleared (the clear was not acknowledged): start-up
repair gives the jobs still registered their markers back.
"""

from __future__ import annotations

import os
from collections import deque

import trio

from .._base import CLEARED, StorageEvent
from ._base import FileBase
from ._layout import _Q, _unlink

__all__ = ["ClearOps"]


def _unlink_entries(directory: str) -> int:
    """Unlink the files of ``directory`` (not its subdirectories, not dot names); how many."""
    n = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.startswith(".") or entry.is_dir(follow_symlinks=False):
            continue
        if _unlink(entry.path):
            n += 1
    return n


class ClearOps(FileBase):
    """The ``clear`` of :class:`~trioqueue.storage.FileStorage`."""

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)

        def run() -> int:
            with self._locked(q):
                q.bump()
                for lane in q.lanes:
                    _unlink_entries(lane)
                _unlink_entries(q.delayed)
                for worker in os.listdir(q.proc):
                    _unlink_entries(os.path.join(q.proc, worker))
                n = _unlink_entries(q.jobs)
                _unlink_entries(q.expiry)
                _unlink_entries(os.path.join(q.path, "flow"))
                if schedules:
                    _unlink_entries(q.schedules)
                q.forget()
                q.cache = [deque() for _ in q.lanes]
                q.cache_front = -1
                self._publish(q, [StorageEvent(CLEARED, "")])
                return n

        n = await trio.to_thread.run_sync(run)
        await self._finish([], self._cleared_dirs(q), True)
        return n

    def _cleared_dirs(self, q: _Q) -> set[int]:
        return {q.jobs_fd, q.delayed_fd, q.expiry_fd, *q.lane_fds}
