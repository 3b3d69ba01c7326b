"""PostgresStorage's bulk look-ups and whole-queue administration (``get_jobs``,
``clear``), a mixin kept apart from the job lifecycle so that each module stays small."""

from __future__ import annotations

from collections.abc import Sequence

from .._base import CLEARED, JobRecord, StorageEvent
from ._common import JOB_COLUMNS, PostgresBase, now_ms, record
from ._jobs import LIVE

__all__ = ["PostgresRetention"]


class PostgresRetention(PostgresBase):
    """Part of :class:`~trioqueue.storage.postgres.PostgresStorage`."""

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        if not job_ids:
            return []
        async with self.conn() as conn:  # one query, one snapshot
            rows = await conn.fetch(
                f"SELECT {JOB_COLUMNS} FROM {self._s}.jobs WHERE queue = $1 AND id = ANY($3::text[]) AND {LIVE}",
                queue,
                now_ms(),
                list(job_ids),
            )
        found = {r.id: r for r in map(record, rows)}
        return [found.get(jid) for jid in job_ids]

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        async with self.tx() as conn:  # one transaction: all or nothing, with its event
            res = await conn.execute(f"DELETE FROM {self._s}.jobs WHERE queue = $1", queue)
            await conn.execute(f"UPDATE {self._s}.queues SET flow = NULL WHERE queue = $1", queue)
            if schedules:
                await conn.execute(f"DELETE FROM {self._s}.schedules WHERE queue = $1", queue)
            # (a wake-up too: claims waiting for a concurrency slot look again)
            await self.publish(conn, queue, [StorageEvent(CLEARED, "")], wake=True)
        return res.rowcount
