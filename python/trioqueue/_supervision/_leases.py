"""A worker's own view of its leases: when the heartbeat runs, how long before a lease
runs out the worker gives up the claim (self-fencing), its estimate of each claim's
lease deadline, and the part of a consumer that keeps them (:class:`LeaseKeeper`: the
heartbeat, the lease watch, and what a lost claim does).

The storage keeps the real deadline (storage time); the worker cannot read it without a
round trip, so it keeps a conservative estimate on its own monotonic clock
(:func:`time.monotonic`; Trio's virtual time under a ``MockClock``, see ``_model._clock``):
a claim's lease runs from when the claim was made (the start of the claim call when it
returned within a heartbeat interval, else its end: a claim that waited for work was made
when the work came) and each heartbeat that renewed it moves it
to the *start* of that heartbeat call plus ``visibility_timeout``. The storage's deadline
is never earlier than the start of the call that set it plus the lease (but for the travel
of a blocking claim's reply), so a worker that cancels its handler ``lease_margin``
seconds before its own estimate does so before the reaper may hand the job to another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .._model import _clock
from .._model import _validate as check
from .._model._clock import monotonic
from .._model._errors import ValidationError
from ..storage._base import Claim, Storage

if TYPE_CHECKING:
    from ._consumer import ConsumerSettings
    from ._emitter import Emitter
    from ._ledger import ClaimLedger

__all__ = ["EXPIRED", "HEARTBEATS_PER_LEASE", "LeaseKeeper", "Leases", "heartbeat_interval", "lease_margin"]

EXPIRED = "expired"  # why a worker gave up a claim it could not renew in time (``lease_lost``)

# Heartbeats per visibility_timeout. The default margin is two heartbeat intervals, so a
# lease renewed at the start of a heartbeat still has three intervals before the worker
# gives it up: a heartbeat may fail, and the next one take up to an interval, first.
HEARTBEATS_PER_LEASE = 5


def heartbeat_interval(visibility_timeout: float) -> float:
    """Seconds between the starts of a worker's heartbeats."""
    return visibility_timeout / HEARTBEATS_PER_LEASE


def lease_margin(value: Any, visibility_timeout: float) -> float:
    """A Queue's ``lease_margin`` (``None``: two heartbeat intervals), validated: seconds
    >= 0, and less than ``visibility_timeout`` minus one heartbeat interval (else a claim
    would be given up before its first renewal could land). Raises ValidationError."""
    interval = heartbeat_interval(visibility_timeout)
    if value is None:
        return 2 * interval
    margin = check.non_negative_seconds("lease_margin", value)
    limit = visibility_timeout - interval
    if margin >= limit:
        raise ValidationError(
            f"lease_margin must be less than visibility_timeout minus one heartbeat interval "
            f"(visibility_timeout / {HEARTBEATS_PER_LEASE}): {limit:g} s here, got {margin:g}"
        )
    return margin


class Leases:
    """The worker's estimate of the lease deadline of each claim it holds, by claim token,
    on :func:`time.monotonic` (see the module docstring). ``lease`` is the queue's
    ``visibility_timeout``. Entries are added per claim batch and pruned in bulk (see
    :meth:`prune`), never per settled job. ``shared``: claims whose deadline is also
    kept elsewhere (a pool process running the handler, see
    :class:`~._pool.LeaseDeadline`), told of each renewal."""

    __slots__ = ("deadlines", "lease", "shared")

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self.deadlines: dict[str, float] = {}
        self.shared: dict[str, Callable[[float], None]] = {}

    def claimed(self, claims: Sequence[Claim], at: float) -> float:
        """Claims made at ``at`` (monotonic): returns their deadline."""
        deadline = at + self.lease
        deadlines = self.deadlines
        for claim in claims:
            deadlines[claim[3]] = deadline
        return deadline

    def renewed(self, tokens: Iterable[str], at: float) -> None:
        """A heartbeat call that started at ``at`` renewed these claims (tokens no longer
        tracked are left out)."""
        deadline = at + self.lease
        deadlines = self.deadlines
        shared = self.shared
        for token in tokens:
            if token in deadlines:
                deadlines[token] = deadline
                if shared and token in shared:
                    shared[token](deadline)

    def prune(self, keep: Collection[str]) -> None:
        """Forget every claim but those of ``keep`` (the ones still held)."""
        deadlines = self.deadlines
        kept = {t: deadlines[t] for t in keep if t in deadlines}
        deadlines.clear()  # in place: readers hold a reference
        deadlines.update(kept)

    def epoch(self, token: str) -> float | None:
        """The deadline of claim ``token`` in seconds since the epoch (this machine's
        wall clock), or ``None`` if it is not tracked."""
        deadline = self.deadlines.get(token)
        if deadline is None:
            return None
        return _clock.now() + (deadline - monotonic())


