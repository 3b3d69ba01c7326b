"""The Reaper: puts back the jobs of workers that died or stopped renewing their leases."""

from __future__ import annotations

import logging
import math
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import trio

from .._model import _validate as check
from .._model._clock import monotonic as _monotonic
from .._model._clock import now as _now
from .._model._errors import ValidationError
from ._emitter import Emitter, EventCallback
from ._observers import QueueObserver, notify
from ._scheduler import Scheduler
from ..storage._base import Storage, StorageEvent
from ..storage._capabilities import Schedules

__all__ = ["LeaderElection", "Reaper"]

logger = logging.getLogger("trioqueue")

_DUE_KINDS = frozenset({"due"})
_DUE_SLACK = 0.005  # seconds: a scan for a due time comes this much after it


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """Run at most one active reaper per queue: the one holding a lock with a TTL.

    The leader renews the lock every ``renewal_interval`` seconds; a follower tries to take
    it every ``acquire_retry_interval`` seconds, so when the leader dies another reaper
    takes over within about ``lock_ttl + acquire_retry_interval``.
    """

    lock_ttl: float = 30.0
    renewal_interval: float = 10.0
    acquire_retry_interval: float = 5.0

    def __post_init__(self) -> None:
        check.seconds("lock_ttl", self.lock_ttl)
        check.seconds("renewal_interval", self.renewal_interval)
        check.seconds("acquire_retry_interval", self.acquire_retry_interval)
        if self.renewal_interval >= self.lock_ttl:
            raise ValidationError(
                f"renewal_interval ({self.renewal_interval:g} s) must be shorter than lock_ttl ({self.lock_ttl:g} s)"
            )


