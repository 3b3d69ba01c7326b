"""PostgresStorage's debounced enqueue (:meth:`~trioqueue.storage.Debounce.debounce`): one transaction per
call, the waiting job's row locked while it is debounced. Two producers debouncing the
same new id together: the second's insert waits for the first's and, once that commits,
it debounces the job the first created (it is never a ``duplicate`` of a waiting job)."""

from __future__ import annotations

from collections.abc import Sequence

from ..._drivers.libpq import Connection
from ..._model._types import EnqueueStatus
from .._base import EnqueueOutcome, NewJob, StorageEvent
from ._common import now_ms, state_string
from ._jobs import PostgresJobs, _due_ms

__all__ = ["PostgresDebounce"]


class PostgresDebounce(PostgresJobs):
    """A part of :class:`~trioqueue.storage.postgres.PostgresStorage`."""

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        outcomes: list[EnqueueOutcome] = []
        events: list[StorageEvent] = []
        async with self.tx(queue) as conn:
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
                    self._sql["debounce"],
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
                    events.append(StorageEvent("due", "", result=_due_ms(run_at)))
                outcomes.append(EnqueueOutcome(EnqueueStatus.DEBOUNCED, state_string(state, state_ms, 0, None, run_at), token=token))
            await self.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def _waiting(self, conn: Connection, queue: str, job_id: str) -> tuple[str, int | None] | None:
        """The state and due time of ``job_id`` if it waits (``delayed``/``queued``), its
        row locked until the transaction ends; ``None`` if it is not there or not waiting."""
        found = await conn.fetchrow(
            self._sql["waiting"], queue, job_id
        )
        if found is None or found[0] not in ("delayed", "queued"):
            return None
        return found[0], found[1]
