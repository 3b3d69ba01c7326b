"""PostgresStorage: events, pause, leader locks, schedules, listings and administration,
on top of the job lifecycle (``_jobs.py``) and the claims (``_claims.py``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager

import trio

from ..._drivers.libpq import Connection, Notification, Transaction
from ..._model._errors import ValidationError
from .._base import (
    NOTICE_KINDS,
    EnqueueOutcome,
    FlowJob,
    JobRecord,
    NewJob,
    StorageEvent,
    check_active_kind,
    check_state_kind,
    select_events,
    wanted_kinds,
)
from .._capabilities import Administration, Debounce, Groups, Schedules, Transactions, Trees
from ._claims import PostgresClaims
from ._common import decode_events, now_ms, record
from ._debounce import PostgresDebounce
from ._flows import TreeJobTaken
from ._retention import PostgresRetention
from ._schema import migrate, schema_version

__all__ = ["PostgresStorage"]


class PostgresStorage(
    PostgresRetention,
    PostgresDebounce,
    PostgresClaims,
    Trees,
    Schedules,
    Groups,
    Debounce,
    Administration,
    Transactions,
):
    """Jobs in PostgreSQL: durable, shared by every process that reaches the database.

    ``url`` is a libpq URL (``postgresql://user:password@host:port/dbname?...``) or
    ``key=value`` string. ``schema`` names the PostgreSQL schema holding the tables
    (created and migrated on open when ``migrate`` is true, under an advisory lock; with
    ``migrate=False`` run :func:`~trioqueue.storage.postgres.migrate` yourself).
    ``pool_size`` bounds the connections of this storage (one more listens for
    notifications). ``poll_interval``: a waiting claim re-checks the table at least that
    often (wake-ups come by ``LISTEN``/``NOTIFY``; polling is the fallback).
    ``synchronous_commit=False`` sets PostgreSQL's ``synchronous_commit = off`` on the
    storage's connections: a call returns before its commit is flushed to disk (several
    times faster per call), and a server crash may lose the last few hundred
    milliseconds of acknowledged calls (never corrupt them); a worker then runs those
    jobs again (at-least-once). Transactions of the application are not affected.
    ``prepared_statements`` (default true): a statement the storage runs again and again
    is prepared on each connection (parsed and planned once: about a third of a claim's
    or a settlement's time); turn it off behind a pooler that does not keep
    protocol-level prepared statements (PgBouncer before 1.21, or without
    ``max_prepared_statements``). ``call_timeout`` (seconds, default 10) bounds each call: a server that stops
    answering (stopped, a black-holed network) makes the call raise
    :class:`~trioqueue.storage.postgres.CallTimeout` (a ``StorageError``: a worker backs
    off and retries) and discards its connection, instead of hanging. It bounds the
    wait for a free connection, a reconnect (``reconnect_timeout``, default 30 s, is
    the limit without it) and every statement; of the application's transactions, the
    ``BEGIN``, ``COMMIT`` and the storage's own enqueues, not the application's SQL.

    Cancellation: every method is one transaction; cancelled before its ``COMMIT`` it
    is rolled back (the statement in flight is cancelled on the server), after that the
    outcome stands. A lost connection raises
    :class:`~trioqueue.storage.postgres.ConnectionLost` (the pool reconnects with backoff
    for the next call).
    """

    # -- schema ------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply the schema migrations this storage's schema lacks (see
        :func:`~trioqueue.storage.postgres.migrate`); the versions applied."""
        async with self.conn() as conn:
            return await migrate(conn, self.schema)

    async def schema_version(self) -> int:
        """The schema's version (0: not created yet)."""
        async with self.conn() as conn:
            return await schema_version(conn, self.schema)

    # -- transactional enqueue ---------------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A transaction of the application's own on one of the storage's connections:
        ``tx.execute`` / ``tx.fetch`` / ``tx.fetchval`` run SQL with ``$1, $2, ...``
        parameters, and ``queue.enqueue(..., transaction=tx)`` writes jobs in it. When
        the block ends normally it commits (jobs and rows appear together, claimers are
        woken); when it raises or is cancelled it rolls back (neither exists).
        Cancellation: the ``COMMIT`` itself is shielded."""
        async with self.pool.transaction(owner=self, timeout=self.call_timeout) as tx:
            if not self.synchronous_commit:  # the application's commits stay durable
                with self.bounded(tx.connection):
                    await tx.execute("SET LOCAL synchronous_commit = on")
            yield tx

    async def enqueue_in_transaction(
        self, queue: str, jobs: Sequence[NewJob], transaction: object
    ) -> list[EnqueueOutcome]:
        conn = self._own_transaction(transaction, jobs[0].id if jobs else None)
        if not jobs:
            return []
        await self._queue_rows([queue])
        with self.bounded(conn):
            if any(j.group is not None for j in jobs):
                await self._defer_group_entries(conn)
            outcomes, events = await self.enqueue_in(conn, queue, jobs, now_ms())
            await self.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def enqueue_flow_in_transaction(self, jobs: Sequence[FlowJob], transaction: object) -> EnqueueOutcome:
        conn = self._own_transaction(transaction, jobs[0].job.id)
        await self._queue_rows(list(dict.fromkeys(fj.queue for fj in jobs)))
        with self.bounded(conn):
            if any(fj.job.group is not None for fj in jobs):
                await self._defer_group_entries(conn)
            return await self._flow_in(conn, jobs, now_ms())

    async def _flow_in(self, conn: Connection, jobs: Sequence[FlowJob], now: int) -> EnqueueOutcome:
        # a savepoint: a refused tree writes nothing and leaves the application's
        # transaction usable (a cancellation leaves it failed: the block rolls back)
        await conn.execute("SAVEPOINT trioqueue_tree")
        try:
            outcome = await self.write_flow(conn, jobs, now)
        except Exception as exc:
            if conn.closed:  # (lost, or discarded by a timeout: the transaction is gone)
                raise
            await conn.execute("ROLLBACK TO SAVEPOINT trioqueue_tree")
            if isinstance(exc, TreeJobTaken):  # committed meanwhile by another transaction
                return await self.flow_taken(conn, jobs, exc, now)
            raise
        await conn.execute("RELEASE SAVEPOINT trioqueue_tree")
        return outcome

    async def _defer_group_entries(self, conn: Connection) -> None:
        """Put the groups of the jobs this transaction enqueues in the rings at its COMMIT
        (schema version 5), not at once: an uncommitted ring entry would hold up every
        other enqueue of the group and every settlement putting it back in the rings
        until the application's transaction ends."""
        await conn.execute(self._sql["defer_group_entries"])

    def _own_transaction(self, transaction: object, first: str | None) -> Connection:
        """The connection of ``transaction``, one of this storage's, still open
        (:class:`ValidationError` naming job ``first`` otherwise)."""
        if not isinstance(transaction, Transaction) or transaction.owner is not self:
            raise ValidationError(
                f"job {first!r}: transaction= must come from this storage's transaction(), got {transaction!r}"
            )
        if not transaction.active or transaction.connection.closed:
            raise ValidationError(f"job {first!r}: the transaction has ended (enqueue inside its `async with` block)")
        return transaction.connection

    async def _queue_rows(self, queues: Sequence[str]) -> None:
        """Make sure ``queues`` have their rows, committed on their own: inserted inside
        the application's transaction, a queue's row would stay locked (every claim of
        the queue waiting) until it ends."""
        missing = [q for q in queues if q not in self._known_queues]
        if not missing:
            return
        async with self.conn() as own:
            await own.execute(
                self._sql["queue_rows"], missing
            )
        self._known_queues.update(missing)

    # -- events ------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        wanted = wanted_kinds(kinds)
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)

        def deliver(note: Notification | None) -> None:
            events = [StorageEvent("resync", "")] if note is None else select_events(decode_events(note), wanted)
            if events:
                try:
                    send.send_nowait(events)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    pass

        channels = [self.channel(queue, "n")]
        if wanted is None or not wanted <= NOTICE_KINDS:
            channels.insert(0, self.channel(queue, "e"))
        hub = self.hub
        done = False
        try:
            for ch in channels:
                await hub.listen(ch, deliver)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hub.wait, lambda: done)
                try:
                    yield receive
                finally:
                    done = True
                    nursery.cancel_scope.cancel()
        finally:
            for ch in channels:
                hub.unlisten(ch, deliver)
            send.close()
            receive.close()

    # -- pause -------------------------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> bool:
        async with self.tx(queue) as conn:
            changed = await conn.fetchval(
                self._sql["set_paused"], queue, paused
            )
            if changed:
                await self.publish(conn, queue, [StorageEvent("paused" if paused else "resumed", "")], wake=True)
        return bool(changed)

    async def is_paused(self, queue: str) -> bool:
        async with self.conn() as conn:
            return bool(await conn.fetchval(self._sql["is_paused"], queue))

    # -- groups (the ring and its triggers: migration 3 of _schema.py) ---------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        async with self.tx(queue) as conn:
            if paused:
                changed = await conn.fetchval(
                    self._sql["pause_group"], queue, group
                )
            else:
                changed = await conn.fetchval(
                    self._sql["resume_group"], queue, group
                )
                if changed:  # back in the rings (it left them while paused), and claimers wake
                    await conn.execute(self._sql["group_requeue"], queue, group)
                    await self.publish(conn, queue, [], wake=True)
        return bool(changed)

    async def paused_groups(self, queue: str) -> list[str]:
        async with self.conn() as conn:
            rows = await conn.fetch(self._sql["paused_groups"], queue)
        return [r[0] for r in rows]

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        async with self.conn() as conn:
            rows = await conn.fetch(
                self._sql["group_counts"],
                queue,
            )
        out: dict[str, dict[str, int]] = {}
        for group, state, n in rows:
            out.setdefault(group, {"queued": 0, "processing": 0})[state] = int(n)
        return out

    # -- leader locks ------------------------------------------------------------------

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = now_ms()
        async with self.conn() as conn:
            got = await conn.fetchval(
                self._sql["acquire_lock"],
                name,
                owner,
                now + int(ttl * 1000),
                now,
            )
        return bool(got)

    async def release_lock(self, name: str, owner: str) -> bool:
        async with self.conn() as conn:
            gone = await conn.fetchval(
                self._sql["release_lock"],
                name,
                owner,
                now_ms(),
            )
        return bool(gone)

    # -- schedules ---------------------------------------------------------------------

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        async with self.tx(queue) as conn:
            if expected is None:
                ok = await conn.fetchval(
                    self._sql["put_schedule"],
                    queue,
                    name,
                    spec,
                )
            else:
                ok = await conn.fetchval(
                    self._sql["replace_schedule"],
                    queue,
                    name,
                    spec,
                    expected,
                )
        return bool(ok)

    async def remove_schedule(self, queue: str, name: str) -> bool:
        async with self.conn() as conn:
            gone = await conn.fetchval(
                self._sql["remove_schedule"], queue, name
            )
        return bool(gone)

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        async with self.conn() as conn:
            rows = await conn.fetch(self._sql["get_schedules"], queue)
        return {name: (bytes(spec), last) for name, spec, last in rows}

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        async with self.tx(queue) as conn:
            row = await conn.fetchrow(
                self._sql["tick_schedule"], queue, name
            )
            if row is None or (row[0] is not None and tick <= row[0]):
                return False
            if job is not None:
                _, events = await self.enqueue_in(conn, queue, [job], now_ms())
                await self.publish(conn, queue, events, wake=bool(events))
            await conn.execute(
                self._sql["schedule_ticked"], queue, name, float(tick)
            )
        return True

    # -- registry queries and administration -------------------------------------------

    async def counts(self, queue: str) -> dict[str, int]:
        from .._base import STATE_KINDS

        async with self.conn() as conn:
            rows = await conn.fetch(
                self._sql["counts"], queue, now_ms()
            )
        found = dict(rows)
        return {k: int(found.get(k, 0)) for k in STATE_KINDS}

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        async with self.conn() as conn:
            ms = await conn.fetchval(
                self._sql["oldest"], queue, state
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
        async with self.conn() as conn:
            if after is None:
                rows = await conn.fetch(
                    self._sql["list_jobs"],
                    queue,
                    now_ms(),
                    state,
                    limit + 1,
                )
            else:
                rows = await conn.fetch(
                    self._sql["list_jobs_after"],
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

    async def retry_job(self, queue: str, job_id: str, token: str) -> bool:
        now = now_ms()
        async with self.tx(queue) as conn:
            done = await conn.fetchval(
                self._sql["retry_job"],
                queue,
                now,
                job_id,
                token,
            )
            if done:
                await self.publish(conn, queue, [StorageEvent("enqueued", job_id, token=token)], wake=True)
        return bool(done)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        now = now_ms()
        cutoff = now if older_than is None else now - int(older_than * 1000)
        async with self.conn() as conn:
            res = await conn.execute(
                self._sql["purge"], queue, state, cutoff
            )
        return res.rowcount

    async def remove_job(self, queue: str, job_id: str) -> bool:
        now = now_ms()
        async with self.tx() as conn:
            await self.lock_ancestors(conn, queue, [job_id])
            row = await conn.fetchrow(
                self._sql["remove_job"],
                queue,
                now,
                job_id,
            )
            if row is None:
                return False
            await self.publish(conn, queue, [StorageEvent("removed", job_id, token=row[6])])
            await self.tree_removed(conn, queue, row, now)
        return True

    async def queue_names(self) -> list[str]:
        async with self.conn() as conn:
            rows = await conn.fetch(self._sql["queue_names"])
        return [r[0] for r in rows]

    def __repr__(self) -> str:
        return f"PostgresStorage(schema={self.schema!r})"
