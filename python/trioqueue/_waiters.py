"""Request/response waiting: how an ``enqueue_and_wait`` caller is parked until the
terminal outcome of *its* incarnation of a job, from events or from the registry."""

from __future__ import annotations

import trio

from .storage._base import JobRecord, StorageEvent

__all__ = ["Waiter", "terminal_from_record"]


class Waiter:
    """One ``enqueue_and_wait`` caller parked until the terminal event of *its* incarnation
    of the job. Until the enqueue has said which incarnation that is (``bind``), terminal
    events for the id are kept aside; then only the one carrying its token resolves it."""

    __slots__ = ("event", "token", "early", "outcome", "resync", "stopped")

    def __init__(self) -> None:
        self.event = trio.Event()
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
        self.event.set()


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