class Reaper:
    """Recovers stalled jobs of one queue: jobs whose lease expired (their worker stopped
    renewing it) or whose worker's heartbeat expired. Each recovery counts as an attempt:
    below ``max_attempts`` the job is queued again, otherwise it fails with a
    ``StalledJobError``.

    It sleeps until the earliest pending lease deadline or due time (kept by the storage),
    wakes sooner when a ``due`` notice says a job became due earlier (a delayed enqueue, a
    retry), so that delayed jobs turn ``queued`` on time with no consumer running, and
    rescans at least every ``scan_interval`` seconds (default ``visibility_timeout / 10``),
    so a missed event never strands a job. A
    :class:`~trioqueue.Queue` with a handler runs one itself; run your own for producers-only
    deployments or for a dedicated reaper process: ``async with Reaper(storage):`` or
    ``await nursery.start(reaper.run)``. The active reaper also enqueues the ticks of the
    queue's schedules (cron and periodic jobs; ``scheduler=False`` turns that off). Events:
    ``stalled``, ``leadership_acquired``, ``leadership_lost``, ``error``.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        name: str | None = None,
        visibility_timeout: float = 30.0,
        scan_interval: float | None = None,
        leader_election: LeaderElection | None = None,
        owner_id: str | None = None,
        scheduler: bool = True,
        _emitter: Emitter | None = None,
        _observers: Sequence[QueueObserver] = (),
        _fed: bool = False,
    ) -> None:
        self.storage = storage
        self.name = check.job_id(name, "name") if name is not None else "default"
        self.visibility_timeout = check.seconds("visibility_timeout", visibility_timeout)
        self.scan_interval = (
            min(max(self.visibility_timeout / 10, 0.05), 5.0)
            if scan_interval is None
            else check.seconds("scan_interval", scan_interval)
        )
        self.leader_election = leader_election
        self.owner_id = owner_id or f"reaper-{uuid.uuid4().hex[:12]}"
        self._own_events = _emitter is None
        self._events = _emitter or Emitter(self.name)
        self._observers = _observers
        # A storage without schedules has none to tick (``Queue.schedule`` needs them).
        self._scheduler = Scheduler(storage, self.name, self._events) if scheduler and isinstance(storage, Schedules) else None
        self._is_leader = False
        # ``due`` notices: from its own subscription, or (``_fed``) from its Queue's,
        # which calls :meth:`notice_due`
        self._fed = _fed
        self._wake_at = math.inf  # when the leader's next scan is due (epoch seconds)
        self._sooner = trio.Event()  # set when a notice brings it forward
        self._cm: Any = None
        self._nursery: trio.Nursery | None = None

    @property
    def lock_name(self) -> str:
        return f"{self.name}:reaper"

    @property
    def is_leader(self) -> bool:
        """True while this reaper is the active one (always, without leader election)."""
        return self._is_leader

    def on(self, name: str, callback: EventCallback) -> EventCallback:
        """Call ``callback(event)`` for each event ``name`` (see the class docstring)."""
        return self._events.on(name, callback)

    async def __aenter__(self) -> Self:
        self._cm = trio.open_nursery()
        nursery = self._nursery = await self._cm.__aenter__()
        try:
            await nursery.start(self.run)
        except BaseException:
            await self._cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        cm, nursery, self._cm, self._nursery = self._cm, self._nursery, None, None
        if nursery is not None:
            nursery.cancel_scope.cancel()
        await cm.__aexit__(None, None, None)
        return False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reap until cancelled. Reports started once the storage is open (a follower keeps
        trying to become leader in the background)."""
        await self.storage.open()
        try:
            async with trio.open_nursery() as nursery:
                if self._own_events:
                    await nursery.start(self._events.run)
                task_status.started()
                if self.leader_election is None:
                    self._is_leader = True
                    await self._lead()
                else:
                    await self._lead_when_elected(self.leader_election)
        finally:
            self._is_leader = False
            with trio.CancelScope(shield=True):
                if self.leader_election is not None:
                    with trio.move_on_after(5.0):
                        try:
                            await self.storage.release_lock(self.lock_name, self.owner_id)
                        except Exception:
                            pass
                await self.storage.aclose()

    async def _lead_when_elected(self, election: LeaderElection) -> None:
        while True:
            try:
                leader = await self.storage.acquire_lock(self.lock_name, self.owner_id, election.lock_ttl)
            except Exception as exc:
                self._events.emit("error", error=exc, where="acquiring the reaper lock")
                leader = False
            if not leader:
                await trio.sleep(election.acquire_retry_interval)
                continue
            self._is_leader = True
            self._events.emit("leadership_acquired", owner=self.owner_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._lead)
                await self._keep_lock(election)
                nursery.cancel_scope.cancel()
            self._is_leader = False
            self._events.emit("leadership_lost", owner=self.owner_id)

    async def _keep_lock(self, election: LeaderElection) -> None:
        """Renew the lock until renewal is refused or has failed for longer than its TTL."""
        renewed_at = _monotonic()
        while True:
            await trio.sleep(election.renewal_interval)
            try:
                if not await self.storage.acquire_lock(self.lock_name, self.owner_id, election.lock_ttl):
                    return
                renewed_at = _monotonic()
            except Exception as exc:
                self._events.emit("error", error=exc, where="renewing the reaper lock")
                if _monotonic() - renewed_at >= election.lock_ttl - election.renewal_interval:
                    return

    async def _lead(self) -> None:
        """What the active reaper does: recover stalled jobs and run the schedules."""
        async with trio.open_nursery() as nursery:
            if self._scheduler is not None:
                nursery.start_soon(self._scheduler.run)
            await self._reap_forever()

    async def reap_once(self) -> list[tuple[str, str]]:
        """One scan: recover every stalled job now. Returns ``[(job_id, outcome), ...]``."""
        recovered, _ = await self.storage.recover_stalled(self.name)
        self._report(recovered)
        return recovered

    def _report(self, recovered: list[tuple[str, str]]) -> None:
        """Log and emit the recoveries of one scan."""
        if recovered:
            outcomes = Counter(outcome for _, outcome in recovered)
            logger.warning(
                "recovered %d stalled job%s of queue %r (a lease or a worker's heartbeat expired): %s",
                len(recovered),
                "" if len(recovered) == 1 else "s",
                self.name,
                ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())),
            )
        for job_id, outcome in recovered:
            self._emit_recovery(job_id, outcome)

    def _emit_recovery(self, job_id: str, outcome: str) -> None:
        # The storage publishes ``stalled`` on the queue's event stream (which a Queue
        # forwards); a standalone reaper reports it to its own callbacks too.
        if self._own_events:
            self._events.emit("stalled", job_id, outcome=outcome)
        if self._observers:
            notify(self._observers, "job_reaped", self.name, job_id, outcome)

    def notice_due(self, at: float) -> None:
        """A job is due at ``at`` (seconds since the epoch; ``0.0``: events may have been
        lost, look now): the leader scans then if that is sooner than it planned."""
        at += _DUE_SLACK
        if at < self._wake_at:
            self._wake_at = at
            self._sooner.set()

    async def _reap_forever(self) -> None:
        if self._fed:
            await self._reap_loop()
            return
        while True:
            try:
                async with self.storage.subscribe(self.name, _DUE_KINDS) as notices, trio.open_nursery() as nursery:
                    nursery.start_soon(self._follow, notices)
                    self.notice_due(0.0)  # notices may have come before the subscription
                    await self._reap_loop()
            except Exception as exc:  # the subscription failed: scan on the timer meanwhile
                self._events.emit("error", error=exc, where="subscribing to due notices")
                with trio.move_on_after(self.scan_interval):
                    await self._reap_loop()

    async def _follow(self, notices: trio.abc.ReceiveChannel[list[StorageEvent]]) -> None:
        async for batch in notices:
            for ev in batch:
                if ev.kind == "due" and ev.result:
                    self.notice_due(int(ev.result) / 1000)
                elif ev.kind == "resync":
                    self.notice_due(0.0)

    async def _reap_loop(self) -> None:
        while True:
            self._wake_at = math.inf  # notices that come during the scan bring it forward
            try:
                recovered, next_deadline = await self.storage.recover_stalled(self.name)
            except Exception as exc:
                self._events.emit("error", error=exc, where="recovering stalled jobs")
                recovered, next_deadline = [], None
            self._report(recovered)
            wake = _now() + self.scan_interval
            if next_deadline is not None:
                wake = min(wake, next_deadline + _DUE_SLACK)
            self._wake_at = min(self._wake_at, wake)
            while (left := self._wake_at - _now()) > 0:
                self._sooner = trio.Event()
                with trio.move_on_after(left):
                    await self._sooner.wait()
