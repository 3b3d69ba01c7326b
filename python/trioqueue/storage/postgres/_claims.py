"""PostgresStorage, part 2: what happens to claimed jobs — settlements, releases, starts,
heartbeats (leases, fencing), progress, and the reaper's recovery of stalled jobs."""

from __future__ import annotations

from collections.abc import Sequence

from ..._drivers.libpq import Connection
from ..._model._serde import encode_error
from ..._model._types import JobError
from .._base import (
    HeartbeatReply,
    LostClaim,
    SettleKind,
    Settlement,
    StorageEvent,
    lost_why,
)
from .._flowstate import FlowState
from ._common import now_ms
from ._jobs import _FRONT, PostgresJobs, _due_ms

__all__ = ["PostgresClaims"]

_BACK = (SettleKind.RETRY, SettleKind.RATE_LIMITED, SettleKind.WAIT_CHILDREN)  # cancelled instead if requested
# the ends of a run that a child failed under ``cancel`` turns into the parent's failure
_ENDS_BY_CHILDREN = (SettleKind.COMPLETE, SettleKind.RETRY, SettleKind.RATE_LIMITED)
_ENDS = ("completed", "failed", "cancelled")


class PostgresClaims(PostgresJobs):
    """Settlements and leases of :class:`~trioqueue.storage.postgres.PostgresStorage`."""

    async def _first_due(self, conn: Connection, queue: str) -> int | None:
        value = await conn.fetchval(
            self._sql["first_due"], queue
        )
        return None if value is None else int(value)

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
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
        rows = await self._one_statement(
            self._sql["settle_final"],
            queue,
            now_ms(),
            [s.id for s in settlements],
            [s.token for s in settlements],
            [s.data for s in settlements],
            ttl,
            ["completed" if s.kind is SettleKind.COMPLETE else "failed" for s in settlements],
            worker_id,
            self.nonce(),
            self.channel(queue, "n"),
            self.channel(queue, "w"),
        )
        return {r[0] for r in rows}

    async def _settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        now = now_ms()
        async with self.tx() as conn:
            await self.lock_ancestors(conn, queue, list({s.id for s in settlements}))
            rows = {
                r[0]: r
                for r in await conn.fetch(
                    self._sql["settle_read"],
                    queue,
                    now,
                    list({s.id for s in settlements}),
                )
            }
            first_due: int | None = None
            if any(s.kind in (SettleKind.RETRY, SettleKind.RATE_LIMITED) for s in settlements):
                first_due = await self._first_due(conn, queue)
            out: list[bool] = []
            events: list[StorageEvent] = []
            # per settled row: (id, state, attempts delta, set result, set error, data, expires, run_at)
            updates: list[tuple[str, str, int, bool, bool, bytes | None, int | None, int | None]] = []
            hold = 0
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
                limited = s.kind is SettleKind.RATE_LIMITED
                uncounted = limited or s.kind is SettleKind.WAIT_CHILDREN  # the attempt did not happen
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
                else:
                    due = now + int(s.delay * 1000)
                    if limited:
                        hold = max(hold, due)
                        updates.append((s.id, "delayed", delta, False, False, None, None, due))
                        events.append(StorageEvent("rate_limited", s.id, worker_id, token=token))
                    else:
                        updates.append((s.id, "failing", delta, False, True, s.data, None, due))
                        events.append(StorageEvent("failing", s.id, worker_id, error=s.data, token=token))
                    if first_due is None or due < first_due:
                        events.append(StorageEvent("due", "", result=_due_ms(due)))
                        first_due = due
            if updates:
                await conn.execute(
                    self._sql["settle_jobs"],
                    queue,
                    now,
                    *(list(col) for col in zip(*updates, strict=True)),
                )
            if hold:
                await self._hold(conn, queue, hold)
            await self.publish(conn, queue, events, wake=bool(updates))
            await self.tree_ended(conn, queue, [u[0] for u in updates if u[1] in _ENDS], now)
            for job_id in waiting:
                await self.waited(conn, queue, job_id, now)
        return out

    async def _hold(self, conn: Connection, queue: str, until_ms: int) -> None:
        """Hold off every claim of ``queue`` until then (``RateLimited``)."""
        await conn.execute(self._sql["queue_row"], queue)
        data = await conn.fetchval(self._sql["lock_queue_flow"], queue)
        flow = FlowState.loads(data)
        flow.hold_until(until_ms / 1000)
        await conn.execute(self._sql["write_queue_flow"], queue, flow.dumps())

    async def _requeue_front(
        self, conn: Connection, queue: str, ids: list[str], now: int, *, refund: bool = False
    ) -> None:
        """Put held jobs back before everything else of their lanes, in order."""
        if not ids:
            return
        base = -int(await conn.fetchval(self._sql["next_seq"])) * _FRONT
        await conn.execute(
            self._sql["requeue_front"],
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
            self._sql["cancel_held"],
            queue,
            now,
            ids,
            recovered,
        )

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        if not job_ids:
            return 0
        now = now_ms()
        async with self.tx() as conn:
            await self.lock_ancestors(conn, queue, list(dict.fromkeys(job_ids)))  # (a cancel may end one)
            rows = await conn.fetch(
                self._sql["release_read"],
                queue,
                now,
                worker_id,
                list(dict.fromkeys(job_ids)),
            )
            info = {r[0]: r for r in rows}
            order = [i for i in dict.fromkeys(job_ids) if i in info]
            cancelled = [i for i in order if info[i][1]]
            back = [i for i in order if not info[i][1]]
            await self._cancel_held(conn, queue, cancelled, now)
            await self._requeue_front(conn, queue, back, now, refund=refund)
            events = [StorageEvent("cancelled", i, worker_id, token=info[i][2]) for i in cancelled]
            events += [StorageEvent("requeued", i, worker_id, token=info[i][2]) for i in back]
            await self.publish(conn, queue, events, wake=bool(order))
            await self.tree_ended(conn, queue, cancelled, now)
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
        rows = await self._one_statement(
            self._sql["start_plain"],
            queue,
            [c[0] for c in claims],
            [c[1] for c in claims],
            worker_id,
        )
        return {r[0] for r in rows}

    async def _start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        now = now_ms()
        async with self.tx() as conn:
            # a start may cancel a job of a tree (a cancel request came before it started),
            # which reaches its parent: its ancestors first (top-down, as cancels and ends)
            await self.lock_ancestors(conn, queue, list(dict.fromkeys(c[0] for c in claims)))
            rows = {
                r[0]: r
                for r in await conn.fetch(
                    self._sql["start_read"],
                    queue,
                    now,
                    worker_id,
                    [c[0] for c in claims],
                )
            }
            paused = bool(await conn.fetchval(self._sql["is_paused"], queue))
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
                    self._sql["start_jobs"],
                    queue,
                    start_ids,
                )
            await self._cancel_held(conn, queue, cancel_ids, now)
            await self._requeue_front(conn, queue, back_ids, now)
            await self.publish(conn, queue, events, wake=bool(cancel_ids or back_ids))
            await self.tree_ended(conn, queue, cancel_ids, now)
        return out

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        now = now_ms()
        reply = HeartbeatReply([], [])
        async with self.tx() as conn:
            await conn.execute(
                self._sql["worker_heartbeat"],
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
                    self._sql["renew_leases"],
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
                async with self.conn() as conn:  # (one row, autocommit: waits holding nothing else)
                    requested = await conn.fetchval(
                        self._sql["renew_lease"],
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
            self._sql["claim_states"],
            queue,
            now,
            ids,
        )
        return {r[0]: (r[1], r[2]) for r in rows}

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        async with self.conn() as conn:
            await conn.execute(self._sql["unregister_worker"], queue, worker_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        async with self.conn() as conn:
            rows = await conn.fetch(
                self._sql["workers"],
                queue,
                include_expired,
                now_ms(),
            )
        return {w: t / 1000 for w, t in rows}

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        async with self.tx() as conn:
            incarnation = await conn.fetchval(
                self._sql["set_progress"],
                queue,
                token,
                worker_id,
                job_id,
                progress,
            )
            if incarnation is None:
                return False
            await self.publish(conn, queue, [StorageEvent("progress", job_id, worker_id, result=progress, token=incarnation)])
        return True

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        now = now_ms()
        recovered: list[tuple[str, str]] = []
        async with self.tx() as conn:
            # finished jobs whose TTL ran out leave the table, in bounded batches
            await conn.execute(
                self._sql["forget_expired"],
                queue,
                now,
            )
            events = await self.promote_due(conn, queue, now)
            promoted = bool(events)
            candidates = [r[0] for r in await conn.fetch(self._sql["stalled_ids"], queue, now)]
            if candidates:  # a recovery may end a job of a tree: its ancestors first (top-down)
                await self.lock_ancestors(conn, queue, candidates)
            rows = await conn.fetch(
                self._sql["lock_stalled"],
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
                    error = encode_error(
                        JobError(
                            "StalledJobError",
                            f"job {jid!r} stalled on worker {worker!r} (lease expired or worker died) "
                            f"and has used all {attempts} attempts",
                        )
                    )
                    failed.append((jid, error))
                    events.append(StorageEvent("failed", jid, worker, error=error, token=token))
                    recovered.append((jid, "failed"))
            await self._cancel_held(conn, queue, cancel_ids, now, recovered=True)
            if back_ids:
                await conn.execute(
                    self._sql["requeue_stalled"],
                    queue,
                    now,
                    back_ids,
                )
            if failed:
                await conn.execute(
                    self._sql["fail_stalled"],
                    queue,
                    now,
                    [f[0] for f in failed],
                    [f[1] for f in failed],
                )
            await conn.execute(
                self._sql["forget_dead_workers"],
                queue,
                now,
            )
            deadline = await conn.fetchval(
                self._sql["next_recovery"],
                queue,
            )
            await self.publish(conn, queue, events, wake=bool(recovered) or promoted)
            await self.tree_ended(conn, queue, cancel_ids + [f[0] for f in failed], now)
        return recovered, None if deadline is None else deadline / 1000
