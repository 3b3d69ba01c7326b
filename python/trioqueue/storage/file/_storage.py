"""FileStorage: its parts, put together."""

from __future__ import annotations

from .._capabilities import Administration, Debounce, Groups, Schedules, Trees
from ._admin import AdminOps
from ._claims import ClaimOps
from ._debounce import DebounceOps
from ._eventlog import EventLog
from ._flows import FileFlows
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
):
    """Durable storage in a directory shared by any number of processes on one machine.

    ``fsync=False`` skips the flushes (faster, survives process crashes but not power
    loss). ``rescan_interval`` is the safety-net period at which blocked ``dequeue`` calls
    and subscriptions re-check the files even without a notification. The event log is
    rotated past ``event_log_max_bytes``. Count-based retention (``keep_completed``,
    ``keep_failed``) is swept in batches of :attr:`keep_every` settled jobs per process
    (see :mod:`trioqueue.storage.file._retention`).
    """
