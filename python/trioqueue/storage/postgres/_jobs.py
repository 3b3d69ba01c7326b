"""PostgresStorage's jobs (:class:`PgJobs`, a part the storage builds): enqueues (one
statement for the common one), debounced enqueues, cancels and job look-ups.

Each method is one transaction (``BEGIN`` ... ``COMMIT``, committed shielded from
cancellation; a cancellation before that rolls everything back). Events are ``NOTIFY``
sent inside the transaction, so they are delivered if and only if it commits, in order.

Enqueues of jobs ready now (the common ones) are one statement each, autocommit, their
events packed into it (``enqueue_batch``: one round trip, one transaction, however many
jobs). Single enqueues running at the same time on one queue are written together (group
commit): a call that finds the queue's statements in flight waits for one to end, and the
calls that gathered meanwhile go as one statement (one commit, one WAL flush, one set of
NOTIFYs: PostgreSQL serialises the commits of transactions that NOTIFY, so separate
statements would cost a flush each). Once its statement is sent, a cancellation of the
call waits for the outcome (bounded by the call timeout), which stands, as a ``COMMIT``
does. A statement refused for one job's data writes nothing: each of its calls then takes
the general path alone, so only that job's call fails.

Debounce: one transaction per call, the waiting job's row locked while it is debounced.
Two producers debouncing the same new id together: the second's insert waits for the
first's and, once that commits, it debounces the job the first created (it is never a
``duplicate`` of a waiting job).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ..._drivers.libpq import Connection, ConnectionLost
from ..._model._types import CancelStatus, EnqueueStatus, UpdateTTLStatus
from .._base import EnqueueOutcome, JobRecord, NewJob, StorageEvent, ttl_update_status
from ._common import PgDatabase, now_ms, record, state_string
from ._flows import PgTrees

__all__ = ["PgJobs", "due_payload", "existing_outcome"]

_BATCH_MAX = 1000  # gathered single enqueues a statement at most
_COMBINED_IN_FLIGHT = 2  # statements of gathered single enqueues in flight per queue at most


def due_payload(at_ms: int) -> bytes:
    """The payload of a ``due`` event: the time (ms) a job falls due."""
    return b"%d" % at_ms


def existing_outcome(row: Sequence[Any] | None, job: NewJob) -> EnqueueOutcome:
        if row is None:  # raced and gone again: report it as a duplicate of nothing known
            return EnqueueOutcome(EnqueueStatus.DUPLICATE, None, token=None)
        rec = record(row[:16])
        kind = row[1]
        if kind == "completed" and rec.result is not None:
            return EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state, rec.result, rec.token)
        return EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state, token=rec.token)


@dataclass(eq=False, slots=True)
class _Waiter:
    """A single enqueue waiting to be written with others (see the module's docstring):
    ``done`` is set when its outcome (``None``: take the general path) or error is known,
    or when it is to lead (``lead``: send the next statement)."""

    job: NewJob
    done: trio.Event = field(default_factory=trio.Event)
    outcome: EnqueueOutcome | None = None
    error: Exception | None = None
    lead: bool = False
    taken: bool = False


@dataclass(eq=False, slots=True)
class _Gathering:
    """A queue's single enqueues waiting for a statement, and its statements in flight."""

    waiting: list[_Waiter] = field(default_factory=list)
    in_flight: int = 0


class PgJobs:
    """Enqueues, cancels and look-ups of :class:`~trioqueue.storage.postgres.PostgresStorage`,
    on its database; a cancel reaches the job's tree through ``trees``."""

    def __init__(self, db: PgDatabase, trees: PgTrees) -> None:
        self._db = db
        self._trees = trees
        self._gatherings: dict[str, _Gathering] = {}

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        now = now_ms()
        if all(j.run_at is None or j.run_at * 1000 <= now for j in jobs):
            if queue not in self._db.known_queues:  # (its row committed on its own, once)
                await self._db.one_statement(self._db.sql["queue_row"], queue)
                self._db.known_queues.add(queue)
            if len(jobs) == 1:
                found = [await self._gathered(queue, jobs[0])]
            else:  # (one statement, however many: one transaction, as the general path)
                found = await self._write_ready(queue, jobs, now)
            rest = [j for j, o in zip(jobs, found, strict=True) if o is None]
            if not rest:
                return found  # type: ignore[return-value]
            # a row not written nor found live (cancelled or gone meanwhile): the general path
            again = iter(await self._enqueue_tx(queue, rest, now_ms()))
            return [next(again) if o is None else o for o in found]
        return await self._enqueue_tx(queue, jobs, now)

    async def _enqueue_tx(self, queue: str, jobs: Sequence[NewJob], now: int) -> list[EnqueueOutcome]:
        """The general enqueue: one transaction (:meth:`enqueue_in`, then its events)."""
        async with self._db.tx(queue) as conn:
            outcomes, events = await self.enqueue_in(conn, queue, jobs, now)
            await self._db.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def _gathered(self, queue: str, job: NewJob) -> EnqueueOutcome | None:
        """The outcome of enqueueing ``job`` (ready now) with the single enqueues of the
        queue running at the same time (see the module's docstring); ``None``: it was not
        written nor found live (take the general path)."""
        gathering = self._gatherings.setdefault(queue, _Gathering())
        me = _Waiter(job)
        if gathering.in_flight < _COMBINED_IN_FLIGHT:
            gathering.in_flight += 1
            me.lead = True
        else:
            gathering.waiting.append(me)
            try:
                await me.done.wait()
            except BaseException:
                if me.taken:  # its statement is in flight: the outcome stands
                    with trio.CancelScope(shield=True):
                        await me.done.wait()
                elif me.lead:  # its turn to lead came: the next one leads instead
                    self._lead_on(gathering)
                else:
                    gathering.waiting.remove(me)
                raise
        if me.lead:  # (a call chosen to lead is out of ``waiting``: no other takes it)
            await self._write_gathered(queue, gathering, me)
        if me.error is not None:
            raise me.error
        return me.outcome

    def _lead_on(self, gathering: _Gathering) -> None:
        """A statement of the gathering ended (or the call chosen to lead left): the
        first waiting call leads the next, or one fewer is in flight."""
        if gathering.waiting:
            nxt = gathering.waiting.pop(0)
            nxt.lead = True
            nxt.done.set()
        else:
            gathering.in_flight -= 1

    async def _write_gathered(self, queue: str, gathering: _Gathering, leader: _Waiter) -> None:
        """Write ``leader``'s job and those of the waiting calls (up to a batch) in one
        statement, shielded (the call timeout bounds it), tell each its outcome, then
        pass the lead on."""
        batch = [leader, *gathering.waiting[: _BATCH_MAX - 1]]
        del gathering.waiting[: _BATCH_MAX - 1]
        for w in batch:
            w.taken = True
        try:
            with trio.CancelScope(shield=True):
                now = now_ms()
                jobs = [w.job for w in batch]
                if len(jobs) == 1 and jobs[0].group is None:
                    outcomes = [await self._enqueue_one(queue, jobs[0], now)]
                else:
                    outcomes = await self._write_ready(queue, jobs, now)
        except ConnectionLost as exc:  # (a timeout too) the same for every call
            for w in batch:
                w.error = exc
        except Exception as exc:
            if len(batch) == 1:
                leader.error = exc
            # else one job's data failed the statement (nothing written): each call takes
            # the general path on its own (outcome None), and only that job's call fails
        else:
            for w, o in zip(batch, outcomes, strict=True):
                w.outcome = o
        finally:  # (anything else, e.g. KeyboardInterrupt: the others take the general path)
            for w in batch:
                w.done.set()
            self._lead_on(gathering)

    async def _write_ready(self, queue: str, jobs: Sequence[NewJob], now: int) -> list[EnqueueOutcome | None]:
        """Jobs ready now in one statement (``enqueue_batch``: the rows, their events and
        the wake-up, one round trip), then, only if some were not written, a read of the
        live jobs holding their ids. An outcome per job; ``None``: neither written nor
        found live (cancelled or gone meanwhile: the general path decides)."""
        first: dict[str, NewJob] = {}
        for j in jobs:
            first.setdefault(j.id, j)
        new = list(first.values())
        self._db.wake_sent(queue)  # (before the commit: a claim may run early, never late)
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["enqueue_batch"],
                queue,
                now,
                [j.id for j in new],
                [j.priority for j in new],
                [j.token for j in new],
                [j.envelope for j in new],
                [j.max_attempts for j in new],
                [float(j.result_ttl) for j in new],
                [j.group for j in new] if any(j.group is not None for j in new) else None,
                self._db.nonce(),
                self._db.channel(queue, "e"),
                self._db.channel(queue, "w"),
            )
            missing = {r[0] for r in rows if r[0] is not None}
            existing: dict[str, Sequence[Any]] = {}
            if missing:  # duplicates of live jobs (or rows cancelled meanwhile)
                existing = {row[0]: row for row in await conn.fetch(self._db.sql["live_jobs"], queue, now, list(missing))}
        outcomes: list[EnqueueOutcome | None] = []
        seen: set[str] = set()
        for j in jobs:
            inserted = j.id not in missing
            if inserted and j.id not in seen:
                seen.add(j.id)
                outcomes.append(EnqueueOutcome(EnqueueStatus.QUEUED))
            elif inserted:  # the same id twice in one batch
                state = state_string("queued", now, 0, None, None)
                outcomes.append(EnqueueOutcome(EnqueueStatus.DUPLICATE, state, token=first[j.id].token))
            elif j.id in existing:
                outcomes.append(existing_outcome(existing[j.id], j))
            else:
                outcomes.append(None)
        return outcomes

    async def _enqueue_one(self, queue: str, job: NewJob, now: int) -> EnqueueOutcome | None:
        """The common enqueue (one job, ready now) in one statement and one round trip:
        the insert (or the replacement of a cancelled/expired incarnation) and its
        NOTIFYs, sent only if the row was written. ``None``: use the general path."""
        pairs = self._db.notifications(queue, [StorageEvent("enqueued", job.id, token=job.token)], True)
        notify = ", ".join(f"pg_notify(${9 + 2 * i}, ${10 + 2 * i})" for i in range(len(pairs)))
        async with self._db.conn() as conn:
            inserted = await conn.fetchval(
                self._db.sql["enqueue_one"].replace("{notify}", notify),  # (one pg_notify a pair)
                queue,
                now,
                job.id,
                job.priority,
                job.token,
                job.envelope,
                job.max_attempts,
                float(job.result_ttl),
                *itertools.chain.from_iterable(pairs),
            )
            if inserted:
                return EnqueueOutcome(EnqueueStatus.QUEUED)
            row = await conn.fetchrow(
                self._db.sql["live_job"],
                queue,
                now,
                job.id,
            )
        return None if row is None else existing_outcome(row, job)

    async def enqueue_in(
        self, conn: Connection, queue: str, jobs: Sequence[NewJob], now: int
    ) -> tuple[list[EnqueueOutcome], list[StorageEvent]]:
        """The steps of :meth:`enqueue` inside the transaction open on ``conn`` (also run
        by :meth:`tick_schedule` and transactional enqueues); returns the outcomes and the
        events to publish."""
        ids = list(dict.fromkeys(j.id for j in jobs))
        existing = {
            row[0]: row
            for row in await conn.fetch(
                self._db.sql["live_jobs"],
                queue,
                now,
                ids,
            )
        }
        accepted: dict[str, NewJob] = {}
        for j in jobs:
            if j.id not in existing and j.id not in accepted:
                accepted[j.id] = j
        inserted: set[str] = set()
        events: list[StorageEvent] = []
        if accepted:
            new = list(accepted.values())
            delayed = [j for j in new if j.run_at is not None and j.run_at * 1000 > now]
            first_due = None
            if delayed:
                first_due = await conn.fetchval(
                    self._db.sql["first_due"], queue
                )
            run_at = [math.ceil(j.run_at * 1000) if j in delayed and j.run_at is not None else None for j in new]
            rows = await conn.fetch(
                self._db.sql["enqueue_rows"],
                queue,
                now,
                [j.id for j in new],
                [j.priority for j in new],
                run_at,
                [j.token for j in new],
                [j.envelope for j in new],
                [j.max_attempts for j in new],
                [float(j.result_ttl) for j in new],
                [j.group for j in new],
            )
            inserted = {r[0] for r in rows}
            raced = [i for i in accepted if i not in inserted]
            if raced:  # another producer enqueued the id meanwhile: a duplicate of theirs
                for row in await conn.fetch(
                    self._db.sql["live_jobs_raced"],
                    queue,
                    now,
                    raced,
                ):
                    existing[row[0]] = row
            earliest = first_due
            for j, due in zip(new, run_at, strict=True):
                if j.id not in inserted:
                    continue
                events.append(StorageEvent("enqueued", j.id, token=j.token))
                if due is not None and (earliest is None or due < earliest):
                    events.append(StorageEvent("due", "", result=due_payload(due)))
                    earliest = due
        outcomes: list[EnqueueOutcome] = []
        seen: set[str] = set()
        for j in jobs:
            if j.id in inserted and j.id not in seen:
                seen.add(j.id)
                outcomes.append(EnqueueOutcome(EnqueueStatus.QUEUED))
            elif j.id in inserted:  # the same id twice in one batch
                first = accepted[j.id]
                due_ms = math.ceil(first.run_at * 1000) if first.run_at is not None and first.run_at * 1000 > now else None
                state = state_string("delayed" if due_ms else "queued", now, 0, None, due_ms)
                outcomes.append(EnqueueOutcome(EnqueueStatus.DUPLICATE, state, token=first.token))
            else:
                outcomes.append(existing_outcome(existing.get(j.id), j))
        return outcomes, events

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        now = now_ms()
        async with self._db.tx() as conn:
            await self._trees.lock_ancestors(conn, queue, [job_id])
            row = await conn.fetchrow(
                self._db.sql["cancel_read"],
                queue,
                now,
                job_id,
            )
            if row is None:
                return CancelStatus.NOT_FOUND
            state, worker, token, requested, ttl, policy = row
            if state in ("queued", "failing", "delayed", "waiting_children", "waiting_signal"):
                await conn.execute(
                    self._db.sql["cancel_job"],
                    queue,
                    now,
                    job_id,
                    float(ttl),
                )
                await self._db.publish(conn, queue, [StorageEvent("cancelled", job_id, token=token)])
                await self._trees.tree_ended(conn, queue, [job_id], now)
                return CancelStatus.CANCELLED
            if state == "cancelled":
                return CancelStatus.CANCELLED
            if state == "processing":
                if not requested:
                    await conn.execute(
                        self._db.sql["request_cancel"], queue, job_id
                    )
                    await self._db.publish(conn, queue, [StorageEvent("cancel_requested", job_id, worker, token=token)])
                if policy is not None:
                    await self._trees.cancel_children(conn, queue, job_id, token, now)  # its (dynamic) children go with it
                return CancelStatus.CANCELLED
            return CancelStatus(state)

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        async with self._db.conn() as conn:
            row = await conn.fetchrow(
                self._db.sql["get_job"], queue, now_ms(), job_id
            )
        return None if row is None else record(row)

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        async with self._db.conn() as conn:
            env = await conn.fetchval(
                self._db.sql["get_envelope"], queue, now_ms(), job_id
            )
        return None if env is None else bytes(env)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        now = now_ms()
        async with self._db.tx() as conn:
            row = await conn.fetchrow(
                self._db.sql["update_result_ttl"],
                queue,
                now,
                job_id,
            )
            refused = ttl_update_status(*(row if row is not None else (None, None, None)))
            if refused is not None:
                return refused
            await conn.execute(
                self._db.sql["set_expiry"],
                queue,
                now,
                job_id,
                float(ttl),
            )
        return UpdateTTLStatus.UPDATED

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        if not job_ids:
            return []
        async with self._db.conn() as conn:  # one query, one snapshot
            rows = await conn.fetch(
                self._db.sql["get_jobs"],
                queue,
                now_ms(),
                list(job_ids),
            )
        found = {r.id: r for r in map(record, rows)}
        return [found.get(jid) for jid in job_ids]

    # -- debounce ----------------------------------------------------------------------

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        outcomes: list[EnqueueOutcome] = []
        events: list[StorageEvent] = []
        async with self._db.tx(queue) as conn:
            now = now_ms()
            delay_ms = int(delay * 1000)
            for job in jobs:
                found = await self._waiting(conn, queue, job.id)
                if found is None:  # enqueued as usual, due after the debounce
                    first = min(delay_ms, delay_ms if max_wait is None else int(max_wait * 1000))
                    out, evs = await self.enqueue_in(conn, queue, [job._replace(run_at=(now + first) / 1000)], now)
                    events += evs
                    if out[0].status is not EnqueueStatus.DUPLICATE:
                        outcomes += out
                        continue
                    # Another producer's insert of the id, uncommitted at our look, committed
                    # meanwhile (ours waited for it): a debounce of the job it created, if
                    # that still waits (this statement sees it: a new snapshot).
                    found = await self._waiting(conn, queue, job.id)
                    if found is None:
                        outcomes += out
                        continue
                row = await conn.fetchrow(
                    self._db.sql["debounce"],
                    queue,
                    job.id,
                    job.envelope,
                    job.max_attempts,
                    float(job.result_ttl),
                    now + delay_ms,
                    None if max_wait is None else int(max_wait * 1000),
                )
                assert row is not None  # (locked above)
                before = found[1]
                state, state_ms, run_at, token = row
                if state == "delayed" and before is not None and run_at < before:
                    events.append(StorageEvent("due", "", result=due_payload(run_at)))
                outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, state_string(state, state_ms, 0, None, run_at), token=token))
            await self._db.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def _waiting(self, conn: Connection, queue: str, job_id: str) -> tuple[str, int | None] | None:
        """The state and due time of ``job_id`` if it waits (``delayed``/``queued``, never
        claimed in this incarnation: one that ran, asleep or rate limited, is in the middle
        of its run), its row locked until the transaction ends; ``None`` if it is not there
        or not waiting."""
        found = await conn.fetchrow(
            self._db.sql["waiting"], queue, job_id
        )
        if found is None or found[0] not in ("delayed", "queued") or found[2]:
            return None
        return found[0], found[1]
