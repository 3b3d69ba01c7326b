"""FileStorage's :meth:`~trioqueue.storage.Administration.clear` and count-based retention
(:attr:`~trioqueue.storage.Settlement.keep`), a part of the storage kept apart from ``_admin.py``.

**Clear**: a queue emptied in one locked section.
Every name is unlinked under the queue's lock, in a worker thread: the ready and delayed
markers first (once they are gone nothing of the queue can be claimed or promoted), then
the processing entries, the registry links, the expiry index, the flow-control state and,
if asked, the schedules; the segments go with their last links. Every other step of every
process takes the same lock, so none sees a queue half cleared; a read without the lock
(``get_job``) during the section may find some jobs gone and others not yet. A crash in
the middle leaves a queue partly cleared (the clear was not acknowledged): start-up
repair gives the jobs still registered their markers back.

**Count-based retention** is swept in batches: there is no per-state index on disk (it
would cost a link per transition on every hot path), so finding a state's oldest jobs
means reading every record of the queue, as ``counts`` does. A process trims a state
once its settlements with a ``keep`` have added :attr:`FileRetention.keep_every` jobs to
it (or ``keep // 4``, if larger) since its last trim: the scan (in a worker thread,
holding the newest ``keep`` and the ids to forget) finds the jobs past the newest ``keep`` by the time they
entered the state, and unlinks them in slices under the lock, each checked again. So
each worker process lets a state grow at most that many jobs past ``keep`` between
trims, and the cost of a scan is spread over as many settlements.
"""

from __future__ import annotations

import heapq
import os
import time
from collections import deque
from collections.abc import Sequence

import trio

from .. import _rules as R
from .._base import CLEARED, Settlement, StorageEvent
from ._base import FileCore
from ._flows import FileTrees
from ._layout import FileQueue, unlink_quiet

__all__ = ["FileRetention"]

_KEPT = R.KEPT  # the settlements Settlement.keep applies to: the kind they enter
_SLICE = 1000  # jobs a trim checks and unlinks per lock hold


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
        if unlink_quiet(entry.path):
            n += 1
    return n


class FileRetention:
    """``clear`` and count-based retention of :class:`~trioqueue.storage.FileStorage`. A
    part built by the storage with the core it shares."""

    def __init__(self, core: FileCore, trees: FileTrees) -> None:
        self._core = core
        self._trees = trees
        #: Jobs a process's settlements add to a state with a ``keep`` between two trims
        #: of it (at least; ``keep // 4`` when larger): the growth past ``keep`` each
        #: process allows.
        self.keep_every = 64
        self._kept_since: dict[tuple[str, str], int] = {}

    async def keep_newest(self, queue: str, settlements: Sequence[Settlement], settled: Sequence[bool]) -> None:
        """After a settle call: count its settlements with a ``keep``, and trim the states
        whose count reached the batch."""
        since = self._kept_since
        keeps: dict[str, int] = {}
        for s, ok in zip(settlements, settled, strict=True):
            if ok and s.keep is not None and s.kind in _KEPT:
                state = _KEPT[s.kind]
                keeps[state] = min(s.keep, keeps.get(state, s.keep))
                since[queue, state] = since.get((queue, state), 0) + 1
        for state, keep in keeps.items():
            if since[queue, state] >= max(self.keep_every, keep // 4):
                since[queue, state] = 0
                await self._trim(self._core.q(queue), state, keep)

    async def _trim(self, q: FileQueue, state: str, keep: int) -> int:
        """Forget the jobs of terminal ``state`` past the newest ``keep`` (jobs of trees
        go by their TTL); how many."""

        def run() -> int:
            newest: list[tuple[int, str]] = []  # the newest ``keep`` seen: (ts, enc), a min-heap
            victims: list[tuple[int, str]] = []
            for enc, r in self._core.records(q, time.time()):
                if r.kind != state or R.in_tree(r):  # (jobs of trees go by their TTL)
                    continue
                item = (r.ts, enc)
                if len(newest) < keep:
                    heapq.heappush(newest, item)
                elif keep and item > newest[0]:
                    victims.append(heapq.heapreplace(newest, item))
                else:
                    victims.append(item)
            n = 0
            for i in range(0, len(victims), _SLICE):
                with self._core.locked(q):  # checked again: it may have moved on meanwhile
                    for ts, enc in victims[i : i + _SLICE]:
                        now_rec = self._core.load(q, enc, time.time())
                        if now_rec is not None and now_rec.kind == state and now_rec.ts == ts and unlink_quiet(
                            os.path.join(q.jobs, enc)
                        ):
                            q.drop(enc)
                            n += 1
            return n

        n = await trio.to_thread.run_sync(run)
        await self._core.finish([], {q.jobs_fd}, n > 0)
        return n

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        # Its jobs' parents and dependents on other queues count them as remove_job has
        # them count a removed job: a completed one first stops being listed by them...
        done = await trio.to_thread.run_sync(lambda: [r.id for _, r in self._core.records(q, time.time()) if self._trees.outcome_known(r)])
        for job_id in done:
            await self._trees.forget_completed(queue, job_id)

        def run() -> int:
            with self._core.locked(q):
                # ... and an unfinished one counts as cancelled (notes, before the records go)
                for _, r in self._core.records(q, time.time()):
                    self._trees.removing(q, r)
                q.bump()
                for lane in q.lanes:
                    _unlink_entries(lane)
                _unlink_entries(q.delayed)
                for worker in os.listdir(q.proc):
                    _unlink_entries(os.path.join(q.proc, worker))
                n = _unlink_entries(q.jobs)
                _unlink_entries(q.expiry)
                _unlink_entries(os.path.join(q.path, "flow"))
                q.grp.clear(_unlink_entries)  # the groups' state (not the paused groups)
                if schedules:
                    _unlink_entries(q.schedules)
                q.forget()
                q.cache = [deque() for _ in q.lanes]
                q.cache_front = -1
                self._core.publish(q, [StorageEvent(CLEARED, "")])
                return n

        n = await trio.to_thread.run_sync(run)
        await self._core.finish([], self._cleared_dirs(q), True)
        if self._trees.dirty:
            await self._trees.act_on_notes()
        return n

    def _cleared_dirs(self, q: FileQueue) -> set[int]:
        return {q.jobs_fd, q.delayed_fd, q.expiry_fd, *q.lane_fds}
