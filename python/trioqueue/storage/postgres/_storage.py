"""PostgresStorage: jobs in PostgreSQL, one class whose methods are the list of what the
backend does. It builds its parts in ``__init__``, each handed what it needs (the
database, :class:`~._common.PgDatabase`: pool, transactions, statements, NOTIFY; the
settings, :class:`~._common.PgSettings`; the trees, for the steps that end a job of a
tree): :class:`~._jobs.PgJobs` (enqueues, cancels, look-ups, debounce),
:class:`~._claims.PgClaims` (claims, settlements, leases, recovery),
:class:`~._flows.PgTrees` (trees of jobs), :class:`~._admin.PgAdmin` (listings and
administration). Transactions of the application, events, pause, leader locks and
schedules are written here."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager

import trio

from ..._drivers.libpq import Connection, Notification, Pool, Transaction
from ..._model._errors import ValidationError
from ..._model._types import CancelStatus, UpdateTTLStatus
from .._base import (
    NOTICE_KINDS,
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    FlowJob,
    HeartbeatReply,
    JobRecord,
    NewJob,
    Settlement,
    StorageEvent,
    select_events,
    wanted_kinds,
)
from .._capabilities import Administration, Debounce, Groups, Schedules, Signals, Transactions, Trees
from ._admin import PgAdmin
from ._claims import PgClaims
from ._common import PgDatabase, PgSettings, decode_events, now_ms
from ._flows import PgTrees, TreeJobTaken
from ._jobs import PgJobs
from ._schema import check_schema_name, migrate, schema_version

__all__ = ["PostgresStorage"]


class PostgresStorage(Trees, Schedules, Groups, Debounce, Administration, Transactions, Signals):
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

    def __init__(
        self,
        url: str,
        *,
        schema: str = "trioqueue",
        pool_size: int = 8,
        migrate: bool = True,
        poll_interval: float = 5.0,
        reconnect_timeout: float = 30.0,
        synchronous_commit: bool = True,
        call_timeout: float = 10.0,
        prepared_statements: bool = True,
    ) -> None:
        super().__init__()
        if not (isinstance(call_timeout, (int, float)) and 0 < call_timeout < math.inf):
            raise ValidationError(f"call_timeout must be a positive number of seconds, got {call_timeout!r}")
        self._settings = PgSettings(
            url,
            check_schema_name(schema),
            pool_size=pool_size,
            migrate=migrate,
            poll_interval=poll_interval,
            reconnect_timeout=reconnect_timeout,
            synchronous_commit=synchronous_commit,
            call_timeout=float(call_timeout),
            prepared_statements=prepared_statements,
        )
        # The parts, each handed what it needs.
        self._db = PgDatabase(self._settings)
        self._trees = PgTrees(self._db)
        self._jobs = PgJobs(self._db, self._trees)
        self._claims = PgClaims(self._db, self._settings, self._trees)
        self._admin = PgAdmin(self._db, self._trees)

    # -- settings and lifecycle --------------------------------------------------------

    @property
    def url(self) -> str:
        return self._settings.url

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the tables."""
        return self._settings.schema

    @property
    def auto_migrate(self) -> bool:
        return self._settings.migrate

    @property
    def poll_interval(self) -> float:
        return self._settings.poll_interval

    @property
    def synchronous_commit(self) -> bool:
        return self._settings.synchronous_commit

    @property
    def call_timeout(self) -> float:
        return self._settings.call_timeout

    @property
    def prepared_statements(self) -> bool:
        return self._settings.prepared_statements

    @property
    def pool(self) -> Pool:
        """The connection pool (for the application's own SQL; open while the storage is)."""
        return self._db.pool

    async def _connect(self) -> None:
        await self._db.connect()
        self._claims.reset()

    async def _disconnect(self) -> None:
        await self._db.close()

    def __repr__(self) -> str:
        return f"PostgresStorage(schema={self.schema!r})"

    # -- schema ------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply the schema migrations this storage's schema lacks (see
        :func:`~trioqueue.storage.postgres.migrate`); the versions applied."""
        async with self._db.conn() as conn:
            return await migrate(conn, self.schema)

    async def schema_version(self) -> int:
        """The schema's version (0: not created yet)."""
        async with self._db.conn() as conn:
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
        async with self._db.pool.transaction(owner=self, timeout=self.call_timeout) as tx:
            if not self.synchronous_commit:  # the application's commits stay durable
                with self._db.bounded(tx.connection):
                    await tx.execute("SET LOCAL synchronous_commit = on")
            yield tx

    async def enqueue_in_transaction(
        self, queue: str, jobs: Sequence[NewJob], transaction: object
    ) -> list[EnqueueOutcome]:
        conn = self._own_transaction(transaction, jobs[0].id if jobs else None)
        if not jobs:
            return []
        await self._queue_rows([queue])
        with self._db.bounded(conn):
            if any(j.group is not None for j in jobs):
                await self._defer_group_entries(conn)
            outcomes, events = await self._jobs.enqueue_in(conn, queue, jobs, now_ms())
            await self._db.publish(conn, queue, events, wake=bool(events))
        return outcomes

    async def enqueue_flow_in_transaction(self, jobs: Sequence[FlowJob], transaction: object) -> EnqueueOutcome:
        conn = self._own_transaction(transaction, jobs[0].job.id)
        await self._queue_rows(list(dict.fromkeys(fj.queue for fj in jobs)))
        with self._db.bounded(conn):
            if any(fj.job.group is not None for fj in jobs):
                await self._defer_group_entries(conn)
            return await self._flow_in(conn, jobs, now_ms())

    async def _flow_in(self, conn: Connection, jobs: Sequence[FlowJob], now: int) -> EnqueueOutcome:
        # a savepoint: a refused tree writes nothing and leaves the application's
        # transaction usable (a cancellation leaves it failed: the block rolls back)
        await conn.execute("SAVEPOINT trioqueue_tree")
        try:
            outcome = await self._trees.write_flow(conn, jobs, now)
        except Exception as exc:
            if conn.closed:  # (lost, or discarded by a timeout: the transaction is gone)
                raise
            await conn.execute("ROLLBACK TO SAVEPOINT trioqueue_tree")
            if isinstance(exc, TreeJobTaken):  # committed meanwhile by another transaction
                return await self._trees.flow_taken(conn, jobs, exc, now)
            raise
        await conn.execute("RELEASE SAVEPOINT trioqueue_tree")
        return outcome

    async def _defer_group_entries(self, conn: Connection) -> None:
        """Put the groups of the jobs this transaction enqueues in the rings at its COMMIT
        (schema version 5), not at once: an uncommitted ring entry would hold up every
        other enqueue of the group and every settlement putting it back in the rings
        until the application's transaction ends."""
        await conn.execute(self._db.sql["defer_group_entries"])

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
        missing = [q for q in queues if q not in self._db.known_queues]
        if not missing:
            return
        async with self._db.conn() as own:
            await own.execute(
                self._db.sql["queue_rows"], missing
            )
        self._db.known_queues.update(missing)

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

        channels = [self._db.channel(queue, "n")]
        if wanted is None or not wanted <= NOTICE_KINDS:
            channels.insert(0, self._db.channel(queue, "e"))
        hub = self._db.hub
        done = False
        try:
            for ch in channels:
                await self._db.listen(ch, deliver)
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
        async with self._db.tx(queue) as conn:
            changed = await conn.fetchval(
                self._db.sql["set_paused"], queue, paused
            )
            if changed:
                await self._db.publish(conn, queue, [StorageEvent("paused" if paused else "resumed", "")], wake=True)
        return bool(changed)

    async def is_paused(self, queue: str) -> bool:
        async with self._db.conn() as conn:
            return bool(await conn.fetchval(self._db.sql["is_paused"], queue))

    # -- groups (the ring and its triggers: migration 3 of _schema.py) ---------------------

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        async with self._db.tx(queue) as conn:
            if paused:
                changed = await conn.fetchval(
                    self._db.sql["pause_group"], queue, group
                )
            else:
                changed = await conn.fetchval(
                    self._db.sql["resume_group"], queue, group
                )
                if changed:  # back in the rings (it left them while paused), and claimers wake
                    await conn.execute(self._db.sql["group_requeue"], queue, group)
                    await self._db.publish(conn, queue, [], wake=True)
        return bool(changed)

    # -- leader locks ------------------------------------------------------------------

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = now_ms()
        async with self._db.conn() as conn:
            got = await conn.fetchval(
                self._db.sql["acquire_lock"],
                name,
                owner,
                now + int(ttl * 1000),
                now,
            )
        return bool(got)

    async def release_lock(self, name: str, owner: str) -> bool:
        async with self._db.conn() as conn:
            gone = await conn.fetchval(
                self._db.sql["release_lock"],
                name,
                owner,
                now_ms(),
            )
        return bool(gone)

    # -- schedules ---------------------------------------------------------------------

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        async with self._db.tx(queue) as conn:
            if expected is None:
                ok = await conn.fetchval(
                    self._db.sql["put_schedule"],
                    queue,
                    name,
                    spec,
                )
            else:
                ok = await conn.fetchval(
                    self._db.sql["replace_schedule"],
                    queue,
                    name,
                    spec,
                    expected,
                )
        return bool(ok)

    async def remove_schedule(self, queue: str, name: str) -> bool:
        async with self._db.conn() as conn:
            gone = await conn.fetchval(
                self._db.sql["remove_schedule"], queue, name
            )
        return bool(gone)

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        async with self._db.conn() as conn:
            rows = await conn.fetch(self._db.sql["get_schedules"], queue)
        return {name: (bytes(spec), last) for name, spec, last in rows}

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        async with self._db.tx(queue) as conn:
            row = await conn.fetchrow(
                self._db.sql["tick_schedule"], queue, name
            )
            if row is None or (row[0] is not None and tick <= row[0]):
                return False
            if job is not None:
                _, events = await self._jobs.enqueue_in(conn, queue, [job], now_ms())
                await self._db.publish(conn, queue, events, wake=bool(events))
            await conn.execute(
                self._db.sql["schedule_ticked"], queue, name, float(tick)
            )
        return True


    # -- jobs (PgJobs) -------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        return await self._jobs.enqueue(queue, jobs)

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        return await self._jobs.debounce(queue, jobs, delay, max_wait)

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        return await self._jobs.cancel(queue, job_id)

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        return await self._jobs.get_job(queue, job_id)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return await self._jobs.get_jobs(queue, job_ids)

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        return await self._jobs.get_envelope(queue, job_id)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        return await self._jobs.update_result_ttl(queue, job_id, ttl)

    # -- claims (PgClaims) -----------------------------------------------------------------

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
        return await self._claims.dequeue(queue, worker_id, max_jobs, timeout, lease, start, limits)

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        return await self._claims.settle(queue, worker_id, settlements)

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        return await self._claims.release(queue, worker_id, job_ids, refund=refund)

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        return await self._claims.start(queue, worker_id, claims)

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        return await self._claims.held_jobs(queue, worker_id)

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        return await self._claims.heartbeat(queue, worker_id, ttl, claims, lease)

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        return await self._claims.set_progress(queue, worker_id, job_id, token, progress)

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await self._claims.unregister_worker(queue, worker_id)

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        return await self._claims.save_step(queue, worker_id, job_id, token, name, value)

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        return await self._claims.get_steps(queue, job_id)

    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        return await self._claims.signal(queue, job_id, name, payload)

    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        return await self._claims.get_signals(queue, job_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        return await self._claims.workers(queue, include_expired=include_expired)

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        return await self._claims.recover_stalled(queue)

    # -- trees of jobs (PgTrees) -----------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        return await self._trees.enqueue_flow(jobs)

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        return await self._trees.add_children(queue, worker_id, job_id, token, children, policy)

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        return await self._trees.get_children(queue, job_id)

    # -- registry queries and administration (PgAdmin) -----------------------------------

    async def counts(self, queue: str) -> dict[str, int]:
        return await self._admin.counts(queue)

    async def oldest(self, queue: str, state: str) -> float | None:
        return await self._admin.oldest(queue, state)

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        return await self._admin.list_jobs(queue, state, limit=limit, cursor=cursor)

    async def queue_names(self) -> list[str]:
        return await self._admin.queue_names()

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        return await self._admin.retry_job(queue, job_id, token, reset_steps=reset_steps)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        return await self._admin.purge(queue, state, older_than=older_than)

    async def remove_job(self, queue: str, job_id: str) -> bool:
        return await self._admin.remove_job(queue, job_id)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        return await self._admin.clear(queue, schedules=schedules)

    async def paused_groups(self, queue: str) -> list[str]:
        return await self._admin.paused_groups(queue)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        return await self._admin.group_counts(queue)
