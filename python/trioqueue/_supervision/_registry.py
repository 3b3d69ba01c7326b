"""The Queue's registry and administration API: status, results, cancellation, pause,
schedules. A mixin of :class:`~trioqueue.Queue` (kept apart to keep each module small)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._model import _validate as check
from .._model._flows import JobRef
from .._model._errors import ChildJobFailedError, JobCancelledError, JobFailedError, JobNotFinishedError, TrioQueueError, ValidationError
from ._execution import encode_value
from ._flows import with_children
from .._model._types import CancelResult, JobError, JobPage, JobState, JobStatus, UpdateTTLStatus
from ._scheduler import Missed, Schedule, Scheduler
from .._model._serde import Serde, decode_error
from ._listener import level_for
from ._streams import EventStream, watch

from ..storage._records import parse_job_state

if TYPE_CHECKING:
    from ._emitter import Emitter
    from ._listener import Listener
    from ..storage._base import JobRecord, Storage

_STATES = [s.value for s in JobState]
_TERMINAL = [s.value for s in JobState if s.terminal]


def _state_name(state: Any, allowed: list[str]) -> str:
    value = state.value if isinstance(state, JobState) else state
    if value not in allowed:
        raise ValidationError(f"unknown state {state!r}: expected one of {', '.join(allowed)}")
    return str(value)

__all__ = ["QueueAdmin"]

P = TypeVar("P")


class QueueAdmin(Generic[P]):
    """Registry look-ups and administration for a queue (see :class:`~trioqueue.Queue`)."""

    storage: Storage
    name: str
    payload_serde: Serde
    result_serde: Serde
    max_attempts: int
    result_ttl: float
    _events: Emitter
    _listener: Listener

    def _check_running(self) -> None:
        raise NotImplementedError

    def _load_result(self, job_id: str, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return self.result_serde.loads(data)
        except Exception as exc:
            raise TrioQueueError(f"stored result of job {job_id!r} cannot be decoded: {exc}") from exc

    async def _raise_stored_failure(self, job_id: str, error: bytes | None) -> None:
        if error is None:
            record = await self.storage.get_job(self.name, job_id)
            error = record.error if record is not None else None
        job_error = decode_error(error) if error is not None else JobError("UnknownError", "error not stored")
        if job_error.type == "ChildJobFailedError":
            raise ChildJobFailedError(job_id, job_error)
        raise JobFailedError(job_id, job_error)

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel a job: a queued, delayed or failing (waiting for its retry) one will never
        run; a running one has its handler cancelled by its worker (wherever it runs; the
        handler may shield cleanup as Trio allows) and is not retried. Its state becomes
        ``cancelled`` for its result TTL (enqueueing the id again starts a new incarnation)
        and its waiters get :class:`JobCancelledError`; a running job that finishes before
        the request reaches it keeps its outcome. Finished jobs are not touched: the status
        says why."""
        jid = check.job_id(job_id)
        self._check_running()
        await self._listener.caught_up()
        return CancelResult(jid, await self.storage.cancel(self.name, jid))

    async def schedule(
        self,
        name: str,
        payload: P | None = None,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        missed: Missed = "run_once",
        max_attempts: int | None = None,
        result_ttl: float | None = None,
    ) -> Schedule:
        """Create or update the schedule ``name``: a job with ``payload`` is enqueued on
        every tick of ``cron`` (evaluated in the IANA timezone ``tz``) or every ``every``
        seconds (the first tick at its first registration), with the id ``<name>@<tick in UTC>``
        (``nightly@2026-11-23T03:00:00Z``), so a tick never runs twice. Schedules live in
        the storage; the queue's active reaper (one per queue) enqueues the ticks.
        ``missed``: ticks that passed while no reaper ran (found more than 60 s late) are
        run once (``run_once``, the latest of them) or skipped (``skip``); later ones
        found within 60 s each run.

        Registering is idempotent, so a worker may declare its schedules at every
        start-up: an unchanged schedule is not written at all, and a changed one keeps its
        tick grid (the first registration's time, :attr:`Schedule.created_at`) and its
        last tick (no tick runs twice, and none that was due is dropped, because of an
        edit). Concurrent registrations agree on one grid (a compare-and-set). Returns the
        schedule as stored."""
        name = check.job_id(name, "schedule name")
        self._check_running()
        data = encode_value(self.payload_serde, payload, "payload of schedule", ValidationError, name)
        attempts = (
            self.max_attempts if max_attempts is None else check.positive_int("max_attempts", max_attempts, job=name)
        )
        ttl = self.result_ttl if result_ttl is None else check.seconds("result_ttl", result_ttl, job=name)
        built = Schedule.build(
            name, data, cron=cron, every=every, tz=tz, missed=missed, max_attempts=attempts, result_ttl=ttl
        )
        while True:  # read, merge, compare-and-set: a lost race reads the winner's
            entry = (await self.storage.get_schedules(self.name)).get(name)
            stored = None
            if entry is not None:
                try:
                    stored = Schedule.decode(name, *entry)
                except (ValueError, KeyError, TypeError):
                    stored = None  # unreadable: replaced, as if new
            schedule = built.registered_over(stored)
            if schedule == stored:
                return schedule  # unchanged: nothing to write
            if await self.storage.put_schedule(self.name, name, schedule.encode(), None if entry is None else entry[0]):
                return schedule

    async def schedules(self) -> list[Schedule]:
        """The queue's schedules, a list sorted by name (each with its ``name``, ``cron`` or
        ``every``, ``tz``, ``missed``, ``last_tick``...)."""
        self._check_running()
        return await Scheduler(self.storage, self.name, self._events).load()

    async def unschedule(self, name: str) -> bool:
        """Remove a schedule (jobs already enqueued stay); False if there was none."""
        name = check.job_id(name, "schedule name")
        self._check_running()
        return await self.storage.remove_schedule(self.name, name)

    @asynccontextmanager
    async def events(
        self, *kinds: str, job_ids: Collection[str] | None = None, buffer: int = 1000
    ) -> AsyncIterator[EventStream]:
        """``async with queue.events("completed", "failed") as stream: async for event in
        stream:`` — the queue's events (every name :meth:`on` accepts; all when no names
        are given), optionally only those of ``job_ids``. At most ``buffer`` events wait for
        a slow reader; beyond that they are dropped and counted (``stream.dropped``) and
        the reader gets one ``resync`` event marking the gap."""
        self._check_running()
        stream = EventStream(self.name, kinds or None, job_ids, buffer)
        await self._listener.ensure(level_for(stream.kinds))  # live before the stream is
        self._events.streams.append(stream)
        try:
            yield stream
        finally:
            stream.close()
            self._events.streams.remove(stream)

    def watch(self, job_id: str) -> AsyncIterator[JobStatus | None]:
        """``async for status in queue.watch(id):`` the job's status, again on each change
        of state or progress, until it is terminal (or unknown: ``None``)."""
        return watch(self, check.job_id(job_id))

    async def pause(self) -> bool:
        """Stop every worker of this queue (in every process) from claiming and starting
        jobs; running jobs finish. Jobs that workers had prefetched go back to the queue:
        none starts once this returns (a job whose attempt was counted before, at its
        claim, is running). Stored in the storage; returns False if it was already
        paused."""
        self._check_running()
        await self._listener.caught_up()
        changed = await self.storage.set_paused(self.name, True)
        for consumer in list(self._listener.consumers):
            await consumer.pause()  # this process's workers now; other workers hear the notice
        return changed

    async def resume(self) -> bool:
        """Let workers claim again (waiting ones wake at once); False if it was not paused."""
        self._check_running()
        await self._listener.caught_up()
        return await self.storage.set_paused(self.name, False)

    async def is_paused(self) -> bool:
        """Whether claiming on this queue is paused."""
        self._check_running()
        return await self.storage.is_paused(self.name)

    async def pause_group(self, group: str) -> bool:
        """Stop every worker of this queue from claiming the jobs of ``group`` (other
        groups' jobs are claimed as before; running jobs finish). Stored in the storage;
        returns False if the group was already paused."""
        g = check.group(group)
        self._check_running()
        return await self.storage.set_group_paused(self.name, g, True)

    async def resume_group(self, group: str) -> bool:
        """Let workers claim the jobs of ``group`` again (waiting ones wake at once);
        False if it was not paused."""
        g = check.group(group)
        self._check_running()
        return await self.storage.set_group_paused(self.name, g, False)

    async def paused_groups(self) -> list[str]:
        """The groups of this queue whose claiming is paused (sorted)."""
        self._check_running()
        return await self.storage.paused_groups(self.name)

    async def group_counts(self) -> dict[str, dict[str, int]]:
        """How many jobs of each group are ``queued`` and ``processing`` (groups with
        any; the jobs without a group under ``""``): ``{group: {"queued": n,
        "processing": n}}``. For inspection (``trioqueue stats --group``): it may scan the
        queue's active jobs."""
        self._check_running()
        return await self.storage.group_counts(self.name)

    async def get_status(self, job_id: str) -> JobStatus | None:
        """The job's registry entry, or ``None`` if the id is unknown (or expired); a
        child names its :attr:`~JobStatus.parent`, a parent has its children's counts by
        state (:attr:`~JobStatus.children`)."""
        jid = check.job_id(job_id)
        self._check_running()
        record = await self.storage.get_job(self.name, jid)
        if record is None:
            return None
        status = self._status(record)
        if record.children:  # a parent: its children's counts by state
            status = with_children(status, await self.storage.get_children(self.name, jid))
        return status

    async def get_statuses(self, job_ids: Iterable[str]) -> list[JobStatus | None]:
        """The statuses of many jobs at once, in the order of ``job_ids`` (``None`` for an
        unknown or expired id, as :meth:`get_status`): one storage call, one round trip
        to the server (Redis: one script, a queue's keys sharing one Cluster slot;
        PostgreSQL: one query), plus one per job that is a parent of a tree (its
        children's counts). A bad id raises :class:`ValidationError` naming it, before
        anything is read."""
        if isinstance(job_ids, str):
            raise ValidationError(f"job_ids must be a collection of job ids, not the string {job_ids!r}")
        ids = [check.job_id(jid) for jid in job_ids]
        self._check_running()
        records = await self.storage.get_jobs(self.name, ids)
        out: list[JobStatus | None] = []
        for record in records:
            if record is None:
                out.append(None)
                continue
            status = self._status(record)
            if record.children:
                status = with_children(status, await self.storage.get_children(self.name, record.id))
            out.append(status)
        return out

    def _status(self, record: JobRecord) -> JobStatus:
        jid = record.id
        kind, ms, extra = parse_job_state(record.state)
        return JobStatus(
            id=jid,
            state=JobState(kind),
            created_at=record.created_at_ms / 1000,
            attempts=record.attempts,
            result=self._load_result(jid, record.result) if kind == "completed" else None,
            error=decode_error(record.error) if record.error is not None else None,
            worker_id=extra if kind == "processing" else None,  # type: ignore[arg-type]
            updated_at=ms / 1000,
            run_at=extra / 1000 if kind == "delayed" else None,  # type: ignore[operator]
            progress=None if record.progress is None else self._load_result(jid, record.progress),
            priority=record.priority,
            parent=None if record.parent is None else JobRef(*record.parent),
            group=record.group,
        )

    async def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (every :class:`JobState`, zeros included)."""
        self._check_running()
        raw = await self.storage.counts(self.name)
        return {state: raw.get(state.value, 0) for state in JobState}

    async def list_jobs(self, state: JobState | str, *, limit: int = 100, cursor: str | None = None) -> JobPage:
        """A page of the jobs in ``state``, newest first (by when they entered it): pass
        the returned ``cursor`` back for the next page (``None`` after the last). Paging
        is stable while jobs come and go; memory is bounded by ``limit``."""
        kind = _state_name(state, _STATES)
        limit = check.positive_int("limit", limit)
        if cursor is not None and (not isinstance(cursor, str) or not cursor):
            raise ValidationError(f"cursor must be a string returned by list_jobs, got {cursor!r}")
        self._check_running()
        try:
            records, nxt = await self.storage.list_jobs(self.name, kind, limit=limit, cursor=cursor)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        return JobPage([self._status(r) for r in records], nxt)

    async def retry(self, job_id: str) -> bool:
        """Run a ``failed`` (or ``cancelled``) job again: it is enqueued anew with its
        original payload and its attempts reset. False if it is not failed/cancelled."""
        jid = check.job_id(job_id)
        self._check_running()
        await self._listener.caught_up()
        return await self.storage.retry_job(self.name, jid, self._new_token())

    async def purge(self, state: JobState | str, *, older_than: float | None = None) -> int:
        """Forget the ``completed``, ``failed`` or ``cancelled`` jobs that entered that
        state more than ``older_than`` seconds ago (all when ``None``); returns how many."""
        kind = _state_name(state, _TERMINAL)
        if older_than is not None:
            older_than = check.non_negative_seconds("older_than", older_than)
        self._check_running()
        return await self.storage.purge(self.name, kind, older_than=older_than)

    async def remove(self, job_id: str) -> bool:
        """Forget a job that is not running (a queued, delayed or failing one never runs);
        False if it is unknown or running."""
        jid = check.job_id(job_id)
        self._check_running()
        await self._listener.caught_up()
        return await self.storage.remove_job(self.name, jid)

    async def clear(self, *, schedules: bool = False) -> int:
        """Empty the queue's storage entirely: every job in every state (queued, delayed,
        running, waiting for a retry or for children, finished) with its results, errors
        and progress, and the rate limits' state (the groups' too: their claimed slots and
        ``group_rate_limit`` windows), is forgotten at once; the schedules are kept unless
        ``schedules`` is true (the pause flag, the paused groups and the worker registry
        always are). Returns how many jobs were forgotten. A worker running one of the jobs does
        not crash: its outcome is refused (fenced, an ``error`` event) and its heartbeat
        gives the claim up (``lease_lost``); waiters of ``enqueue_and_wait`` get
        :class:`JobCancelledError`; every subscriber gets a ``cleared`` event."""
        if not isinstance(schedules, bool):
            raise ValidationError(f"schedules must be a bool, got {schedules!r}")
        self._check_running()
        await self._listener.caught_up()
        return await self.storage.clear(self.name, schedules=schedules)

    def _new_token(self) -> str:
        raise NotImplementedError

    async def get_result(self, job_id: str) -> Any:
        """The cached result of a completed job. Raises :class:`JobFailedError` for a failed
        one, :class:`JobCancelledError` for a cancelled one and :class:`JobNotFinishedError`
        for an unknown or unfinished one."""
        jid = check.job_id(job_id)
        self._check_running()
        record = await self.storage.get_job(self.name, jid)
        if record is None:
            raise JobNotFinishedError(jid, None)
        kind = record.state.partition(":")[0]
        if kind == "completed":
            return self._load_result(jid, record.result)
        if kind == "failed":
            await self._raise_stored_failure(jid, record.error)
        if kind == "cancelled":
            raise JobCancelledError(jid)
        raise JobNotFinishedError(jid, kind)

    async def update_result_ttl(self, job_id: str, ttl: float) -> UpdateTTLStatus:
        """Keep a finished job's result (or error) for ``ttl`` more seconds from now."""
        jid = check.job_id(job_id)
        ttl = check.seconds("ttl", ttl, job=jid)
        self._check_running()
        return await self.storage.update_result_ttl(self.name, jid, ttl)
