"""FileStorage: its parts, put together."""

from __future__ import annotations

from ._admin import Admin
from ._consume import Consumer
from ._events import Events
from ._produce import Producer
from ._reap import Reaper

__all__ = ["FileStorage"]


class FileStorage(Producer, Consumer, Reaper, Events, Admin):
    """Durable storage in a directory shared by any number of processes on one machine.
    
    ``fsync=False`` skips the flushes (faster, survives process crashes but not power
    loss). ``rescan_interval`` is the safety-net period at which blocked ``dequeue`` calls
    and subscriptions re-check the files even without a notification. The event log is
    rotated past ``event_log_max_bytes``.
    """
