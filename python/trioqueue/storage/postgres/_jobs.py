"""PostgresStorage, part 1: enqueue, cancel, job look-ups, claims, settlements, releases.

Each method is one transaction (``BEGIN`` ... ``COMMIT``, committed shielded from
cancellation; a cancellation before that rolls everything back). Events are ``NOTIFY``
sent inside the transaction, so they are delivered if and only if it commits, in order.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import trio

from ..._drivers.libpq import Connection, Notification
from ..._model._types import CancelStatus, EnqueueStatus, UpdateTTLStatus
from .._base import (
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    JobRecord,
    NewJob,
    StorageEvent,
    ttl_update_status,
)
from .._flowstate import FlowState
from ._common import now_ms, record, state_string
from ._flows import PostgresFlows

__all__ = ["PostgresJobs"]

_FRONT = 1_000_000  # a release puts back at most this many jobs at once, in order


def _group_args(limits: ClaimLimits | None) -> list[int]:
    """group_claim's group_concurrency, group_rate and its window (ms)."""
    if limits is None:
        return [0, 0, 1000]
    return [limits.group_concurrency, limits.group_rate, max(1, math.ceil(limits.group_per * 1000))]


def _due_ms(at_ms: int) -> bytes:
    return b"%d" % at_ms


class PostgresJobs(PostgresFlows):
    """The job lifecycle of :class:`~trioqueue.storage.postgres.PostgresStorage`."""

    # -- producers ---------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        now = now_ms()
        if (
            len(jobs) == 1
            and queue in self._known_queues
            and (jobs[0].run_at is None or jobs[0].run_at * 1000 <= now)
            and jobs[0].group is None
        ):
            outcome = await self._enqueue_one(queue, jobs[0], now)
            if outcome is not None:
                return [outcome]
        async with self.tx(queue) as conn:
            outcomes, events = await self.enqueue_in(conn, queue, jobs, now)
            await self.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def _enqueue_one(self, queue: str, job: NewJob, now: int) -> EnqueueOutcome | None:
        """The common enqueue (one job, ready now) in one statement and one round trip:
        the insert (or the replacement of a cancelled/expired incarnation) and its
        NOTIFYs, sent only if the row was written. ``None``: use the general path."""
        pairs = self._notifications(queue, [StorageEvent("enqueued", job.id, token=job.token)], True)
        notify = ", ".join(f"pg_notify(${9 + 2 * i}, ${10 + 2 * i})" for i in range(len(pairs)))
        async with self.conn() as conn:
            inserted = await conn.fetchval(
                self._sql["enqueue_one"].replace("{notify}", notify),  # (one pg_notify a pair)
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
                self._sql["live_job"],
                queue,
                now,
                job.id,
            )
        return None if row is None else self._existing_outcome(row, job)

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
                self._sql["live_jobs"],
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
                    self._sql["first_due"], queue
                )
            run_at = [math.ceil(j.run_at * 1000) if j in delayed and j.run_at is not None else None for j in new]
            rows = await conn.fetch(
                self._sql["enqueue_rows"],
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
                    self._sql["live_jobs_raced"],
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
                    events.append(StorageEvent("due", "", result=_due_ms(due)))
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
                outcomes.append(self._existing_outcome(existing.get(j.id), j))
        return outcomes, events

    @staticmethod
    def _existing_outcome(row: Sequence[Any] | None, job: NewJob) -> EnqueueOutcome:
        if row is None:  # raced and gone again: report it as a duplicate of nothing known
            return EnqueueOutcome(EnqueueStatus.DUPLICATE, None, token=None)
        rec = record(row[:16])
        kind = row[1]
        if kind == "completed" and rec.result is not None:
            return EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state, rec.result, rec.token)
        return EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state, token=rec.token)

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        now = now_ms()
        async with self.tx() as conn:
            await self.lock_ancestors(conn, queue, [job_id])
            row = await conn.fetchrow(
                self._sql["cancel_read"],
                queue,
                now,
                job_id,
            )
            if row is None:
                return CancelStatus.NOT_FOUND
            state, worker, token, requested, ttl, policy = row
            if state in ("queued", "failing", "delayed", "waiting_children"):
                await conn.execute(
                    self._sql["cancel_job"],
                    queue,
                    now,
                    job_id,
                    float(ttl),
                )
                await self.publish(conn, queue, [StorageEvent("cancelled", job_id, token=token)])
                await self.tree_ended(conn, queue, [job_id], now)
                return CancelStatus.CANCELLED
            if state == "cancelled":
                return CancelStatus.CANCELLED
            if state == "processing":
                if not requested:
                    await conn.execute(
                        self._sql["request_cancel"], queue, job_id
                    )
                    await self.publish(conn, queue, [StorageEvent("cancel_requested", job_id, worker, token=token)])
                if policy is not None:
                    await self.cancel_children(conn, queue, job_id, token, now)  # its (dynamic) children go with it
                return CancelStatus.CANCELLED
            return CancelStatus(state)

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        async with self.conn() as conn:
            row = await conn.fetchrow(
                self._sql["get_job"], queue, now_ms(), job_id
            )
        return None if row is None else record(row)

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        async with self.conn() as conn:
            env = await conn.fetchval(
                self._sql["get_envelope"], queue, now_ms(), job_id
            )
        return None if env is None else bytes(env)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        now = now_ms()
        async with self.tx() as conn:
            row = await conn.fetchrow(
                self._sql["update_result_ttl"],
                queue,
                now,
                job_id,
            )
            refused = ttl_update_status(*(row if row is not None else (None, None, None)))
            if refused is not None:
                return refused
            await conn.execute(
                self._sql["set_expiry"],
                queue,
                now,
                job_id,
                float(ttl),
            )
        return UpdateTTLStatus.UPDATED

    # -- consumers ---------------------------------------------------------------------

    async def promote_due(self, conn: Connection, queue: str, now: int) -> list[StorageEvent]:
        """Move the due jobs of the delayed set to the back of their lanes (in due order);
        the events to publish (``requeued`` for a retry, ``promoted`` for a delayed job)."""
        rows = await conn.fetch(
            self._sql["promote_due"],
            queue,
            now,
        )
        rows.sort(key=lambda r: r[3])
        return [StorageEvent("requeued" if old == "failing" else "promoted", jid, token=tok) for jid, old, tok, _ in rows]

    async def _claim(
        self, queue: str, worker_id: str, max_jobs: int, lease: float, start: int, limits: ClaimLimits | None
    ) -> tuple[list[Claim], float | None]:
        """One claim attempt; ``([], wake_at)`` when nothing may be claimed now, ``wake_at``
        (epoch seconds) the earliest time something changes by itself (a due job, the end
        of a hold, the next rate token), or ``None``."""
        now = now_ms()
        if (limits is None or not (limits.rate or limits.concurrency)) and queue in self._known_queues:
            # Two forms: (priority, seq) order while no group has ready jobs, the groups'
            # turns (group_pick) while some do; each says whether the ring has groups, and
            # a queue switches form when that changes (one more round trip then).
            grouped = queue in self._grouped_queues
            fast, ring = await self._claim_fast(queue, worker_id, max_jobs, lease, start, now, limits, grouped)
            if ring != grouped:
                (self._grouped_queues.add if ring else self._grouped_queues.discard)(queue)
                if ring and not (fast and fast[0]):
                    fast, _ = await self._claim_fast(queue, worker_id, max_jobs, lease, start, now, limits, True)
            if fast is not None:
                return fast
        async with self.tx(queue) as conn:
            events = await self.promote_due(conn, queue, now)
            limited = limits is not None and (limits.rate or limits.concurrency)
            row = await conn.fetchrow(
                self._sql["queue_flow_for_update" if limited else "queue_flow"], queue
            )
            paused, flow_data = row if row is not None else (False, None)
            flow = FlowState.loads(flow_data)
            held = 0
            if limits is not None and limits.concurrency:
                held = await conn.fetchval(
                    self._sql["processing_count"], queue
                )
            allow = 0 if paused else flow.allowance(limits, now / 1000, max_jobs, held)
            claims: list[Claim] = []
            grouped = await conn.fetchval(
                self._sql["queue_grouped"],
                queue,
                now,
            )
            if grouped:  # the groups' turns (see group_pick in the schema)
                sql = self._sql["claim_grouped"]
            else:
                sql = self._sql["claim_plain"]
            if allow:
                rows = await conn.fetch(
                    sql,
                    queue,
                    now,
                    allow,
                    worker_id,
                    now + int(lease * 1000),
                    start,
                    *(_group_args(limits) if grouped else []),
                )
                rows.sort(key=lambda r: r[0])
                claims = [Claim(r[2], r[3], r[4] if r[6] else r[4] + 1, r[5], r[6]) for r in rows]
                if claims and limits is not None and limits.rate:
                    flow.claimed(limits, now / 1000, len(claims))
                    await conn.execute(
                        self._sql["write_queue_flow"], queue, flow.dumps()
                    )
            await self.publish(conn, queue, events)
            wake_at: float | None = 0.0 if claims else None  # (claimed: not known, see dequeue)
            if not claims:
                due = await conn.fetchval(
                    self._sql["first_due"],
                    queue,
                )
                rest = await conn.fetchval(self._sql["group_sleep_first"], queue)
                candidates = [
                    t
                    for t in (flow.wake, None if due is None else due / 1000, None if rest is None else rest / 1000)
                    if t is not None and t != math.inf
                ]
                wake_at = min(candidates) if candidates else None
        return claims, wake_at

    async def _claim_fast(
        self, queue: str, worker_id: str, max_jobs: int, lease: float, start: int, now: int, limits: ClaimLimits | None,
        grouped: bool,
    ) -> tuple[tuple[list[Claim], float | None] | None, bool]:
        """A claim without rate or concurrency limits in one statement (one round trip),
        when nothing in the delayed set is due (``None`` otherwise: promoting due jobs
        first is the general path's work). Pause and a ``RateLimited`` hold are honoured.
        ``grouped``: ``group_pick`` picks in the groups' turn order (with the group limits
        of ``limits``), else jobs without a group in (priority, seq) order, and nothing
        while groups have ready jobs. Also returns whether the queue's ring has groups."""
        rows = await self._one_statement(
            self._sql["claim_fast_grouped" if grouped else "claim_fast_plain"],  # (group_claim: see the schema)
            queue,
            now,
            max_jobs,
            worker_id,
            now + int(lease * 1000),
            start,
            *(_group_args(limits) if grouped else []),
        )
        info = rows[-1]
        due, hold, paused, ring = info[7], info[8] or 0.0, info[9], bool(info[10])
        claimed = [r for r in rows if r[2] is not None]
        if claimed:
            claimed.sort(key=lambda r: r[0])
            # (the gate was open: nothing due now and no hold; ``due`` is a later job's time)
            return ([Claim(r[2], r[3], r[4] if r[6] else r[4] + 1, r[5], r[6]) for r in claimed], (
                None if due is None else due / 1000
            )), ring
        if due is not None and due <= now and not paused:
            return None, ring  # due jobs to promote: the general path
        rest = None if info[11] is None else info[11] / 1000  # a group over its rate may be claimed then
        candidates = [t for t in (None if due is None else due / 1000, hold if hold * 1000 > now else None, rest) if t]
        return ([], min(candidates) if candidates else None), ring

    async def _one_statement(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        async with self.conn() as conn:
            return await conn.fetch(sql, *params)

    async def dequeue(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        timeout: float,
        lease: float,
        start: int | None = None,
        limits: ClaimLimits | None = None,
    ) -> list[Claim]:
        start = max_jobs if start is None else start
        give_up = trio.current_time() + timeout
        woken = trio.Event()  # replaced before each claim attempt
        # A settlement's wake-up (payload "s") only frees concurrency slots (the queue's or
        # a group's): a claim without such a limit ignores it (a claim round trip spared, and no empty claim in
        # flight when the next job's wake-up comes)
        slots = limits is not None and bool(limits.concurrency or limits.group_concurrency or limits.group_rate)

        def wake(note: Notification | None) -> None:
            if slots or note is None or note.payload != "s":
                woken.set()

        channel = self.channel(queue, "w")
        await self._count_wakes(queue, channel)
        await self.hub.listen(channel, wake)
        # This worker's last claim came back short (no more ready jobs) and no wake-up came
        # since it was sent: wait for one (or for a due job) instead of an empty claim now
        # (which would be in flight, a round trip to wait for, when the next job comes).
        unlimited = limits is None or not (limits.rate or limits.concurrency or limits.group_concurrency or limits.group_rate)
        short = self._short_claims.pop((queue, worker_id), None)
        try:
            while True:
                woken = trio.Event()  # a NOTIFY during the claim below counts: no lost wake-up
                heard = self._wakes_heard[queue]
                claims: list[Claim]
                if short is not None and short[0] == heard and unlimited and timeout > 0:
                    claims, wake_at = [], short[1]
                else:
                    claims, wake_at = await self._claim(queue, worker_id, max_jobs, lease, start, limits)
                short = None
                if claims:
                    if unlimited and len(claims) < max_jobs and wake_at != 0.0:
                        self._short_claims[queue, worker_id] = (heard, wake_at)
                    return claims
                remaining = give_up - trio.current_time()
                if remaining <= 0:
                    return []
                wait = min(remaining, self.poll_interval)
                if wake_at is not None:
                    wait = min(wait, max(wake_at - time.time(), 0.0) + 0.001)
                await self.hub.wait(woken.is_set, wait)
        finally:
            self.hub.unlisten(channel, wake)

    async def _count_wakes(self, queue: str, channel: str) -> None:
        """Count the claim wake-ups of ``queue`` from the first claim on, between claims too
        (a listener that stays; a lost connection's None counts, a settlement's "s" not)."""
        if queue in self._wakes_heard:
            return
        self._wakes_heard[queue] = 0

        def heard(note: Notification | None) -> None:
            if note is None or note.payload != "s":
                self._wakes_heard[queue] += 1

        await self.hub.listen(channel, heard)

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        async with self.conn() as conn:
            rows = await conn.fetch(
                self._sql["held_jobs"], queue, worker_id
            )
        return [r[0] for r in rows]
