"""Cron and periodic jobs: schedules stored in the storage, ticks enqueued by one leader.

A :class:`Schedule` is stored by name in the queue's storage (so every process sees the
same set, and they survive restarts). The active reaper of the queue (one per queue, by
leader election) also runs the scheduler loop: it sleeps until the next tick of any
schedule (or at most :data:`REFRESH` seconds, to pick up changes made elsewhere), then
runs each due tick with :meth:`~trioqueue.storage.Schedules.tick_schedule`: in one atomic
step, a tick later than the schedule's recorded last tick enqueues its job, with the
deterministic id ``<name>@<tick in UTC, ISO 8601>``, and becomes the last tick; a tick
not later changes nothing. Two schedulers at once, or a failover at any moment, cannot
run a tick twice, however short its job's result TTL.

Late and missed ticks: a tick found within :data:`MISFIRE_GRACE` seconds of its time (a
leader change, a busy loop) is late, not missed: each such tick runs, once, in order. A
tick found more than the grace late was missed (no scheduler ran): with
``missed="run_once"`` the latest missed tick runs once (before the on-time ones), with
``missed="skip"`` none does; the last tick then moves past them. One pass catches up at
most :data:`MAX_CATCH_UP` on-time ticks per schedule (older ones count as missed), so a
tiny ``every`` cannot stall the scheduler.

Registering a schedule again (:meth:`~trioqueue.Queue.schedule`, say at every start-up)
keeps its tick grid (``created_at``) and its last tick, and writes nothing when it is
unchanged; the write is a compare-and-set, so concurrent registrations agree on one grid.

Cron expressions are evaluated by `cronsim <https://pypi.org/project/cronsim/>`_ (chosen
over croniter: no dependencies, maintained, DST handled tick by tick in the schedule's
timezone).
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import trio
from cronsim import CronSim, CronSimError

from .._model import _validate as check
from .._core import encode_envelope
from .._model._clock import now as _now
from .._model._errors import ValidationError
from ._emitter import Emitter
from ..storage._base import NewJob
from ..storage._capabilities import Schedules

__all__ = ["MAX_CATCH_UP", "MISFIRE_GRACE", "REFRESH", "Missed", "Schedule", "Scheduler"]

Missed = Literal["run_once", "skip"]
REFRESH = 1.0  # seconds: the longest the scheduler sleeps before re-reading the schedules
MISFIRE_GRACE = 60.0  # seconds: a tick found more than this after its time was missed
MAX_CATCH_UP = 1000  # on-time ticks of one schedule run by one pass (older ones: missed)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule. ``payload`` is serialized (by the queue's payload serde).

    Ticks: a ``cron`` expression evaluated in ``tz``, or every ``every`` seconds from
    ``created_at`` (the first tick at ``created_at``; no tick is before it). ``missed`` is
    the policy for ticks that passed while no scheduler ran (found more than
    :data:`MISFIRE_GRACE` seconds late): ``run_once`` enqueues the latest of them once,
    ``skip`` drops them; ticks found later than their time but within the grace each run.
    ``last_tick`` is the latest tick already run or skipped (seconds since the epoch),
    kept by the storage.
    """

    name: str
    payload: bytes
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    missed: Missed = "run_once"
    max_attempts: int = 3
    result_ttl: float = 3600.0
    created_at: float = 0.0
    last_tick: float | None = None

    @classmethod
    def build(
        cls,
        name: str,
        payload: bytes,
        *,
        cron: str | None,
        every: float | None,
        tz: str,
        missed: str,
        max_attempts: int,
        result_ttl: float,
    ) -> Schedule:
        """A validated schedule created now (``ValidationError`` naming the schedule)."""
        where = f"schedule {name!r}"
        if (cron is None) == (every is None):
            raise ValidationError(f"{where}: give cron or every, exactly one")
        if missed not in ("run_once", "skip"):
            raise ValidationError(f"{where}: missed must be 'run_once' or 'skip', got {missed!r}")
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValidationError(f"{where}: unknown timezone {tz!r}") from None
        if cron is not None:
            if not isinstance(cron, str):
                raise ValidationError(f"{where}: cron must be a string, got {type(cron).__name__}")
            try:
                CronSim(cron, datetime.now(zone))
            except CronSimError as exc:
                raise ValidationError(f"{where}: invalid cron expression {cron!r}: {exc}") from None
        if every is not None:
            every = check.seconds("every", every)
        return cls(name, payload, cron, every, tz, missed, max_attempts, result_ttl, _now())  # type: ignore[arg-type]

    # -- ticks ---------------------------------------------------------------------------

    def next_tick(self, after: float) -> float:
        """The first tick strictly after ``after`` (seconds since the epoch)."""
        if self.every is not None:
            if after < self.created_at:
                return self.created_at
            return self.created_at + (math.floor((after - self.created_at) / self.every) + 1) * self.every
        assert self.cron is not None
        start = datetime.fromtimestamp(after, ZoneInfo(self.tz))
        return next(iter(CronSim(self.cron, start))).timestamp()

    def latest_tick(self, at: float) -> float | None:
        """The last tick at or before ``at`` (and not before ``created_at``), if any."""
        return next(self.ticks_back(at), None)

    def ticks_back(self, at: float) -> Iterator[float]:
        """The ticks at or before ``at``, latest first, down to the first (``created_at``
        or the first cron tick after it)."""
        if at < self.created_at:
            return
        if self.every is not None:
            for k in range(math.floor((at - self.created_at) / self.every), -1, -1):
                yield self.created_at + k * self.every
            return
        assert self.cron is not None
        # reverse iteration yields ticks strictly before its start: start just after ``at``
        start = datetime.fromtimestamp(at, ZoneInfo(self.tz)) + timedelta(milliseconds=1)
        for when in CronSim(self.cron, start, reverse=True):
            tick = when.timestamp()
            if tick < self.created_at:
                return
            yield tick

    def registered_over(self, stored: Schedule | None) -> Schedule:
        """This schedule as it replaces ``stored`` (the same name's, or ``None``): it keeps
        the stored ``created_at`` (its tick grid) and ``last_tick`` (its tick history)."""
        if stored is None:
            return self
        return replace(self, created_at=stored.created_at, last_tick=stored.last_tick)

    def job_id(self, tick: float) -> str:
        """The deterministic id of the job for ``tick``: ``<name>@2026-11-23T03:00:00Z``."""
        stamp = datetime.fromtimestamp(tick, UTC).isoformat(timespec="milliseconds")
        if stamp.endswith(".000+00:00"):
            stamp = stamp[: -len(".000+00:00")] + "+00:00"
        return f"{self.name}@{stamp.replace('+00:00', 'Z')}"

    # -- storage form --------------------------------------------------------------------

    def encode(self) -> bytes:
        """The stored spec (JSON; ``last_tick`` is kept apart by the storage)."""
        spec: dict[str, Any] = {
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "cron": self.cron,
            "every": self.every,
            "tz": self.tz,
            "missed": self.missed,
            "max_attempts": self.max_attempts,
            "result_ttl": self.result_ttl,
            "created_at": self.created_at,
        }
        return json.dumps(spec, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, name: str, data: bytes, last_tick: float | None) -> Schedule:
        spec = json.loads(data)
        return cls(
            name,
            base64.b64decode(spec["payload"]),
            spec["cron"],
            spec["every"],
            spec["tz"],
            spec["missed"],
            int(spec["max_attempts"]),
            float(spec["result_ttl"]),
            float(spec["created_at"]),
            last_tick,
        )


