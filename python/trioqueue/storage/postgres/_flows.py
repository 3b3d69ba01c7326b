"""PostgresStorage's trees of jobs (flows): writing a tree in one transaction, and what a
job's end does to its tree, in the transaction of that end (counted down on its parent,
the parent queued once none is pending, or failed with its other children cancelled
under ``cancel``, level by level up).

Locks: a transaction that may end a job of a tree (settle, cancel, release, remove,
``start`` of a job with a cancel request, the reaper) first locks the job and its
ancestors in one global order, roots first (by depth from the root, then queue and id:
:meth:`PgTrees.lock_ancestors`); a cascading cancel, holding the job it starts from,
locks a parent before its children (in the order they were added). All go top-down, so
concurrent ends of one tree serialise on the root row (``SELECT ... FOR UPDATE``), and
calls spanning several trees take their rows in the same order, instead of deadlocking.
A heartbeat, which takes no ancestor, never waits on a row while holding others
(``SKIP LOCKED``, then the skipped rows one at a time).

Dependencies (``depends_on``, schema version 8): a dependent's row counts its dependencies
with its children (``pending``, ``failed_ids``), ``job_deps`` links the two (with their
incarnation tokens), and a dependency's row is ``depended`` (a hint, never cleared:
read with ``job_deps``, whose rows name this incarnation's token, where it matters, as
count-based retention does; an id enqueued again only costs the general settle path): its
end, in its transaction,
counts down on each dependent (locked in (queue, id) order) as a child's does on its
parent, and keeps its record until no dependent waits for it. A tree naming dependencies
locks their rows in (queue, id) order without waiting (``NOWAIT``, retried after a pause,
under a savepoint): a dependency's end locks its dependents, which may be the writer's
other dependencies, so the writer must never wait for one while holding another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import trio

from ..._drivers.libpq import Connection, PostgresError
from ..._model._errors import FlowError, StorageError
from ..._model._types import EnqueueStatus
from .._base import EnqueueOutcome, FlowJob, JobRecord, StorageEvent, child_failed_error
from ._common import PgDatabase, now_ms, record

__all__ = ["PgTrees", "TreeJobTaken"]

_TERMINAL = ("completed", "failed", "cancelled")
_LOCKED = "55P03"  # lock_not_available: a dependency's row is locked (NOWAIT)
_LOCK_ROUNDS = 200  # tries at locking a tree's dependencies (pauses of up to 50 ms)


class TreeJobTaken(Exception):
    """A job of a tree being written was committed by another transaction after the
    tree's ids were checked (``key``: its queue and id): roll back, then
    :meth:`PgTrees.flow_taken`."""

    def __init__(self, key: tuple[str, str]) -> None:
        super().__init__(f"job {key[1]!r} of queue {key[0]!r} was written meanwhile")
        self.key = key


def _existing(row: Sequence[Any]) -> EnqueueOutcome:
    rec = record(row)
    if row[1] == "completed" and rec.result is not None:
        return EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state, rec.result, rec.token)
    return EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state, token=rec.token)


class _Events:
    """Events (and wake-ups) per queue, published together at the end."""

    def __init__(self) -> None:
        self.by_queue: dict[str, list[StorageEvent]] = {}
        self.wake: set[str] = set()

    def add(self, queue: str, event: StorageEvent, *, wake: bool = False) -> None:
        self.by_queue.setdefault(queue, []).append(event)
        if wake:
            self.wake.add(queue)


class PgTrees:
    """The trees of jobs of :class:`~trioqueue.storage.postgres.PostgresStorage`, on its
    database: writing them, and their bookkeeping in the transaction of a job's end."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    # -- writing trees -------------------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        root = jobs[0]
        now = now_ms()
        try:
            async with self._db.tx(root.queue) as conn:
                outcome = await self.write_flow(conn, jobs, now)
        except TreeJobTaken as taken:  # (rolled back) written meanwhile by another transaction
            async with self._db.conn() as conn:
                return await self.flow_taken(conn, jobs, taken, now)
        return outcome

    async def write_flow(self, conn: Connection, jobs: Sequence[FlowJob], now: int) -> EnqueueOutcome:
        """Write the tree ``jobs`` (root first) in the transaction open on ``conn``, or
        write nothing when the root's id is known (``duplicate``/``completed``).
        :class:`FlowError`: a child's id is known (checked before anything is written);
        :class:`TreeJobTaken`: a job of the tree was committed by another transaction
        meanwhile (the caller rolls back, then asks :meth:`flow_taken`)."""
        root = jobs[0]
        row = await conn.fetchrow(
            self._db.sql["write_flow"],
            root.queue,
            now,
            root.job.id,
        )
        if row is not None:
            return _existing(row)
        await self._write_tree(conn, jobs, now, None)
        return EnqueueOutcome(EnqueueStatus.QUEUED)

    async def flow_taken(
        self, conn: Connection, jobs: Sequence[FlowJob], taken: TreeJobTaken, now: int
    ) -> EnqueueOutcome:
        """After a rolled back :class:`TreeJobTaken`: the root taken, what :meth:`enqueue`
        would say of it; a child taken, :class:`FlowError` naming it."""
        root = jobs[0]
        if taken.key != (root.queue, root.job.id):
            raise FlowError(f"job {taken.key[1]!r} already exists on queue {taken.key[0]!r}: a tree's jobs must be new")
        row = await conn.fetchrow(
            self._db.sql["get_job"],
            root.queue,
            now,
            root.job.id,
        )
        if row is None:  # written and gone again: a duplicate of nothing known
            return EnqueueOutcome(EnqueueStatus.DUPLICATE, None, token=None)
        return _existing(row)

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        now = now_ms()
        try:
            return await self._add_children(queue, worker_id, job_id, token, children, policy, now)
        except TreeJobTaken as taken:  # (rolled back) a child committed by another transaction meanwhile
            raise FlowError(
                f"job {taken.key[1]!r} already exists on queue {taken.key[0]!r}: a tree's jobs must be new"
            ) from None

    async def _add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str, now: int
    ) -> bool:
        async with self._db.tx(queue) as conn:
            incarnation = await conn.fetchval(
                self._db.sql["add_children"],
                queue,
                job_id,
                worker_id,
                token,
            )
            if incarnation is None:
                return False
            await self._write_tree(conn, children, now, (queue, job_id, incarnation, policy))
        return True

    async def _write_tree(
        self, conn: Connection, jobs: Sequence[FlowJob], now: int, parent: tuple[str, str, str, str] | None
    ) -> None:
        """Check every id first (a :class:`FlowError` naming the job: the transaction
        rolls back, nothing written), then write the tree. ``parent``: the processing job
        (queue, id, token, policy) the jobs are added to (``None``: ``jobs[0]`` is a new
        root, checked by the caller)."""
        check = list(jobs) if parent is not None else list(jobs[1:])
        taken: set[tuple[str, str]] = set()
        if check:
            rows = await conn.fetch(
                self._db.sql["taken_keys"],
                [fj.queue for fj in check],
                [fj.job.id for fj in check],
                now,
            )
            taken = {(r[0], r[1]) for r in rows}
        seen: set[tuple[str, str]] = set() if parent is None else {(parent[0], parent[1])}
        if parent is None:
            seen.add((jobs[0].queue, jobs[0].job.id))
        for fj in check:
            key = (fj.queue, fj.job.id)
            if key in taken or key in seen:
                raise FlowError(f"job {fj.job.id!r} already exists on queue {fj.queue!r}: a tree's jobs must be new")
            seen.add(key)
        deps = await self.lock_deps(conn, jobs, now)
        queues = list(dict.fromkeys(fj.queue for fj in jobs))
        await conn.execute(
            self._db.sql["queue_rows"], queues
        )
        counts: dict[tuple[str, str], int] = {}
        for fj in jobs:
            if fj.parent is not None:
                counts[fj.parent] = counts.get(fj.parent, 0) + 1
        tokens: dict[tuple[str, str], str] = {(fj.queue, fj.job.id): fj.job.token for fj in jobs}
        if parent is not None:
            tokens[parent[0], parent[1]] = parent[2]
            added = counts.get((parent[0], parent[1]), 0)
            await conn.execute(
                self._db.sql["add_to_parent"],
                parent[0],
                parent[1],
                parent[3],
                added,
            )
        events = _Events()
        for fj in jobs:
            job, key = fj.job, (fj.queue, fj.job.id)
            run_at = None
            if key in counts or fj.depends_on:
                state = "waiting_children"
            elif job.run_at is not None and job.run_at * 1000 > now:
                state, run_at = "delayed", math.ceil(job.run_at * 1000)
            else:
                state = "queued"
            n = counts.get(key)
            waits = None if n is None and not fj.depends_on else (n or 0) + len(fj.depends_on)
            # (a job committed since the check is left alone; a replaced row takes its place in the tree)
            written = await conn.fetchval(
                self._db.sql["insert_tree_jobs"],
                fj.queue,
                job.id,
                state,
                now,
                job.priority,
                run_at,
                job.token,
                job.envelope,
                job.max_attempts,
                float(job.result_ttl),
                None if fj.parent is None else fj.parent[0],
                None if fj.parent is None else fj.parent[1],
                None if fj.parent is None else tokens[fj.parent],
                fj.policy if waits else None,
                waits,
                job.group,
                n,
            )
            if not written:
                raise TreeJobTaken(key)
            events.add(fj.queue, StorageEvent("enqueued", job.id, token=job.token), wake=state == "queued")
            if run_at is not None:
                events.add(fj.queue, StorageEvent("due", "", result=b"%d" % run_at))
        if deps:
            await self._depend(conn, jobs, deps, now, events)
        await self._flush(conn, events)

    async def lock_deps(self, conn: Connection, jobs: Sequence[FlowJob], now: int) -> dict[tuple[str, str], tuple[Any, ...]]:
        """The rows ``(state, token, error)`` of the dependencies the jobs name, locked
        (in (queue, id) order, never waiting: a locked row is tried again after a pause,
        see the module's docstring); :class:`FlowError` naming the job and the unknown id."""
        keys = list(dict.fromkeys(dep for fj in jobs for dep in fj.depends_on))
        if not keys:
            return {}
        pause = 0.001
        for _ in range(_LOCK_ROUNDS):
            await conn.execute("SAVEPOINT trioqueue_deps")
            try:
                rows = await conn.fetch(self._db.sql["lock_deps"], [q for q, _ in keys], [i for _, i in keys], now)
            except PostgresError as exc:
                if exc.sqlstate != _LOCKED or conn.closed:
                    raise
                await conn.execute("ROLLBACK TO SAVEPOINT trioqueue_deps")
                await trio.sleep(pause)
                pause = min(pause * 2, 0.05)
                continue
            await conn.execute("RELEASE SAVEPOINT trioqueue_deps")
            break
        else:
            raise StorageError(
                f"the dependencies of job {jobs[0].job.id!r} stayed locked by other transactions; nothing was written"
            )
        found = {(r[0], r[1]): tuple(r[2:]) for r in rows}
        for fj in jobs:
            for dq, did in fj.depends_on:
                if (dq, did) not in found:
                    raise FlowError(f"job {fj.job.id!r} depends on job {did!r} of queue {dq!r}, which does not exist")
        return found

    async def _depend(
        self, conn: Connection, jobs: Sequence[FlowJob], deps: dict[tuple[str, str], tuple[Any, ...]], now: int, events: _Events
    ) -> None:
        """The jobs just written (waiting) depend on their ``depends_on``: linked, each
        dependency marked ``depended``, and one that ended already counted at once (its
        record kept), as the end of a child is."""
        await conn.execute(self._db.sql["mark_depended"], [q for q, _ in deps], [i for _, i in deps])
        for fj in jobs:
            if not fj.depends_on:
                continue
            await conn.execute(
                self._db.sql["insert_deps"],
                fj.queue,
                fj.job.id,
                fj.job.token,
                [q for q, _ in fj.depends_on],
                [i for _, i in fj.depends_on],
                [deps[d][1] for d in fj.depends_on],
            )
        for fj in jobs:
            for dq, did in fj.depends_on:
                state, _, error = deps[dq, did]
                if state in _TERMINAL:
                    await self._child_ended(conn, (did, state, error, fj.queue, fj.job.id, fj.job.token), now, events, queue=dq)

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        now = now_ms()
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["get_children"],
                queue,
                now,
                job_id,
            )
            rows += await conn.fetch(self._db.sql["get_deps"], queue, now, job_id)
        return [(r[0], record(r[1:])) for r in rows]

    # -- a job of a tree ended -----------------------------------------------------------

    async def lock_ancestors(self, conn: Connection, queue: str, ids: Sequence[str]) -> None:
        """Lock the jobs ``ids`` (on ``queue``) and their ancestors in the one order every
        transaction uses: by depth from the root (the roots first), then queue and id.
        The depth is counted down from the top of each job's tree, so a row has the same
        place in every call whatever jobs it is reached from: top-down in each tree, and
        two calls spanning the same trees take the same rows in the same order. Calls of
        jobs outside trees only cost one plain read and lock nothing here (their rows,
        all roots, are then locked by id, the same order)."""
        parents = await conn.fetch(
            self._db.sql["parents_of"],
            queue,
            list(ids),
        )
        if not parents:
            return
        await conn.fetch(
            self._db.sql["lock_ancestors"],
            [queue] * len(ids),
            list(ids),
        )

    async def tree_ended(self, conn: Connection, queue: str, ids: Sequence[str], now: int) -> None:
        """Jobs of ``queue`` just became terminal (in the transaction open on ``conn``):
        their trees' bookkeeping, and its events."""
        if not ids:
            return
        events = _Events()
        await self._ended(conn, queue, ids, now, events)
        await self._flush(conn, events)

    async def tree_removed(self, conn: Connection, queue: str, row: Sequence[Any], now: int) -> None:
        """A job was removed (``row``: its id, state, parent queue, id and token, policy,
        token): its parent counts it as cancelled; a removed parent's ended children go
        by their own TTLs."""
        jid, state, pq, pid, ptok, policy, token, depended = row
        events = _Events()
        if policy is not None:
            await self._release_results(conn, queue, jid, token, now)
        if pid is not None and state not in _TERMINAL:
            await self._child_ended(conn, (jid, "cancelled", None, pq, pid, ptok), now, events, removed=True, queue=queue)
        if depended and state not in _TERMINAL:  # its dependents count it as cancelled
            for dq, did, dtok in await conn.fetch(self._db.sql["dependents"], queue, jid, token):
                await self._child_ended(conn, (jid, "cancelled", None, dq, did, dtok), now, events, removed=True, queue=queue)
        await self._flush(conn, events)

    async def removing(self, conn: Connection, queue: str, job_id: str, now: int) -> None:
        """A job is about to be removed (in the transaction open on ``conn``, before the
        row goes with its ``job_deps`` rows): a dependent's ended dependencies are no longer
        kept for it."""
        token = await conn.fetchval(self._db.sql["removing_dependent"], queue, now, job_id)
        if token is not None:
            await conn.execute(self._db.sql["release_deps"], queue, job_id, token, now)

    async def cancel_children(self, conn: Connection, queue: str, job_id: str, token: str, now: int) -> None:
        """A processing parent was cancelled: so are its children."""
        events = _Events()
        await self._cancel_children(conn, queue, job_id, token, now, events)
        await self._flush(conn, events)

    async def waited(self, conn: Connection, queue: str, job_id: str, now: int) -> None:
        """A processing job settled ``WAIT_CHILDREN`` (now ``waiting_children``), after
        the ends settled with it reached their trees (:meth:`tree_ended`): a child of it
        settled in the same call may have released it, failed it or cancelled it already
        (its end counted on its own parent then), and nothing is left to do."""
        events = _Events()
        row = await conn.fetchrow(
            self._db.sql["waited"],
            queue,
            job_id,
        )
        assert row is not None  # (locked by the settlement)
        state, policy, pending, failures = row
        if state != "waiting_children":
            return
        if failures and policy == "cancel":
            await self._fail_parent(conn, queue, job_id, now, events)
        elif policy is None or not pending:
            await self._children_done(conn, queue, job_id, now, events)
        await self._flush(conn, events)

    async def _flush(self, conn: Connection, events: _Events) -> None:
        for q in dict.fromkeys([*events.by_queue, *events.wake]):
            await self._db.publish(conn, q, events.by_queue.get(q, []), wake=q in events.wake)

    async def _ended(self, conn: Connection, queue: str, ids: Sequence[str], now: int, events: _Events) -> None:
        rows = await conn.fetch(
            self._db.sql["ended"],
            queue,
            list(ids),
        )
        for jid, state, error, pq, pid, ptok, policy, token, depended in rows:
            if policy is not None:
                if state != "completed":
                    await self._cancel_children(conn, queue, jid, token, now, events)  # none of them may run on
                await self._release_results(conn, queue, jid, token, now)
                await conn.execute(self._db.sql["release_deps"], queue, jid, token, now)  # (never cancelled by it)
            if pid is not None:
                await self._child_ended(conn, (jid, state, error, pq, pid, ptok), now, events, queue=queue)
            if depended:  # its dependents count it as a parent counts a child
                for dq, did, dtok in await conn.fetch(self._db.sql["dependents"], queue, jid, token):
                    await self.lock_ancestors(conn, dq, [did])  # (a dependent in a tree: its tree's order)
                    await self._child_ended(conn, (jid, state, error, dq, did, dtok), now, events, queue=queue)

    async def _release_results(self, conn: Connection, queue: str, job_id: str, token: str, now: int) -> None:
        """The parent ended: its ended children's results go by their own TTLs."""
        await conn.execute(
            self._db.sql["release_results"],
            queue,
            job_id,
            token,
            now,
        )

    async def _child_ended(
        self,
        conn: Connection,
        child: tuple[Any, ...],
        now: int,
        events: _Events,
        *,
        queue: str,
        removed: bool = False,
    ) -> None:
        jid, state, error, pq, pid, ptok = child
        prow = await conn.fetchrow(
            self._db.sql["child_ended"],
            pq,
            now,
            pid,
        )
        if prow is None or prow[2] != ptok or prow[0] in _TERMINAL or prow[1] is None:
            return  # the parent ended first (or is gone): the child keeps its own TTL
        pstate, policy, _ = prow
        if not removed:  # kept while the parent may read it
            await conn.execute(self._db.sql["keep_parent"], queue, jid)
        if state != "completed":
            pending = await conn.fetchval(
                self._db.sql["parent_child_failed"],
                pq,
                pid,
                jid,
                b"" if removed or error is None else bytes(error),
            )
            if policy == "cancel":
                if pstate == "processing":
                    await self._cancel_children(conn, pq, pid, ptok, now, events)  # it fails when it waits
                else:
                    await self._fail_parent(conn, pq, pid, now, events)
                return
        else:
            pending = await conn.fetchval(
                self._db.sql["parent_child_done"], pq, pid
            )
        if pending == 0 and pstate == "waiting_children":
            if await self._ancestor_ended(conn, pq, pid):
                await self._cancel_waiting(conn, pq, pid, now, events)
            else:
                await self._children_done(conn, pq, pid, now, events)

    async def _ancestor_ended(self, conn: Connection, queue: str, job_id: str) -> bool:
        """Whether an ancestor of the job failed or was cancelled (stopping at a completed
        one, which cancels nothing below it). The ancestors are locked by this transaction
        (:meth:`lock_ancestors`, root first): a cascade from one of them is in this
        transaction, or committed before it, or comes after it; a parent whose last child
        ended is released only when none is on its way."""
        row = await conn.fetchrow(
            self._db.sql["parent_key"], queue, job_id
        )
        for _ in range(64):  # (as lock_ancestors' depth)
            if row is None or row[1] is None:
                return False
            pq, pid, ptok = row
            prow = await conn.fetchrow(
                self._db.sql["parent_of"],
                pq,
                pid,
            )
            if prow is None or prow[1] != ptok or prow[0] == "completed":
                return False
            if prow[0] in ("failed", "cancelled"):
                return True
            row = prow[2:]
        return False

    async def _cancel_waiting(self, conn: Connection, queue: str, job_id: str, now: int, events: _Events) -> None:
        """Cancel a waiting parent (locked) whose ancestor's cancel cascade is on its way."""
        token = await conn.fetchval(
            self._db.sql["cancel_waiting"],
            queue,
            job_id,
            now,
        )
        if token is not None:
            events.add(queue, StorageEvent("cancelled", job_id, token=token))
            await self._ended(conn, queue, [job_id], now, events)

    async def _fail_parent(self, conn: Connection, queue: str, job_id: str, now: int, events: _Events) -> None:
        row = await conn.fetchrow(
            self._db.sql["parent_failures"], queue, job_id
        )
        assert row is not None  # (locked by the caller)
        ids, errors, token = row
        error = child_failed_error(job_id, [(i, bytes(e or b"")) for i, e in zip(ids or [], errors or [], strict=True)])
        await conn.execute(
            self._db.sql["fail_parent"],
            queue,
            job_id,
            now,
            error,
        )
        events.add(queue, StorageEvent("failed", job_id, error=error, token=token))
        await self._ended(conn, queue, [job_id], now, events)  # cancels its children, tells its parent

    async def _children_done(self, conn: Connection, queue: str, job_id: str, now: int, events: _Events) -> None:
        """Every child of a waiting parent ended: queue it (at the back of its lane)."""
        token = await conn.fetchval(
            self._db.sql["children_done"],
            queue,
            job_id,
            now,
        )
        events.add(queue, StorageEvent("promoted", job_id, token=token), wake=True)

    async def _cancel_children(
        self, conn: Connection, queue: str, job_id: str, token: str, now: int, events: _Events
    ) -> None:
        """Cancel every child of a parent that has not ended (and, through their own ends,
        their descendants): a waiting, queued, delayed or failing one at once, a
        processing one by a cancel request to its worker."""
        rows = await conn.fetch(
            self._db.sql["cancel_children"],
            queue,
            job_id,
            token,
        )
        for cq, cid, policy in rows:
            row = await conn.fetchrow(  # (a nested step may have ended it meanwhile)
                self._db.sql["cancel_child"],
                cq,
                cid,
                now,
            )
            if row is not None:
                events.add(cq, StorageEvent("cancelled", cid, token=row[0]))
                await self._ended(conn, cq, [cid], now, events)
                continue
            row = await conn.fetchrow(
                self._db.sql["running_child"],
                cq,
                cid,
            )
            if row is None:
                continue
            ctoken, worker, requested = row
            if policy is not None:
                await self._cancel_children(conn, cq, cid, ctoken, now, events)
            if not requested:
                await conn.execute(
                    self._db.sql["request_cancel"], cq, cid
                )
                events.add(cq, StorageEvent("cancel_requested", cid, worker, token=ctoken))
