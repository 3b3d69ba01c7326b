"""The claims a worker holds, and where each one is: the state its consumer, its lease
keeper and its batch runner share (:class:`ClaimLedger`), with the few moves between
states that each of them makes."""

from __future__ import annotations

from collections import deque

import trio

from ..storage._base import Claim, Settlement
from ._execution import Cancellations

__all__ = ["ClaimLedger"]


class ClaimLedger:
    """Every claimed job is *held* (counted in ``held``) from its claim until its
    settlement is stored, and is in exactly one of: ``buffer`` (claimed, not started),
    ``running`` (claim token -> job id: a worker task has it, starting or running; by
    claim, for one worker may hold two claims of a job whose lease ran out and came back
    to it), ``pending`` (finished, settlement not stored yet). ``lost``: claim tokens
    given up (their lease lost) whose handlers have not ended yet; nothing is stored for
    them. ``interrupted``: jobs whose handlers a forced stop cut short.

    ``cancellations`` are the executor's (the ``cancel()`` requests, by claim token, and
    the running handlers' scopes); ``spent_scopes`` the scopes a ``cancel()`` or a lost
    lease cancelled (never reused). The parking lots: ``work`` (idle worker tasks, with
    ``waking`` of them woken for claims that have not run yet), ``filled`` (batch workers
    waiting for the buffer to fill), ``capacity`` (the fetcher, when ``held`` is at the
    limit), ``settle_wakeup`` (the settler), ``lost_ended`` (workers waiting for a lost
    claim's handler to end). ``draining``: a graceful stop began."""

    __slots__ = (
        "buffer", "cancel_requests", "capacity", "draining", "filled", "held", "interrupted", "lost", "lost_ended",
        "pending", "running", "scopes", "settle_wakeup", "spent_scopes", "waking", "work",
    )

    def __init__(self, cancellations: Cancellations) -> None:
        self.buffer: deque[Claim] = deque()
        self.running: dict[str, str] = {}
        self.pending: list[Settlement] = []
        self.held = 0
        self.lost: set[str] = set()
        self.interrupted: set[str] = set()
        self.scopes = cancellations.scopes
        self.cancel_requests = cancellations.requested
        self.spent_scopes: set[trio.CancelScope] = set()
        self.work = trio.lowlevel.ParkingLot()
        self.waking = 0
        self.filled = trio.lowlevel.ParkingLot()
        self.capacity = trio.lowlevel.ParkingLot()
        self.settle_wakeup = trio.lowlevel.ParkingLot()
        self.lost_ended = trio.lowlevel.ParkingLot()
        self.draining = False

    def unhold(self, n: int) -> None:
        """``n`` claims are no longer held (settled, or not ours any more)."""
        self.held -= n
        self.capacity.unpark_all()

    def wake_worker(self) -> None:
        """Wake one idle worker, unless one is waking already: a woken worker that finds
        more claims wakes the next (a chain), so claims that one worker runs back to back
        cost no wake-up of the others, and handlers that block still spread at once."""
        if not self.waking and self.work.unpark():
            self.waking += 1

    def cancel_spent(self, token: str) -> None:
        """Claim ``token`` ends without its handler running (given up, or its start
        refused: the storage ended it, cancelled if a ``cancel()`` reached it): a cancel
        request for it is spent."""
        self.cancel_requests.discard(token)

    def drop_lost(self, job_id: str, token: str) -> None:
        """A claim given up (its lease lost) is no longer running: nothing is stored for
        it (the storage counted its attempt; the reaper, or the job's next claim, decides)."""
        self.lost.discard(token)
        self.lost_ended.unpark_all()
        self.unhold(1)
        self.cancel_spent(token)