class Scheduler:
    """The scheduler loop of one queue (run by its active reaper)."""

    def __init__(self, storage: Schedules, queue: str, events: Emitter) -> None:
        self.storage = storage
        self.queue = queue
        self._events = events

    async def load(self) -> list[Schedule]:
        stored = await self.storage.get_schedules(self.queue)
        out = []
        for name, (spec, last_tick) in sorted(stored.items()):
            try:
                out.append(Schedule.decode(name, spec, last_tick))
            except (ValueError, KeyError, TypeError) as exc:
                self._events.emit("error", error=f"schedule {name!r} is unreadable: {exc}", where="scheduler")
        return out

    def due_ticks(self, schedule: Schedule, now: float) -> list[tuple[float, bool]]:
        """The ticks of ``schedule`` to run now, in order, each with whether its job is
        enqueued (``False``: a missed tick skipped): the latest missed tick (found more
        than :data:`MISFIRE_GRACE` late, or older than the latest :data:`MAX_CATCH_UP`
        on-time ticks) if any, then every on-time tick later than the last tick."""
        last = schedule.last_tick
        on_time: list[float] = []
        missed: float | None = None
        for tick in schedule.ticks_back(now):
            if last is not None and tick <= last:
                break
            if now - tick > MISFIRE_GRACE or len(on_time) == MAX_CATCH_UP:
                missed = tick
                break
            on_time.append(tick)
        due = [] if missed is None else [(missed, schedule.missed == "run_once")]
        return due + [(tick, True) for tick in reversed(on_time)]

    async def tick_once(self, now: float | None = None) -> float:
        """Run every due tick (see :meth:`due_ticks`); return when the next one is due
        (epoch seconds)."""
        now = _now() if now is None else now
        wake = now + REFRESH
        for schedule in await self.load():
            for tick, run in self.due_ticks(schedule, now):
                job = self._job(schedule, tick) if run else None
                await self.storage.tick_schedule(self.queue, schedule.name, tick, job)
            wake = min(wake, schedule.next_tick(now))
        return wake

    def _job(self, schedule: Schedule, tick: float) -> NewJob:
        job_id = schedule.job_id(tick)
        envelope = encode_envelope(
            job_id, schedule.payload, int(_now() * 1000), 0, schedule.max_attempts, int(schedule.result_ttl * 1000)
        )
        token = f"{uuid.uuid4().hex[:12]}-s"
        return NewJob(job_id, envelope, schedule.max_attempts, schedule.result_ttl, token)

    async def run(self) -> None:
        """Enqueue ticks until cancelled; a storage error is reported and retried."""
        while True:
            try:
                wake = await self.tick_once()
            except NotImplementedError:
                return  # a storage without schedules: nothing can be scheduled in it
            except Exception as exc:
                self._events.emit("error", error=exc, where="scheduler")
                wake = _now() + REFRESH
            await trio.sleep(max(0.0, wake - _now()))
