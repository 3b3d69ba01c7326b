"""A queue's registry and administration: reading its jobs (:class:`JobReader`) and the
admin calls (:class:`QueueAdmin`: status, results, cancellation, pause, schedules,
retention), each an object the :class:`~trioqueue.Queue` builds and delegates to."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import replace
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

from ..storage._capabilities import Administration, Groups, Schedules, Signals, Steps, Trees, require
from ..storage._records import parse_job_state

if TYPE_CHECKING:
    from ._emitter import Emitter
    from ._listener import Listener
    from ._settings import JobDefaults
    from ..storage._base import JobRecord, Storage

_STATES = [s.value for s in JobState]
_TERMINAL = [s.value for s in JobState if s.terminal]


def _state_name(state: Any, allowed: list[str]) -> str:
    value = state.value if isinstance(state, JobState) else state
    if value not in allowed:
        raise ValidationError(f"unknown state {state!r}: expected one of {', '.join(allowed)}")
    return str(value)

__all__ = ["JobReader", "QueueAdmin"]

P = TypeVar("P")


class JobReader:
    """Reads a queue's registry entries: results and progress decoded by its result serde,
    stored failures raised as exceptions, records as :class:`JobStatus`."""

    def __init__(self, storage: Storage, name: str, result_serde: Serde) -> None:
        self.storage = storage
        self.name = name
        self.result_serde = result_serde

    def load_result(self, job_id: str, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return self.result_serde.loads(data)
        except Exception as exc:
            raise TrioQueueError(f"stored result of job {job_id!r} cannot be decoded: {exc}") from exc

    async def raise_stored_failure(self, job_id: str, error: bytes | None) -> None:
        if error is None:
            record = await self.storage.get_job(self.name, job_id)
            error = record.error if record is not None else None
        job_error = decode_error(error) if error is not None else JobError("UnknownError", "error not stored")
        if job_error.type == "ChildJobFailedError":
            raise ChildJobFailedError(job_id, job_error)
        raise JobFailedError(job_id, job_error)

    def status(self, record: JobRecord) -> JobStatus:
        jid = record.id
        kind, ms, extra = parse_job_state(record.state)
        return JobStatus(
            id=jid,
            state=JobState(kind),
            created_at=record.created_at_ms / 1000,
            attempts=record.attempts,
            result=self.load_result(jid, record.result) if kind == "completed" else None,
            error=decode_error(record.error) if record.error is not None else None,
            worker_id=extra if kind == "processing" else None,  # type: ignore[arg-type]
            updated_at=ms / 1000,
            run_at=extra / 1000 if kind == "delayed" else None,  # type: ignore[operator]
            progress=None if record.progress is None else self.load_result(jid, record.progress),
            priority=record.priority,
            parent=None if record.parent is None else JobRef(*record.parent),
            group=record.group,
        )


class QueueAdmin(Generic[P]):
    """A queue's registry look-ups and administration (the :class:`~trioqueue.Queue`'s
    methods of the same names, documented there): on ``storage``, for queue ``name``,
    with the queue's job ``defaults`` (schedules), its ``reader``, its ``listener`` (a
    call that publishes events waits for the subscription it asked for; pauses reach the
    attached consumers), its ``events`` emitter (streams), ``new_token`` (a retried job's
    incarnation) and ``check_running`` (raises unless the queue runs)."""

    def __init__(
        self,
        storage: Storage,
        name: str,
        defaults: JobDefaults,
        reader: JobReader,
        listener: Listener,
        events: Emitter,
        new_token: Callable[[], str],
        check_running: Callable[[], None],
    ) -> None:
        self.storage = storage
        self.name = name
        self.defaults = defaults
        self.reader = reader
        self.listener = listener
        self.emitter = events
        self.new_token = new_token
        self.check_running = check_running

    async def children(self, job_id: str) -> dict[JobRef, JobStatus]:
        jid = check.job_id(job_id)
        self.check_running()
        if not isinstance(self.storage, Trees):
            return {}  # no trees: no children
        records = await self.storage.get_children(self.name, jid)
        return {JobRef(q, r.id): self.reader.status(r) for q, r in records}

    async def cancel(self, job_id: str) -> CancelResult:
        jid = check.job_id(job_id)
        self.check_running()
        await self.listener.caught_up()
        return CancelResult(jid, await self.storage.cancel(self.name, jid))

    async def signal(self, job_id: str, name: str, payload: Any = None) -> str:
        jid = check.job_id(job_id)
        if not isinstance(name, str) or not name:
            raise ValidationError(f"signal name for job {jid!r} must be a non-empty string, got {name!r}")
        try:
            data = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"payload of signal {name!r} to job {jid!r} is not JSON-serializable: {exc}") from None
        self.check_running()
        signals = require(self.storage, Signals, "Queue.signal")
        return await signals.signal(self.name, jid, name, data)

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
        name = check.job_id(name, "schedule name")
        self.check_running()
        data = encode_value(self.defaults.payload_serde, payload, "payload of schedule", ValidationError, name)
        attempts = (
            self.defaults.max_attempts if max_attempts is None else check.positive_int("max_attempts", max_attempts, job=name)
        )
        ttl = self.defaults.result_ttl if result_ttl is None else check.seconds("result_ttl", result_ttl, job=name)
        built = Schedule.build(
            name, data, cron=cron, every=every, tz=tz, missed=missed, max_attempts=attempts, result_ttl=ttl
        )
        storage = require(self.storage, Schedules, f"schedule {name!r}")
        while True:  # read, merge, compare-and-set: a lost race reads the winner's
            entry = (await storage.get_schedules(self.name)).get(name)
            stored = None
            if entry is not None:
                try:
                    stored = Schedule.decode(name, *entry)
                except (ValueError, KeyError, TypeError):
                    stored = None  # unreadable: replaced, as if new
            schedule = built.registered_over(stored)
            if schedule == stored:
                return schedule  # unchanged: nothing to write
            if await storage.put_schedule(self.name, name, schedule.encode(), None if entry is None else entry[0]):
                return schedule

    async def schedules(self) -> list[Schedule]:
        self.check_running()
        if not isinstance(self.storage, Schedules):
            return []  # no storage of schedules: none
        return await Scheduler(self.storage, self.name, self.emitter).load()

    async def unschedule(self, name: str) -> bool:
        name = check.job_id(name, "schedule name")
        self.check_running()
        return await require(self.storage, Schedules, "Queue.unschedule").remove_schedule(self.name, name)

    @asynccontextmanager
    async def events(
        self, *kinds: str, job_ids: Collection[str] | None = None, buffer: int = 1000
    ) -> AsyncIterator[EventStream]:
        self.check_running()
        stream = EventStream(self.name, kinds or None, job_ids, buffer)
        await self.listener.ensure(level_for(stream.kinds))  # live before the stream is
        self.emitter.streams.append(stream)
        try:
            yield stream
        finally:
            stream.close()
            self.emitter.streams.remove(stream)

    def watch(self, job_id: str) -> AsyncIterator[JobStatus | None]:
        return watch(self, check.job_id(job_id))

    async def pause(self) -> bool:
        self.check_running()
        await self.listener.caught_up()
        changed = await require(self.storage, Administration, "Queue.pause").set_paused(self.name, True)
        for consumer in list(self.listener.consumers):
            await consumer.pause()  # this process's workers now; other workers hear the notice
        return changed

    async def resume(self) -> bool:
        self.check_running()
        await self.listener.caught_up()
        return await require(self.storage, Administration, "Queue.resume").set_paused(self.name, False)

    async def is_paused(self) -> bool:
        self.check_running()
        if not isinstance(self.storage, Administration):
            return False  # it cannot be paused
        return await self.storage.is_paused(self.name)

    async def pause_group(self, group: str) -> bool:
        g = check.group(group)
        self.check_running()
        return await require(self.storage, Groups, "Queue.pause_group").set_group_paused(self.name, g, True)

    async def resume_group(self, group: str) -> bool:
        g = check.group(group)
        self.check_running()
        return await require(self.storage, Groups, "Queue.resume_group").set_group_paused(self.name, g, False)

    async def paused_groups(self) -> list[str]:
        self.check_running()
        if not isinstance(self.storage, Groups):
            return []  # no groups: none paused
        return await self.storage.paused_groups(self.name)

    async def group_counts(self) -> dict[str, dict[str, int]]:
        self.check_running()
        return await require(self.storage, Groups, "Queue.group_counts").group_counts(self.name)

    async def get_status(self, job_id: str) -> JobStatus | None:
        jid = check.job_id(job_id)
        self.check_running()
        record = await self.storage.get_job(self.name, jid)
        if record is None:
            return None
        status = await self._status(record)
        if isinstance(self.storage, Steps):  # its stored steps (Job.step)
            stored = await self.storage.get_steps(self.name, jid)
            # (the internal steps of Job.wait_for_signal, named with a NUL first, are left out)
            steps = {name: self.reader.load_result(jid, v) for name, v in stored.items() if not name.startswith("\x00")}
            status = replace(status, steps=steps)
        return status

    async def get_statuses(self, job_ids: Iterable[str]) -> list[JobStatus | None]:
        if isinstance(job_ids, str):
            raise ValidationError(f"job_ids must be a collection of job ids, not the string {job_ids!r}")
        ids = [check.job_id(jid) for jid in job_ids]
        self.check_running()
        records = await self.storage.get_jobs(self.name, ids)
        return [None if record is None else await self._status(record) for record in records]

    async def _status(self, record: JobRecord) -> JobStatus:
        """The status of ``record``; a tree's parent's with its children's counts by state
        (one more read)."""
        status = self.reader.status(record)
        if record.children and isinstance(self.storage, Trees):
            status = with_children(status, await self.storage.get_children(self.name, record.id))
        return status

    async def counts(self) -> dict[JobState, int]:
        self.check_running()
        raw = await self.storage.counts(self.name)
        return {state: raw.get(state.value, 0) for state in JobState}

    async def list_jobs(self, state: JobState | str, *, limit: int = 100, cursor: str | None = None) -> JobPage:
        kind = _state_name(state, _STATES)
        limit = check.positive_int("limit", limit)
        if cursor is not None and (not isinstance(cursor, str) or not cursor):
            raise ValidationError(f"cursor must be a string returned by list_jobs, got {cursor!r}")
        self.check_running()
        try:
            records, nxt = await self.storage.list_jobs(self.name, kind, limit=limit, cursor=cursor)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        return JobPage([self.reader.status(r) for r in records], nxt)

    async def retry(self, job_id: str, *, reset_steps: bool = False) -> bool:
        jid = check.job_id(job_id)
        self.check_running()
        await self.listener.caught_up()
        admin = require(self.storage, Administration, "Queue.retry")
        return await admin.retry_job(self.name, jid, self.new_token(), reset_steps=bool(reset_steps))

    async def purge(self, state: JobState | str, *, older_than: float | None = None) -> int:
        kind = _state_name(state, _TERMINAL)
        if older_than is not None:
            older_than = check.non_negative_seconds("older_than", older_than)
        self.check_running()
        return await require(self.storage, Administration, "Queue.purge").purge(self.name, kind, older_than=older_than)

    async def remove(self, job_id: str) -> bool:
        jid = check.job_id(job_id)
        self.check_running()
        await self.listener.caught_up()
        return await require(self.storage, Administration, "Queue.remove").remove_job(self.name, jid)

    async def clear(self, *, schedules: bool = False) -> int:
        if not isinstance(schedules, bool):
            raise ValidationError(f"schedules must be a bool, got {schedules!r}")
        self.check_running()
        await self.listener.caught_up()
        return await require(self.storage, Administration, "Queue.clear").clear(self.name, schedules=schedules)

    async def get_result(self, job_id: str) -> Any:
        jid = check.job_id(job_id)
        self.check_running()
        record = await self.storage.get_job(self.name, jid)
        if record is None:
            raise JobNotFinishedError(jid, None)
        kind = record.state.partition(":")[0]
        if kind == "completed":
            return self.reader.load_result(jid, record.result)
        if kind == "failed":
            await self.reader.raise_stored_failure(jid, record.error)
        if kind == "cancelled":
            raise JobCancelledError(jid)
        raise JobNotFinishedError(jid, kind)

    async def update_result_ttl(self, job_id: str, ttl: float) -> UpdateTTLStatus:
        jid = check.job_id(job_id)
        ttl = check.seconds("ttl", ttl, job=jid)
        self.check_running()
        return await self.storage.update_result_ttl(self.name, jid, ttl)