class LeaseKeeper:
    """A worker's heartbeat, its lease watch (self-fencing) and what a lost claim does,
    over the claims of its ``ledger``: renews them on ``storage`` for the worker of
    ``settings``, hands the cancel requests the heartbeat brings to ``request_cancel``,
    and emits ``lease_lost`` to ``events``; ``limit`` is how many claims the worker may
    hold (its estimates are pruned beyond twice that).

    A claim whose lease is lost is given up at once: the heartbeat says the storage took
    it away (``lost`` of :meth:`Storage.heartbeat`), or the worker could not renew it and
    its own estimate of the deadline is within ``margin`` (``expired``). A running
    handler is cancelled (its worker's scope, as a ``cancel()`` does), a prefetched claim
    is dropped, nothing is stored for it (the storage counted the attempt; the reaper or
    the job's next claim decides how it ends), and ``lease_lost`` is emitted."""

    def __init__(
        self,
        settings: ConsumerSettings,
        storage: Storage,
        events: Emitter,
        ledger: ClaimLedger,
        request_cancel: Callable[[str], None],
        limit: int,
    ) -> None:
        self.q = settings
        self.storage = storage
        self.events = events
        self.ledger = ledger
        self.request_cancel = request_cancel
        self.limit = limit
        # the worker's estimate of each claim's deadline, the heartbeat interval, and how
        # long before the deadline an unrenewed claim is given up
        self.leases = Leases(settings.visibility_timeout)
        self.interval = heartbeat_interval(settings.visibility_timeout)
        self.margin = settings.lease_margin
        self.watch_wakeup = trio.lowlevel.ParkingLot()
        self.watch_at = math.inf  # when the lease watch wakes next

    def claimed(self, claims: list[Claim], called: float) -> None:
        """Track the leases of new claims, made during the claim call that began at
        ``called`` (monotonic): from its start when it returned within a heartbeat
        interval, else from now (a claim that waited for work was made when it came)."""
        now = monotonic()
        leases = self.leases
        deadline = leases.claimed(claims, called if now - called < self.interval else now)
        if deadline - self.margin < self.watch_at:
            self.watch_wakeup.unpark()
        if len(leases.deadlines) > 2 * self.limit + 64:  # settled claims are forgotten in bulk
            leases.prune({*self.ledger.running, *(c.token for c in self.ledger.buffer), *(s.token for s in self.ledger.pending)})

    async def heartbeat_loop(self) -> None:
        """Renew the worker's registration and the leases of its claims every heartbeat
        interval (from the start of one call to the start of the next), learn the cancel
        requests and the lost claims, and move the renewed claims' deadlines to the start
        of the call that renewed them. The claims given up are left out: the reaper
        recovers them."""
        q = self.q
        interval = self.interval
        due = monotonic()
        while True:
            due += interval
            wait = due - monotonic()
            if wait > 0:
                await trio.sleep(wait)
            else:
                due -= wait  # a late call: the next ones count from now
            lost = self.ledger.lost
            held = [
                *((job_id, token) for token, job_id in self.ledger.running.items() if token not in lost),
                *((c.id, c.token) for c in self.ledger.buffer),
                *((s.id, s.token) for s in self.ledger.pending),
            ]
            began = monotonic()
            try:
                reply = await self.storage.heartbeat(
                    q.queue, q.worker_id, q.visibility_timeout, held, q.visibility_timeout
                )
            except Exception as exc:
                self.events.emit("error", error=exc, where="heartbeat")
                continue
            gone = {claim.token for claim in reply.lost}
            self.leases.renewed((token for _, token in held if token not in gone), began)
            for job_id in reply.cancel_requested:
                self.request_cancel(job_id)
            for job_id, token, why in reply.lost:
                self.lose(job_id, token, why)

    async def lease_watch(self) -> None:
        """Self-fencing: give up each claim (running or prefetched) whose estimated lease
        deadline is within ``margin`` seconds and was not renewed, before the reaper may
        hand its job to another worker. Sleeps until the next such moment; a new claim due
        earlier wakes it (see :meth:`claimed`), renewals only push the moment back."""
        margin = self.margin
        deadlines = self.leases.deadlines
        while True:
            now = monotonic()
            lost = self.ledger.lost
            soonest = math.inf
            expired: list[tuple[str, str]] = []
            held = [*((jid, token) for token, jid in self.ledger.running.items()), *((c.id, c.token) for c in self.ledger.buffer)]
            for job_id, token in held:
                deadline = deadlines.get(token)
                if deadline is None or token in lost:
                    continue
                if deadline - margin <= now:
                    expired.append((job_id, token))
                elif deadline - margin < soonest:
                    soonest = deadline - margin
            for job_id, token in expired:
                self.lose(job_id, token, EXPIRED)
            self.watch_at = soonest
            with trio.move_on_after(max(0.0, soonest - monotonic())):
                await self.watch_wakeup.park()

    def lose(self, job_id: str, token: str, why: str) -> None:
        """The lease of claim ``token`` is lost (``why``: ``recovered``, ``cancelled``,
        ``fenced`` or ``expired``): cancel its handler if it runs (its outcome will not be
        stored), drop it if it waits in the buffer; a claim that finished already is left
        to its settlement (fenced, if stale). Emits ``lease_lost``."""
        if token in self.ledger.lost:
            return
        if token in self.ledger.running:
            self.ledger.lost.add(token)
            scope = self.ledger.scopes.get(token)
            if scope is not None:
                scope.cancel()
                self.ledger.spent_scopes.add(scope)
            # else not started yet (or its handler is over): _work stores nothing for it
        else:
            for claim in self.ledger.buffer:
                if claim.token == token:
                    self.ledger.buffer.remove(claim)
                    self.ledger.unhold(1)
                    break
            else:
                return
        self.events.emit("lease_lost", job_id, worker_id=self.q.worker_id, why=why)
