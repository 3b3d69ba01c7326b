"""PostgresStorage's claims (:class:`PgClaims`, a part the storage builds): what
happens to a job from its claim on — claims (one statement without rate or concurrency
limits), settlements, releases, starts, heartbeats (leases, fencing), progress, the
worker registry, and the reaper's recovery of stalled jobs.

Each method is one transaction, as in :mod:`._jobs`, but for the one-statement fast
paths (a claim, a batch of completions and failures, a start), each one statement in
autocommit with its events.

Count-based retention (``Settlement.keep``) runs in the settling call, as one more
statement right after the settlement commits (not in its transaction: the fast path
settles a batch in one statement of its own): the jobs of the state past the newest
``keep`` (by the time they entered it, newest first on the ``jobs_by_state`` index) are
deleted. Between the two, another process may see ``keep`` plus this call's batch; the
statement reads ``keep`` index entries, so its cost grows with ``keep``, not with the
queue. A job whose result or error was too large for its event (over 4 KiB) is not
forgotten before a grace of ``READ_BACK_GRACE_MS`` (60 s) from when it ended: its waiter
reads the record back.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import trio

from ..._drivers.libpq import Connection, Notification
from ..._model._serde import encode_error
from .._base import (
    Claim,
    ClaimLimits,
    HeartbeatReply,
    LostClaim,
    SettleKind,
    Settlement,
    StorageEvent,
    lost_why,
)
from .._coalesce import Coalescer, Slot
from .._flowstate import FlowState
from .. import _rules as R
from .._rules import WaitSignal, count_signals, stalled_error
from .._steps import decode_signals, decode_steps, encode_step
from ._common import PgDatabase, PgSettings, now_ms
from ._flows import PgTrees
from ._jobs import due_payload

__all__ = ["READ_BACK_GRACE_MS", "PgClaims"]

_FRONT = 1_000_000  # a release puts back at most this many jobs at once, in order
# the settle kinds' tables are the rules' (put back: cancelled instead if requested; the
# ends of a run a child's failure under ``cancel`` turns into the parent's; uncounted)
_BACK, _ENDS_BY_CHILDREN, _UNCOUNTED, _KEPT = R.BACK, R.ENDS_BY_CHILDREN, R.UNCOUNTED, R.KEPT
_ENDS = R.TERMINAL_KINDS
# A result/error up to this size rides along in its event (NOTIFY's 8000-byte payloads,
# base64: an event carries up to about 5 KB of it, whichever path settled it); a larger
# one is read back from the record by its waiter, so count-based retention leaves the
# record that long after the job ended (then it runs out, as if its TTL had).
_RIDES_ALONG = 4096
READ_BACK_GRACE_MS = 60_000


def _group_args(limits: ClaimLimits | None) -> list[int]:
    """group_claim's group_concurrency, group_rate and its window (ms)."""
    if limits is None:
        return [0, 0, 1000]
    return [limits.group_concurrency, limits.group_rate, max(1, math.ceil(limits.group_per * 1000))]


