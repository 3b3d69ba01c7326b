"""PostgresStorage's bulk look-ups, whole-queue administration and count-based retention
(``get_jobs``, ``clear``, ``Settlement.keep``), a part kept apart from the job lifecycle
so that each module stays small.

Count-based retention runs in the settling call, as one more statement right after the
settlement commits (not in its transaction: the fast path settles a batch in one
statement of its own): the jobs of the state past the newest ``keep`` (by the time they
entered it, newest first on the ``jobs_by_state`` index) are deleted. Between the two,
another process may see ``keep`` plus this call's batch; the statement reads ``keep``
index entries, so its cost grows with ``keep``, not with the queue. A job whose result or
error was too large for its event (over 4 KiB) is not forgotten before a grace of
``READ_BACK_GRACE_MS`` (60 s) from when it ended: its waiter reads the record back.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._base import CLEARED, JobRecord, SettleKind, Settlement, StorageEvent
from ._claims import PostgresClaims
from ._common import now_ms, record

__all__ = ["PostgresRetention"]


_KEPT = {SettleKind.COMPLETE: "completed", SettleKind.FAIL: "failed"}
# A result/error up to this size rides along in its event (NOTIFY's 8000-byte payloads,
# base64: an event carries up to about 5 KB of it, whichever path settled it); a larger
# one is read back from the record by its waiter, so count-based retention leaves the
# record that long after the job ended (then it runs out, as if its TTL had).
_RIDES_ALONG = 4096
READ_BACK_GRACE_MS = 60_000


class PostgresRetention(PostgresClaims):
    """Part of :class:`~trioqueue.storage.postgres.PostgresStorage`."""

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        out = await super().settle(queue, worker_id, settlements)
        keeps: dict[str, int] = {}
        for s, ok in zip(settlements, out, strict=True):
            if ok and s.keep is not None and s.kind in _KEPT:
                state = _KEPT[s.kind]
                keeps[state] = min(s.keep, keeps.get(state, s.keep))
        if keeps:
            now = now_ms()
            async with self.conn() as conn:
                for state, keep in keeps.items():
                    # Past the newest ``keep``: forgotten now if the result/error rode along
                    # in the event or the job ended over READ_BACK_GRACE ago; else it runs
                    # out READ_BACK_GRACE after it ended (its waiter reads it back).
                    await conn.execute(
                        self._sql["trim_retained"],
                        queue,
                        state,
                        keep,
                        _RIDES_ALONG,
                        now,
                        READ_BACK_GRACE_MS,
                    )
        return out

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        if not job_ids:
            return []
        async with self.conn() as conn:  # one query, one snapshot
            rows = await conn.fetch(
                self._sql["get_jobs"],
                queue,
                now_ms(),
                list(job_ids),
            )
        found = {r.id: r for r in map(record, rows)}
        return [found.get(jid) for jid in job_ids]

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        async with self.tx() as conn:  # one transaction: all or nothing, with its event
            res = await conn.execute(self._sql["clear_jobs"], queue)
            await conn.execute(self._sql["clear_queue_flow"], queue)
            # the groups' rows (paused groups are kept)
            for name in ("clear_group_ring", "clear_full_groups", "clear_group_claims", "clear_group_sleep"):
                await conn.execute(self._sql[name], queue)
            if schedules:
                await conn.execute(self._sql["clear_schedules"], queue)
            # (a wake-up too: claims waiting for a concurrency slot look again)
            await self.publish(conn, queue, [StorageEvent(CLEARED, "")], wake=True)
        return res.rowcount
