"""FileStorage: its parts, put together."""

from __future__ import annotations

import os
import time

import trio

from .. import _rules as R
from .._capabilities import Administration, Debounce, Groups, Schedules, Steps, Trees
from .._steps import decode_steps, encode_step
from ._admin import AdminOps
from ._claims import ClaimOps
from ._debounce import DebounceOps
from ._eventlog import EventLog
from ._flows import FileFlows
from ._fsutil import CorruptRecord, encode_name, read_rec
from ._layout import _close_on_error
from ._recovery import RecoveryOps
from ._retention import RetentionOps

__all__ = ["FileStorage"]


class FileStorage(
    FileFlows,
    DebounceOps,
    ClaimOps,
    RecoveryOps,
    EventLog,
    AdminOps,
    RetentionOps,
    Trees,
    Schedules,
    Groups,
    Debounce,
    Administration,
    Steps,
):
    """Durable storage in a directory shared by any number of processes on one machine.

    ``fsync=False`` skips the flushes (faster, survives process crashes but not power
    loss). ``rescan_interval`` is the safety-net period at which blocked ``dequeue`` calls
    and subscriptions re-check the files even without a notification. The event log is
    rotated past ``event_log_max_bytes``. Count-based retention (``keep_completed``,
    ``keep_failed``) is swept in batches of :attr:`keep_every` settled jobs per process
    (see :mod:`trioqueue.storage.file._retention`).
    """

    # -- steps -------------------------------------------------------------------------

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        """One step under the queue's lock: the held record re-written with the entry
        appended (its fsync in the group commit, as a settlement's)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q(queue)
        entry = encode_step(name, value)
        fds: list[int] = []
        ok = False
        async with self._alock(q):
            with _close_on_error(fds):
                pdir = os.path.join(q.proc, self._worker_enc(q, worker_id))
                found = self._held(q, pdir, worker_id, job_id, token)
                if found is not None:
                    enc, r = found
                    ok = R.save_step(r, worker_id, token, entry)
                    if ok:
                        self._commit(q, {enc: r}, fds)
        await self._finish(fds, {q.jobs_fd}, ok)
        return ok

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        await trio.lowlevel.checkpoint()
        q = self._q(queue)
        enc = encode_name(job_id)
        try:
            r = read_rec(os.path.join(q.jobs, enc), enc)
        except CorruptRecord:
            async with self._alock(q):
                r = self._read(q, enc)  # quarantines it if still corrupt
        if r is None or (r.exp is not None and r.exp <= time.time()):
            return {}
        return decode_steps(r.steps)
