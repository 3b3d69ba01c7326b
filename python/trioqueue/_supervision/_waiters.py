"""Request/response waiting: how an ``enqueue_and_wait`` caller is parked until the
terminal outcome of *its* incarnation of a job, from events or from the registry."""

from __future__ import annotations

import trio

from ..storage._base import JobRecord, StorageEvent

__all__ = ["Waiter", "Waiters", "terminal_from_record"]


class Waiter:
    """One ``enqueue_and_wait`` caller parked until the terminal event of *its* incarnation
    of the job. Until the enqueue has said which incarnation that is (``bind``), terminal
    events for the id are kept aside; then only the one carrying its token resolves it."""

    __slots__ = ("event", "token", "early", "outcome", "resync", "stopped")

    def __init__(self) -> None:
        self.event: trio.Event | None = None  # made when the caller parks (most never wait twice)
        self.token: str | None = None
        self.early: list[StorageEvent] | None = []
        self.outcome: StorageEvent | None = None
        self.resync = False  # the stream may have lost our notice: re-read the registry
        self.stopped = False  # the queue stopped

    def offer(self, ev: StorageEvent) -> None:
        if self.outcome is not None:
            return
        if self.early is not None:
            self.early.append(ev)
        elif ev.token is None or self.token is None or ev.token == self.token:
            self.outcome = ev
            if self.event is not None:
                self.event.set()

    def bind(self, token: str | None) -> None:
        self.token = token
        early, self.early = self.early, None
        for ev in early or ():
            self.offer(ev)

    def wake(self, *, stopped: bool = False) -> None:
        if stopped:
            self.stopped = True
        else:
            self.resync = True
        if self.event is not None:
            self.event.set()


class Waiters:
    """A queue's parked ``enqueue_and_wait`` callers, by job id: the queue adds and
    removes them, its event listener offers them the terminal events and wakes them all
    when events may have been lost (or the queue stops)."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[str, list[Waiter]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def add(self, job_id: str) -> Waiter:
        waiter = Waiter()
        self._by_id.setdefault(job_id, []).append(waiter)
        return waiter

    def remove(self, job_id: str, waiter: Waiter) -> None:
        waiters = self._by_id.get(job_id)
        if waiters is not None:
            waiters.remove(waiter)
            if not waiters:
                del self._by_id[job_id]

    def offer(self, ev: StorageEvent) -> None:
        """A terminal event: to the waiters of its job."""
        for waiter in self._by_id.get(ev.job_id, ()):
            waiter.offer(ev)

    def wake_all(self, *, stopped: bool = False) -> None:
        """Every waiter re-reads the registry (events may have been lost), or, with
        ``stopped``, learns that the queue stopped."""
        for waiters in self._by_id.values():
            for waiter in waiters:
                waiter.wake(stopped=stopped)


def terminal_from_record(job_id: str, record: JobRecord | None, token: str | None) -> StorageEvent | None:
    """The terminal outcome a registry entry shows for incarnation ``token``, if any.
    An entry that is gone, or belongs to a later incarnation, means ours was cancelled
    (or finished and expired, which a waiter cannot tell apart)."""
    if record is None or (token is not None and record.token is not None and record.token != token):
        return StorageEvent("cancelled", job_id, token=token)
    kind = record.state.partition(":")[0]
    if kind == "completed":
        return StorageEvent("completed", job_id, result=record.result, token=record.token)
    if kind == "failed":
        return StorageEvent("failed", job_id, error=record.error, token=record.token)
    if kind == "cancelled":
        return StorageEvent("cancelled", job_id, token=record.token)
    return None
