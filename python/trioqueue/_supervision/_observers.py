"""Observers: what a Queue does in this process, reported to instruments (metrics).

A :class:`QueueObserver` added to a Queue (``queue._observers``, e.g. by
:meth:`trioqueue.metrics.QueueMetrics.instrument`) is told about every job this process
enqueues, every attempt its consumer starts and settles, and every stalled job its reaper
recovers. Calls are synchronous, on the Trio thread, on the hot path: keep them cheap. An
observer that raises is logged and otherwise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..storage._base import SettleKind

if TYPE_CHECKING:
    from ._queue import Queue

__all__ = ["QueueObserver", "notify"]

logger = logging.getLogger("trioqueue")


class QueueObserver:
    """Base class with no-op methods: override those you need. ``queue`` is the queue's name."""

    def copied(self, queue: Queue[Any, Any]) -> None:
        """``queue`` is a copy (:meth:`Queue.copy`) of an observed queue, observed too."""

    def jobs_enqueued(self, queue: str, count: int) -> None:
        """``count`` new jobs were accepted (duplicates are not counted)."""

    def job_started(self, queue: str, job_id: str, attempt: int, wait: float | None) -> None:
        """An attempt's handler is about to run. ``wait``: seconds the job waited since it
        was enqueued (or became due, when delayed); ``None`` for retries."""

    def job_finished(self, queue: str, job_id: str, outcome: SettleKind, duration: float | None) -> None:
        """An attempt ended: complete, retry, fail (for good) or cancel. ``duration``: the
        handler's seconds, ``None`` when it never ran (cancelled first, unreadable job)."""

    def job_reaped(self, queue: str, job_id: str, outcome: str) -> None:
        """The reaper recovered a stalled job (``outcome``: ``requeued`` or ``failed``)."""


def notify(observers: Sequence[QueueObserver], method: str, *args: object) -> None:
    """Call ``method(*args)`` on every observer; one that raises is logged."""
    for observer in observers:
        try:
            getattr(observer, method)(*args)
        except Exception:
            logger.exception("trioqueue observer %r failed in %s", observer, method)