class PgClaims:
    """Claims, settlements and leases of :class:`~trioqueue.storage.postgres.PostgresStorage`,
    on its database (waiting claims re-check every ``settings.poll_interval``); an end
    of a job of a tree reaches the tree through ``trees``."""

    def __init__(self, db: PgDatabase, settings: PgSettings, trees: PgTrees) -> None:
        self._db = db
        self._settings = settings
        self._trees = trees
        self._step_coalescers: dict[str, Coalescer] = {}  # per queue: its concurrent step saves
        self._grouped_queues: set[str] = set()  # queues whose ring had groups at the last claim
        # per (queue, worker): the wake-ups heard when its last claim came back short, and
        # when something changes by itself (due job), or None
        self._short_claims: dict[tuple[str, str], tuple[int, float | None]] = {}
        # per (queue, job): the end of the one wait on the server for its lock (shared by
        # every claim of this storage that skipped it: one pooled connection, not one each)
        self._unlock_waits: dict[tuple[str, str], trio.Event] = {}

    def reset(self) -> None:
        """Forget what was learnt on the last connection (its listeners are gone)."""
        self._short_claims.clear()

    # -- claims ------------------------------------------------------------------------

    async def promote_due(self, conn: Connection, queue: str, now: int) -> list[StorageEvent]:
        """Move the due jobs of the delayed set to the back of their lanes (in due order);
        the events to publish (``requeued`` for a retry, ``promoted`` for a delayed job)."""
        rows = await conn.fetch(
            self._db.sql["promote_due"],
            queue,
            now,
        )
        rows.sort(key=lambda r: r[3])
        return [StorageEvent("requeued" if old == "failing" else "promoted", jid, token=tok) for jid, old, tok, _ in rows]

    async def claim(
        self, queue: str, worker_id: str, max_jobs: int, lease: float, start: int, limits: ClaimLimits | None
    ) -> tuple[list[Claim], float | None, str | None]:
        """One claim attempt; ``([], wake_at, skipped)`` when nothing may be claimed now,
        ``wake_at`` (epoch seconds) the earliest time something changes by itself (a due
        job, the end of a hold, the next rate token), or ``None``; ``skipped``: when the
        claim came back short, a ready job it skipped because another transaction held
        it (whose end may come without a wake-up: see :meth:`_until_unlocked`), or a due
        job its promotion skipped so, or ``None``."""
        now = now_ms()
        if (limits is None or not (limits.rate or limits.concurrency)) and queue in self._db.known_queues:
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
        async with self._db.tx(queue) as conn:
            events = await self.promote_due(conn, queue, now)
            limited = limits is not None and (limits.rate or limits.concurrency)
            row = await conn.fetchrow(
                self._db.sql["queue_flow_for_update" if limited else "queue_flow"], queue
            )
            if limited:
                # The rate counts a claim from when it holds the queue's flow lock: the
                # time read before may be a lock wait (another claimer's transaction) old
                now = now_ms()
            paused, flow_data = row if row is not None else (False, None)
            flow = FlowState.loads(flow_data)
            held = 0
            if limits is not None and limits.concurrency:
                held = await conn.fetchval(
                    self._db.sql["processing_count"], queue
                )
            allow = 0 if paused else flow.allowance(limits, now / 1000, max_jobs, held)
            claims: list[Claim] = []
            skipped: str | None = None
            grouped = await conn.fetchval(
                self._db.sql["queue_grouped"],
                queue,
                now,
            )
            if grouped:  # the groups' turns (see group_pick in the schema)
                sql = self._db.sql["claim_grouped"]
            else:
                sql = self._db.sql["claim_plain"]
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
                if rows and rows[0][0] == 0:  # (group_claim: a ready job it skipped, see the schema)
                    skipped = rows.pop(0)[2]
                claims = [Claim(r[2], r[3], r[4] if r[6] else r[4] + 1, r[5], r[6]) for r in rows]
                if claims and limits is not None and limits.rate:
                    flow.claimed(limits, now / 1000, len(claims))
                    await conn.execute(
                        self._db.sql["write_queue_flow"], queue, flow.dumps()
                    )
            await self._db.publish(conn, queue, events)
            wake_at: float | None = 0.0 if claims else None  # (claimed: not known, see dequeue)
            if allow and not grouped and len(claims) < allow:
                skipped = await conn.fetchval(self._db.sql["skipped_ready"], queue)
            if not claims:
                due = await conn.fetchval(
                    self._db.sql["first_due"],
                    queue,
                )
                if due is not None and due <= now:
                    # due but not promoted: held by another transaction (whose end may come
                    # without a wake-up); waited for as a skipped ready job, not claimed
                    # again every millisecond for a due time in the past
                    row = await conn.fetchrow(self._db.sql["held_due"], queue, now)
                    held_due, due = (None, None) if row is None else row  # (one row: two subqueries)
                    skipped = skipped or held_due
                rest = await conn.fetchval(self._db.sql["group_sleep_first"], queue)
                candidates = [
                    t
                    for t in (flow.wake, None if due is None else due / 1000, None if rest is None else rest / 1000)
                    if t is not None and t != math.inf
                ]
                wake_at = min(candidates) if candidates else None
        return claims, wake_at, skipped

    async def _claim_fast(
        self, queue: str, worker_id: str, max_jobs: int, lease: float, start: int, now: int, limits: ClaimLimits | None,
        grouped: bool,
    ) -> tuple[tuple[list[Claim], float | None, str | None] | None, bool]:
        """A claim without rate or concurrency limits in one statement (one round trip),
        when nothing in the delayed set is due (``None`` otherwise: promoting due jobs
        first is the general path's work). Pause and a ``RateLimited`` hold are honoured.
        ``grouped``: ``group_pick`` picks in the groups' turn order (with the group limits
        of ``limits``), else jobs without a group in (priority, seq) order, and nothing
        while groups have ready jobs. Also returns whether the queue's ring has groups.
        A short plain claim also names a ready job it skipped (held by another
        transaction), as :meth:`claim` does."""
        rows = await self._db.one_statement(
            self._db.sql["claim_fast_grouped" if grouped else "claim_fast_plain"],  # (group_claim: see the schema)
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
        skipped = info[12]
        if claimed:
            claimed.sort(key=lambda r: r[0])
            # (the gate was open: nothing due now and no hold; ``due`` is a later job's time)
            return ([Claim(r[2], r[3], r[4] if r[6] else r[4] + 1, r[5], r[6]) for r in claimed], (
                None if due is None else due / 1000
            ), skipped), ring
        if due is not None and due <= now and not paused:
            return None, ring  # due jobs to promote: the general path
        rest = None if info[11] is None else info[11] / 1000  # a group over its rate may be claimed then
        candidates = [t for t in (None if due is None else due / 1000, hold if hold * 1000 > now else None, rest) if t]
        return ([], min(candidates) if candidates else None, skipped), ring

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

        channel = self._db.channel(queue, "w")
        await self._db.count_wakes(queue, channel)
        hub = await self._db.listen(channel, wake)
        # This worker's last claim came back short (no more ready jobs) and no wake-up came
        # since it was sent: wait for one (or for a due job) instead of an empty claim now
        # (which would be in flight, a round trip to wait for, when the next job comes).
        unlimited = limits is None or not (limits.rate or limits.concurrency or limits.group_concurrency or limits.group_rate)
        short = self._short_claims.pop((queue, worker_id), None)
        try:
            while True:
                woken = trio.Event()  # a NOTIFY during the claim below counts: no lost wake-up
                heard = self._db.wakes_heard[queue]
                claims: list[Claim]
                skipped: str | None = None
                if short is not None and short[0] == heard and unlimited and timeout > 0:
                    claims, wake_at = [], short[1]
                else:
                    claims, wake_at, skipped = await self.claim(queue, worker_id, max_jobs, lease, start, limits)
                short = None
                if claims:
                    # (a skipped job: the next call claims again, see below)
                    if unlimited and len(claims) < max_jobs and wake_at != 0.0 and skipped is None:
                        self._short_claims[queue, worker_id] = (heard, wake_at)
                    return claims
                remaining = give_up - trio.current_time()
                if remaining <= 0:
                    return []
                wait = min(remaining, self._settings.poll_interval)
                if wake_at is not None:
                    wait = min(wait, max(wake_at - time.time(), 0.0) + 0.001)
                async with trio.open_nursery() as nursery:
                    if skipped is not None:
                        # The job's holder may end without a wake-up (a rollback): its end
                        # is one, heard by waiting for its lock.
                        nursery.start_soon(self._until_unlocked, queue, skipped, nursery.cancel_scope)
                    await hub.wait(woken.is_set, wait)
                    nursery.cancel_scope.cancel()
        finally:
            hub.unlisten(channel, wake)

    async def _until_unlocked(self, queue: str, job_id: str, then: trio.CancelScope) -> None:
        """Wait until no other transaction holds the ready job ``job_id`` (a claim skipped
        it), then cancel ``then``. One wait on the server a job, shared by this storage's
        claims (the others wait for its end, or for its being cut short: then they claim
        again, and one of them waits anew). Each wait on the server stays within half the
        call timeout (cut short, it is cancelled on the server and the connection kept),
        and is made again until the job is free."""
        key = (queue, job_id)
        ended = self._unlock_waits.get(key)
        if ended is not None:
            await ended.wait()
            then.cancel()
            return
        ended = self._unlock_waits[key] = trio.Event()
        try:
            while True:
                with trio.move_on_after(self._settings.call_timeout / 2):
                    async with self._db.conn() as conn:
                        await conn.fetch(self._db.sql["wait_unlocked"], queue, job_id)
                    then.cancel()
                    return
        finally:
            del self._unlock_waits[key]
            ended.set()

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["held_jobs"], queue, worker_id
            )
        return [r[0] for r in rows]

    # -- settlements -------------------------------------------------------------------

    async def _first_due(self, conn: Connection, queue: str) -> int | None:
        value = await conn.fetchval(
            self._db.sql["first_due"], queue
        )
        return None if value is None else int(value)

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        out = await self._settle_all(queue, worker_id, settlements)
        keeps: dict[str, int] = {}
        for s, ok in zip(settlements, out, strict=True):
            if ok and s.keep is not None and s.kind in _KEPT:
                state = _KEPT[s.kind]
                keeps[state] = min(s.keep, keeps.get(state, s.keep))
        if keeps:
            await self._trim_retained(queue, keeps)
        return out

    async def _trim_retained(self, queue: str, keeps: dict[str, int]) -> None:
        """Count-based retention (see the module's docstring): ``keeps`` by state."""
        now = now_ms()
        async with self._db.conn() as conn:
            for state, keep in keeps.items():
                # Past the newest ``keep``: forgotten now if the result/error rode along
                # in the event or the job ended over READ_BACK_GRACE ago; else it runs
                # out READ_BACK_GRACE after it ended (its waiter reads it back).
                await conn.execute(
                    self._db.sql["trim_retained"],
                    queue,
                    state,
                    keep,
                    _RIDES_ALONG,
                    now,
                    READ_BACK_GRACE_MS,
                )

    async def _settle_all(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        if not settlements:
            return []
        if all(s.kind in (SettleKind.COMPLETE, SettleKind.FAIL) for s in settlements) and len(
            {s.id for s in settlements}
        ) == len(settlements):
            done = await self._settle_final(queue, worker_id, settlements)
            rest = [s for s in settlements if s.id not in done]
            if not rest:
                return [True] * len(settlements)
            # fenced, or settled already by this claim (a retried call): the general path
            # says which (and publishes ``fenced``)
            answers = iter(await self._settle(queue, worker_id, rest))
            return [True if s.id in done else next(answers) for s in settlements]
        return await self._settle(queue, worker_id, settlements)

    async def _settle_final(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> set[str]:
        """Completions and failures held under their claims, in one statement (one round
        trip) with their events and a wake-up; the ids settled. The events go out packed,
        in order, several to a NOTIFY payload (at most about 7.6 KB each; one event a
        payload when one of them is over half that). An event that would pass NOTIFY's
        8000-byte limit goes without its result/error (the waiter reads the record), or,
        if even that is too long, as a ``resync``."""
        ttl = [float(s.ttl) for s in settlements]
        rows = await self._db.one_statement(
            self._db.sql["settle_final"],
            queue,
            now_ms(),
            [s.id for s in settlements],
            [s.token for s in settlements],
            [s.data for s in settlements],
            ttl,
            ["completed" if s.kind is SettleKind.COMPLETE else "failed" for s in settlements],
            worker_id,
            self._db.nonce(),
            self._db.channel(queue, "n"),
            self._db.channel(queue, "w"),
        )
        return {r[0] for r in rows}

    async def _settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        now = now_ms()
        async with self._db.tx() as conn:
            await self._trees.lock_ancestors(conn, queue, list({s.id for s in settlements}))
            rows = {
                r[0]: r
                for r in await conn.fetch(
                    self._db.sql["settle_read"],
                    queue,
                    now,
                    list({s.id for s in settlements}),
                )
            }
            first_due: int | None = None
            if any(s.kind in (SettleKind.RETRY, SettleKind.RATE_LIMITED, SettleKind.SLEEP, SettleKind.WAIT_SIGNAL) for s in settlements):
                first_due = await self._first_due(conn, queue)
            out: list[bool] = []
            events: list[StorageEvent] = []
            # per settled row: (id, state, attempts delta, set result, set error, data, expires, run_at)
            updates: list[tuple[str, str, int, bool, bool, bytes | None, int | None, int | None]] = []
            hold = 0
            parked = False  # a WAIT_SIGNAL settled (its own statement)
            settled: set[str] = set()
            waiting: list[str] = []
            for s in settlements:
                row = rows.get(s.id)
                if row is None or s.id in settled or row[1] != "processing" or row[2] != worker_id or row[3] != s.token:
                    if row is not None and row[3] == s.token and (row[1] != "processing" or s.id in settled):
                        out.append(True)  # this very claim settled it already: a retried call
                        continue
                    out.append(False)
                    events.append(StorageEvent("fenced", s.id, worker_id, token=row[6] if row is not None else None))
                    continue
                settled.add(s.id)
                out.append(True)
                _, _, _, _, started, requested, token, result_ttl, failed_by_children = row
                uncounted = s.kind in _UNCOUNTED  # the attempt did not happen
                delta = -int(started) if uncounted else (0 if started or s.kind is SettleKind.CANCEL else 1)
                kind = s.kind
                if failed_by_children and kind in _ENDS_BY_CHILDREN:
                    # A child failed under cancel (a run cut short after add_children runs
                    # again once its children ended): it fails, as waiting for them would.
                    kind = SettleKind.WAIT_CHILDREN
                if kind is SettleKind.CANCEL or (kind in _BACK and requested):
                    updates.append((s.id, "cancelled", delta, False, False, None, now + int(result_ttl * 1000), None))
                    events.append(StorageEvent("cancelled", s.id, worker_id, token=token))
                elif kind is SettleKind.COMPLETE:
                    updates.append((s.id, "completed", delta, True, False, s.data, now + int(s.ttl * 1000), None))
                    events.append(StorageEvent("completed", s.id, worker_id, result=s.data, token=token))
                elif kind is SettleKind.FAIL:
                    updates.append((s.id, "failed", delta, False, True, s.data, now + int(s.ttl * 1000), None))
                    events.append(StorageEvent("failed", s.id, worker_id, error=s.data, token=token))
                elif kind is SettleKind.WAIT_CHILDREN:
                    updates.append((s.id, "waiting_children", delta, False, False, None, None, None))
                    waiting.append(s.id)
                elif kind is SettleKind.WAIT_SIGNAL:  # waits for a signal (queued at once if it arrived)
                    wait = WaitSignal.decode(s.data)
                    box = await conn.fetchval(self._db.sql["get_signals"], queue, s.id)  # (locked by settle_read)
                    due = wait.deadline_ms
                    if count_signals(box, wait.name) >= wait.needed:
                        await conn.execute(self._db.sql["park_signal"], queue, s.id, "queued", now, delta, None, None, None)
                        events.append(StorageEvent("requeued", s.id, worker_id, token=token))
                    else:
                        await conn.execute(
                            self._db.sql["park_signal"], queue, s.id, "waiting_signal", now, delta, due, wait.name, wait.needed
                        )
                        events.append(StorageEvent("waiting_signal", s.id, worker_id, token=token))
                        if due is not None and (first_due is None or due < first_due):
                            events.append(StorageEvent("due", "", result=due_payload(due)))
                            first_due = due
                    parked = True
                else:
                    due = now + int(s.delay * 1000)
                    if kind is SettleKind.RATE_LIMITED:
                        hold = max(hold, due)
                        updates.append((s.id, "delayed", delta, False, False, None, None, due))
                        events.append(StorageEvent("rate_limited", s.id, worker_id, token=token))
                    elif kind is SettleKind.SLEEP:  # asleep (Job.sleep): as rate limited, but the queue goes on
                        updates.append((s.id, "delayed", delta, False, False, None, None, due))
                        events.append(StorageEvent("sleeping", s.id, worker_id, token=token))
                    else:
                        updates.append((s.id, "failing", delta, False, True, s.data, None, due))
                        events.append(StorageEvent("failing", s.id, worker_id, error=s.data, token=token))
                    if first_due is None or due < first_due:
                        events.append(StorageEvent("due", "", result=due_payload(due)))
                        first_due = due
            if updates:
                await conn.execute(
                    self._db.sql["settle_jobs"],
                    queue,
                    now,
                    *(list(col) for col in zip(*updates, strict=True)),
                )
            if hold:
                await self._hold(conn, queue, hold)
            await self._db.publish(conn, queue, events, wake=bool(updates) or parked)
            await self._trees.tree_ended(conn, queue, [u[0] for u in updates if u[1] in _ENDS], now)
            for job_id in waiting:
                await self._trees.waited(conn, queue, job_id, now)
        return out

    async def _hold(self, conn: Connection, queue: str, until_ms: int) -> None:
        """Hold off every claim of ``queue`` until then (``RateLimited``)."""
        await conn.execute(self._db.sql["queue_row"], queue)
        data = await conn.fetchval(self._db.sql["lock_queue_flow"], queue)
        flow = FlowState.loads(data)
        flow.hold_until(until_ms / 1000)
        await conn.execute(self._db.sql["write_queue_flow"], queue, flow.dumps())

    async def _requeue_front(
        self, conn: Connection, queue: str, ids: list[str], now: int, *, refund: bool = False
    ) -> None:
        """Put held jobs back before everything else of their lanes, in order."""
        if not ids:
            return
        base = -int(await conn.fetchval(self._db.sql["next_seq"])) * _FRONT
        await conn.execute(
            self._db.sql["requeue_front"],
            queue,
            now,
            ids,
            base,
            refund,
        )

    async def _cancel_held(
        self, conn: Connection, queue: str, ids: list[str], now: int, *, recovered: bool = False
    ) -> None:
        """End held jobs cancelled; ``recovered``: by the reaper (their claim is gone)."""
        if not ids:
            return
        await conn.execute(
            self._db.sql["cancel_held"],
            queue,
            now,
            ids,
            recovered,
        )

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        if not job_ids:
            return 0
        now = now_ms()
        async with self._db.tx() as conn:
            await self._trees.lock_ancestors(conn, queue, list(dict.fromkeys(job_ids)))  # (a cancel may end one)
            rows = await conn.fetch(
                self._db.sql["release_read"],
                queue,
                now,
                worker_id,
                list(dict.fromkeys(job_ids)),
            )
            info = {r[0]: r for r in rows}
            order = [i for i in dict.fromkeys(job_ids) if i in info]
            cancelled = [i for i in order if info[i][1]]
            # a started claim that used its last attempt (its handler may have run): failed,
            # as the reaper's recovery of it would; it never runs past max_attempts
            used_up = [i for i in order if not info[i][1] and not refund and info[i][3]]
            back = [i for i in order if not info[i][1] and i not in used_up]
            await self._cancel_held(conn, queue, cancelled, now)
            failed = [(i, encode_error(stalled_error(i, worker_id, int(info[i][4])))) for i in used_up]
            if failed:
                await conn.execute(
                    self._db.sql["fail_stalled"],
                    queue,
                    now,
                    [f[0] for f in failed],
                    [f[1] for f in failed],
                )
            await self._requeue_front(conn, queue, back, now, refund=refund)
            events = [StorageEvent("cancelled", i, worker_id, token=info[i][2]) for i in cancelled]
            events += [StorageEvent("failed", i, worker_id, error=e, token=info[i][2]) for i, e in failed]
            events += [StorageEvent("requeued", i, worker_id, token=info[i][2]) for i in back]
            await self._db.publish(conn, queue, events, wake=bool(order))
            await self._trees.tree_ended(conn, queue, cancelled + used_up, now)
        return len(back)

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        if not claims:
            return []
        if len({c[0] for c in claims}) == len(claims):
            started = await self._start_plain(queue, worker_id, claims)
            rest = [c for c in claims if c[0] not in started]
            if not rest:
                return [True] * len(claims)
            # started already, lost, cancel requested, queue paused, or a job of a tree:
            # the general path says which
            answers = iter(await self._start(queue, worker_id, rest))
            return [True if c[0] in started else next(answers) for c in claims]
        return await self._start(queue, worker_id, claims)

    async def _start_plain(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> set[str]:
        """The common case of :meth:`start` in one statement (one round trip): reserved
        claims still held, not started, without a cancel request, of no tree, on a queue
        that is not paused, get their attempt counted; the ids started. (A cancel request
        or a pause committed meanwhile is seen: the row lock re-checks the job, and the
        general path reads the queue's flag the same way.)"""
        rows = await self._db.one_statement(
            self._db.sql["start_plain"],
            queue,
            [c[0] for c in claims],
            [c[1] for c in claims],
            worker_id,
        )
        return {r[0] for r in rows}

    async def _start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        now = now_ms()
        async with self._db.tx() as conn:
            # a start may cancel a job of a tree (a cancel request came before it started),
            # which reaches its parent: its ancestors first (top-down, as cancels and ends)
            await self._trees.lock_ancestors(conn, queue, list(dict.fromkeys(c[0] for c in claims)))
            rows = {
                r[0]: r
                for r in await conn.fetch(
                    self._db.sql["start_read"],
                    queue,
                    now,
                    worker_id,
                    [c[0] for c in claims],
                )
            }
            paused = bool(await conn.fetchval(self._db.sql["is_paused"], queue))
            out: list[bool] = []
            start_ids: list[str] = []
            cancel_ids: list[str] = []
            back_ids: list[str] = []
            events: list[StorageEvent] = []
            for job_id, token in claims:
                row = rows.get(job_id)
                if row is None or row[1] != token or job_id in cancel_ids or job_id in back_ids:
                    out.append(False)
                    continue
                _, _, started, requested, incarnation = row
                if requested and not started:
                    cancel_ids.append(job_id)
                    events.append(StorageEvent("cancelled", job_id, worker_id, token=incarnation))
                    out.append(False)
                elif paused and not started:
                    back_ids.append(job_id)
                    events.append(StorageEvent("requeued", job_id, worker_id, token=incarnation))
                    out.append(False)
                else:
                    if not started and job_id not in start_ids:
                        start_ids.append(job_id)
                    out.append(True)
            if start_ids:
                await conn.execute(
                    self._db.sql["start_jobs"],
                    queue,
                    start_ids,
                )
            await self._cancel_held(conn, queue, cancel_ids, now)
            await self._requeue_front(conn, queue, back_ids, now)
            await self._db.publish(conn, queue, events, wake=bool(cancel_ids or back_ids))
            await self._trees.tree_ended(conn, queue, cancel_ids, now)
        return out

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        now = now_ms()
        reply = HeartbeatReply([], [])
        async with self._db.tx() as conn:
            await conn.execute(
                self._db.sql["worker_heartbeat"],
                queue,
                worker_id,
                now + int(ttl * 1000),
            )
            if not claims:
                return reply
            # SKIP LOCKED: a heartbeat never waits on a row while holding others (a
            # transaction of a tree locks a child, then its siblings: waiting here could
            # close a cycle); the rows skipped are extended below, one at a time. Keyed by
            # claim: one worker may hold two claims of one job (the old one ending).
            held = {
                (r[0], r[1]): r[2]
                for r in await conn.fetch(
                    self._db.sql["renew_leases"],
                    queue,
                    now + int(lease * 1000),
                    worker_id,
                    [c[0] for c in claims],
                    [c[1] for c in claims],
                )
            }
            known = await self._claim_states(conn, queue, [c[0] for c in claims if c not in held], now)
        for job_id, token in claims:  # skipped (locked by another transaction): still ours?
            if (job_id, token) not in held and known.get(job_id) == ("processing", token):
                async with self._db.conn() as conn:  # (one row, autocommit: waits holding nothing else)
                    requested = await conn.fetchval(
                        self._db.sql["renew_lease"],
                        queue,
                        now + int(lease * 1000),
                        worker_id,
                        job_id,
                        token,
                    )
                    if requested is not None:
                        held[job_id, token] = requested
                    else:
                        known.update(await self._claim_states(conn, queue, [job_id], now))
        for job_id, token in claims:
            cancel = held.get((job_id, token))
            if cancel is not None:
                if cancel:
                    reply.cancel_requested.append(job_id)
                continue
            kind, claim = known.get(job_id, (None, None))
            if (why := lost_why(kind, claim, token)) is not None:
                reply.lost.append(LostClaim(job_id, token, why))
        return reply

    async def _claim_states(self, conn: Connection, queue: str, ids: list[str], now: int) -> dict[str, tuple[str, str]]:
        """``{id: (state, claim)}`` of the jobs of ``ids`` still known."""
        if not ids:
            return {}
        rows = await conn.fetch(
            self._db.sql["claim_states"],
            queue,
            now,
            ids,
        )
        return {r[0]: (r[1], r[2]) for r in rows}

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        async with self._db.conn() as conn:
            await conn.execute(self._db.sql["unregister_worker"], queue, worker_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["workers"],
                queue,
                include_expired,
                now_ms(),
            )
        return {w: t / 1000 for w, t in rows}

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        async with self._db.tx() as conn:
            incarnation = await conn.fetchval(
                self._db.sql["set_progress"],
                queue,
                token,
                worker_id,
                job_id,
                progress,
            )
            if incarnation is None:
                return False
            await self._db.publish(conn, queue, [StorageEvent("progress", job_id, worker_id, result=progress, token=incarnation)])
        return True

    # -- steps -------------------------------------------------------------------------

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        """One statement, fenced by the claim; the concurrent saves of one queue share it
        and its commit (see :class:`~trioqueue.storage._coalesce.Coalescer`)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        co = self._step_coalescers.get(queue)
        if co is None:
            co = self._step_coalescers[queue] = Coalescer(functools.partial(self._flush_steps, queue))
        [saved] = await co.submit([(worker_id, job_id, token, encode_step(name, value))])
        return bool(saved)

    async def _flush_steps(self, queue: str, batch: list[Slot]) -> None:
        """Store the step saves of ``batch``: one ``save_steps`` statement (autocommit: one
        commit), shielded so that a cancelled carrier does not lose the others' outcomes,
        and hand each its outcome. (A job saves one step at a time; should an id come
        twice, its saves go in statements of their own, in order.)"""
        entries = [entry for slot in batch for entry in slot.jobs]
        rounds: list[list[int]] = []  # the n-th save of an id in the batch: in round n
        seen: dict[str, int] = {}
        for i, (_, job_id, _, _) in enumerate(entries):
            n = seen[job_id] = seen.get(job_id, -1) + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(i)
        saved = [False] * len(entries)
        try:
            with trio.CancelScope(shield=True):
                for r in rounds:
                    if len(r) == 1:  # a save alone (the sequential case): the one-row statement
                        worker_id, job_id, token, entry = entries[r[0]]
                        rows = await self._db.one_statement(self._db.sql["save_step"], queue, token, worker_id, job_id, entry)
                        saved[r[0]] = bool(rows)
                        continue
                    rows = await self._db.one_statement(
                        self._db.sql["save_steps"],
                        queue,
                        [entries[k][1] for k in r],
                        [entries[k][2] for k in r],
                        [entries[k][0] for k in r],
                        [entries[k][3] for k in r],
                    )
                    done = {row[0] for row in rows}
                    for k in r:
                        saved[k] = entries[k][1] in done
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            for slot in batch:
                slot.error = exc
                slot.wake()
            return
        for slot, ok in zip(batch, saved, strict=True):
            slot.result = [ok]
            slot.wake()

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        async with self._db.conn() as conn:
            data = await conn.fetchval(self._db.sql["get_steps"], queue, job_id)
        return decode_steps(data)

    # -- signals -----------------------------------------------------------------------

    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        """One transaction: the row locked, the message appended, a job waiting for it
        queued again (``promoted``, and a wake-up NOTIFY: every process's claims)."""
        now = now_ms()
        async with self._db.tx() as conn:
            row = await conn.fetchrow(self._db.sql["signal_read"], queue, now, job_id)
            if row is None or row[0] in _ENDS:
                return "not_found"
            state, wait_name, wait_count, box, token = row
            box = (bytes(box) if box is not None else b"") + encode_step(name, payload)
            woken = state == "waiting_signal" and wait_name == name and count_signals(box, name) >= (wait_count or 1)
            await conn.execute(self._db.sql["signal_write"], queue, job_id, box, woken, now)
            if woken:
                await self._db.publish(conn, queue, [StorageEvent("promoted", job_id, token=token)], wake=True)
        return "delivered"

    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        async with self._db.conn() as conn:
            data = await conn.fetchval(self._db.sql["get_signals"], queue, job_id)
        return decode_signals(None if data is None else bytes(data))

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        now = now_ms()
        recovered: list[tuple[str, str]] = []
        async with self._db.tx() as conn:
            # finished jobs whose TTL ran out leave the table, in bounded batches
            await conn.execute(
                self._db.sql["forget_expired"],
                queue,
                now,
            )
            events = await self.promote_due(conn, queue, now)
            promoted = bool(events)
            candidates = [r[0] for r in await conn.fetch(self._db.sql["stalled_ids"], queue, now)]
            if candidates:  # a recovery may end a job of a tree: its ancestors first (top-down)
                await self._trees.lock_ancestors(conn, queue, candidates)
            rows = await conn.fetch(
                self._db.sql["lock_stalled"],
                queue,
                now,
            )
            cancel_ids: list[str] = []
            back_ids: list[str] = []
            failed: list[tuple[str, bytes]] = []
            for jid, worker, started, attempts, max_attempts, requested, token in rows:
                events.append(StorageEvent("stalled", jid, worker, token=token))
                if requested:
                    cancel_ids.append(jid)
                    events.append(StorageEvent("cancelled", jid, worker, token=token))
                    recovered.append((jid, "cancelled"))
                elif not started or attempts < max_attempts:
                    back_ids.append(jid)
                    events.append(StorageEvent("requeued", jid, worker, token=token))
                    recovered.append((jid, "requeued"))
                else:
                    error = encode_error(stalled_error(jid, worker, attempts))
                    failed.append((jid, error))
                    events.append(StorageEvent("failed", jid, worker, error=error, token=token))
                    recovered.append((jid, "failed"))
            await self._cancel_held(conn, queue, cancel_ids, now, recovered=True)
            if back_ids:
                await conn.execute(
                    self._db.sql["requeue_stalled"],
                    queue,
                    now,
                    back_ids,
                )
            if failed:
                await conn.execute(
                    self._db.sql["fail_stalled"],
                    queue,
                    now,
                    [f[0] for f in failed],
                    [f[1] for f in failed],
                )
            await conn.execute(
                self._db.sql["forget_dead_workers"],
                queue,
                now,
            )
            deadline = await conn.fetchval(
                self._db.sql["next_recovery"],
                queue,
                now,
            )
            await self._db.publish(conn, queue, events, wake=bool(recovered) or promoted)
            await self._trees.tree_ended(conn, queue, cancel_ids + [f[0] for f in failed], now)
        return recovered, None if deadline is None else deadline / 1000
