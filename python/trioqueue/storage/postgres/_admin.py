"""PostgresStorage's registry queries and administration (:class:`PgAdmin`, a part the
storage builds): counts, listings, the groups' counts, retry, purge, remove, clear and
the queue names."""

from __future__ import annotations

from .._base import (
    CLEARED,
    STATE_KINDS,
    JobRecord,
    StorageEvent,
    check_active_kind,
    check_state_kind,
)
from ._common import PgDatabase, now_ms, record
from ._flows import PgTrees

__all__ = ["PgAdmin"]


class PgAdmin:
    """The registry queries and administration of
    :class:`~trioqueue.storage.postgres.PostgresStorage`, on its database; a removed job
    of a tree reaches its tree through ``trees``."""

    def __init__(self, db: PgDatabase, trees: PgTrees) -> None:
        self._db = db
        self._trees = trees

    async def counts(self, queue: str) -> dict[str, int]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["counts"], queue, now_ms()
            )
        found = dict(rows)
        return {k: int(found.get(k, 0)) for k in STATE_KINDS}

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        async with self._db.conn() as conn:
            ms = await conn.fetchval(
                self._db.sql["oldest"], queue, state
            )
        return None if ms is None else ms / 1000

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        check_state_kind(state)
        after: tuple[int, str] | None = None
        if cursor is not None:
            ms, sep, jid = cursor.partition(":")
            if not sep or not ms.isdigit():
                raise ValueError(f"invalid cursor {cursor!r}: pass back a cursor returned by list_jobs")
            after = (int(ms), jid)
        limit = max(int(limit), 1)
        async with self._db.conn() as conn:
            if after is None:
                rows = await conn.fetch(
                    self._db.sql["list_jobs"],
                    queue,
                    now_ms(),
                    state,
                    limit + 1,
                )
            else:
                rows = await conn.fetch(
                    self._db.sql["list_jobs_after"],
                    queue,
                    now_ms(),
                    state,
                    limit + 1,
                    after[0],
                    after[1],
                )
        page = [record(r) for r in rows[:limit]]
        nxt = None
        if len(rows) > limit:
            last = rows[limit - 1]
            nxt = f"{last[2]}:{last[0]}"
        return page, nxt

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        now = now_ms()
        async with self._db.tx(queue) as conn:
            done = await conn.fetchval(
                self._db.sql["retry_job"],
                queue,
                now,
                job_id,
                token,
                reset_steps,
            )
            if done:
                await self._db.publish(conn, queue, [StorageEvent("enqueued", job_id, token=token)], wake=True)
        return bool(done)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        now = now_ms()
        cutoff = now if older_than is None else now - int(older_than * 1000)
        async with self._db.conn() as conn:
            res = await conn.execute(
                self._db.sql["purge"], queue, state, cutoff
            )
        return res.rowcount

    async def remove_job(self, queue: str, job_id: str) -> bool:
        now = now_ms()
        async with self._db.tx() as conn:
            await self._trees.lock_ancestors(conn, queue, [job_id])
            await self._trees.removing(conn, queue, job_id, now)
            row = await conn.fetchrow(
                self._db.sql["remove_job"],
                queue,
                now,
                job_id,
            )
            if row is None:
                return False
            await self._db.publish(conn, queue, [StorageEvent("removed", job_id, token=row[6])])
            await self._trees.tree_removed(conn, queue, row, now)
        return True

    async def queue_names(self) -> list[str]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(self._db.sql["queue_names"])
        return [r[0] for r in rows]

    async def paused_groups(self, queue: str) -> list[str]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(self._db.sql["paused_groups"], queue)
        return [r[0] for r in rows]

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(
                self._db.sql["group_counts"],
                queue,
            )
        out: dict[str, dict[str, int]] = {}
        for group, state, n in rows:
            out.setdefault(group, {"queued": 0, "processing": 0})[state] = int(n)
        return out

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        now = now_ms()
        async with self._db.tx() as conn:  # one transaction: all or nothing, with its event
            # Its jobs of trees go as remove_job removes one: their parents and dependents
            # on other queues count an unfinished one as cancelled (those of this queue go
            # with it), its parents and dependents let their kept jobs go by their TTLs.
            treed = [r[0] for r in await conn.fetch(self._db.sql["clear_tree_jobs"], queue)]
            if treed:
                await self._trees.lock_ancestors(conn, queue, treed)
                for job_id in treed:
                    await self._trees.removing(conn, queue, job_id, now)
            gone = await conn.fetch(self._db.sql["clear_tree_rows"], queue, treed) if treed else []
            res = await conn.execute(self._db.sql["clear_jobs"], queue)
            for row in gone:
                await self._trees.tree_removed(conn, queue, row, now)
            await conn.execute(self._db.sql["clear_queue_flow"], queue)
            # the groups' rows (paused groups are kept)
            for name in ("clear_group_ring", "clear_full_groups", "clear_group_claims", "clear_group_sleep"):
                await conn.execute(self._db.sql[name], queue)
            if schedules:
                await conn.execute(self._db.sql["clear_schedules"], queue)
            # (a wake-up too: claims waiting for a concurrency slot look again)
            await self._db.publish(conn, queue, [StorageEvent(CLEARED, "")], wake=True)
        return len(gone) + res.rowcount
