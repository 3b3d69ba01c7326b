"""What every part of PostgresStorage is handed: its settings (:class:`PgSettings`, one
typed object) and the database (:class:`PgDatabase`: the pool and the notification hub,
transactions, the statements of ``sql/`` for the schema, events over NOTIFY and the
claim wake-ups heard); and job rows as :class:`JobRecord`."""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import trio

from ..._core import format_state
from ..._drivers.libpq import CallTimeout, Connection, ConnectionLost, Hub, Notification, Pool
from .._base import NOTICE_KINDS, JobRecord, StorageEvent
from .._records import waiting_state
from .._rules import signal_state
from ._schema import migrate
from ._sql import statements

__all__ = ["JOB_COLUMNS", "PgDatabase", "PgSettings", "decode_events", "now_ms", "record", "state_string"]

# The columns read to build a JobRecord / state string, in this order (the statements of
# sql/ that read jobs name them so: test_postgres_sql checks).
JOB_COLUMNS = (
    "id, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at_ms,"
    " parent_queue, parent_id, nchildren, grp"
)
_PAYLOAD_MAX = 7000  # NOTIFY payloads must stay under 8000 bytes
_EVENTS_MAX = 80  # events a payload at most (fewer when they are longer: halved to fit)
_nonce = itertools.count()
_NOT_OPEN = "PostgresStorage is not open: use `async with storage:`"
_PROCESS = os.urandom(4).hex()


def now_ms() -> int:
    return int(time.time() * 1000)


def state_string(state: str, state_ms: int, attempts: int, worker: str | None, run_at_ms: int | None) -> str:
    if state == "processing":
        return str(format_state(state, state_ms, worker or ""))
    if state == "failing":
        return str(format_state(state, state_ms, attempts))
    if state == "waiting_children":
        return waiting_state(state_ms)
    if state == "waiting_signal":
        return signal_state(state_ms)
    if state == "delayed":
        return str(format_state(state, state_ms, int(run_at_ms or 0)))
    return str(format_state(state, state_ms))


def record(row: Sequence[Any]) -> JobRecord:
    """A JobRecord from a row of :data:`JOB_COLUMNS`."""
    jid, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at = row[:13]
    parent_queue, parent_id, nchildren = row[13:16]
    return JobRecord(
        jid,
        state_string(state, state_ms, attempts, worker, run_at),
        created_ms,
        attempts,
        max_attempts,
        result,
        error,
        token,
        progress,
        priority,
        None if parent_id is None else (parent_queue, parent_id),
        nchildren or 0,
        row[16] if len(row) > 16 else None,
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data)


def _encode(events: Sequence[StorageEvent], *, slim: bool = False) -> str:
    rows = [
        [ev.kind, ev.job_id, ev.worker_id, None if slim else _b64(ev.result), None if slim else _b64(ev.error), ev.token]
        for ev in events
    ]
    return json.dumps({"n": f"{_PROCESS}.{next(_nonce)}", "e": rows}, separators=(",", ":"))


def decode_events(note: Notification) -> list[StorageEvent]:
    rows = json.loads(note.payload)["e"]
    return [StorageEvent(k, j, w, _unb64(r), _unb64(e), t) for k, j, w, r, e, t in rows]


@functools.lru_cache(maxsize=4096)
def _channel(schema: str, queue: str, kind: str) -> str:
    digest = hashlib.md5(f"{schema}\0{queue}".encode(), usedforsecurity=False).hexdigest()[:24]
    return f"tq_{kind}_{digest}"


@dataclass(frozen=True, slots=True)
class PgSettings:
    """The settings of a :class:`~trioqueue.storage.postgres.PostgresStorage` (its
    constructor's options, checked), read by every part it builds."""

    url: str
    schema: str  # a checked lower-case identifier
    pool_size: int = 8
    migrate: bool = True
    poll_interval: float = 5.0
    reconnect_timeout: float = 30.0
    synchronous_commit: bool = True
    call_timeout: float = 10.0
    prepared_statements: bool = True

    @property
    def quoted_schema(self) -> str:
        """The schema's name as SQL (quoted)."""
        return f'"{self.schema}"'


class PgDatabase:
    """The database of one storage: its pool and notification hub (open between
    :meth:`connect` and :meth:`close`), the statements of ``sql/`` for its schema
    (``sql``), transactions bounded by the call timeout, NOTIFY of events and wake-ups.
    ``known_queues``: the queues whose row in ``queues`` is known to exist;
    ``wakes_heard``: per queue, the claim wake-ups heard so far (:meth:`count_wakes`)."""

    def __init__(self, settings: PgSettings) -> None:
        self._settings = settings
        self.sql = statements(settings.schema)  # the statements of sql/ by name, for this schema
        self.known_queues: set[str] = set()
        # per queue: the claim wake-ups heard so far (a listener that stays, see dequeue)
        self.wakes_heard: dict[str, int] = {}
        self._pool: Pool | None = None
        self._hub: Hub | None = None

    @property
    def pool(self) -> Pool:
        """The connection pool (open while the storage is)."""
        if self._pool is None:
            raise RuntimeError(_NOT_OPEN)
        return self._pool

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise RuntimeError(_NOT_OPEN)
        return self._hub

    async def connect(self) -> None:
        """Open the pool (migrating the schema first if the settings say so) and the hub."""
        settings = self._settings
        setup = () if settings.synchronous_commit else ("SET synchronous_commit = off",)
        pool = Pool(
            settings.url,
            size=settings.pool_size,
            reconnect_timeout=settings.reconnect_timeout,
            setup=setup,
            prepare=settings.prepared_statements,
        )
        try:
            # the first connection: a server that is not there is reported at once (no retry)
            async with pool.connection() as conn:
                if settings.migrate:
                    await migrate(conn, settings.schema)
        except BaseException:
            await pool.aclose()
            raise
        self._pool = pool
        self._hub = Hub(pool, settings.call_timeout, ping_interval=max(settings.poll_interval, 0.1))
        self.wakes_heard.clear()  # (their listeners were the old hub's)

    async def close(self) -> None:
        # Not open from the first moment: a call its close cuts short raises the "not
        # open" error (see closes_calls), as every call after it does.
        hub, pool = self._hub, self._pool
        self._pool = self._hub = None
        if hub is not None:
            hub.close()
        if pool is not None:
            await pool.aclose()

    @contextmanager
    def closes_calls(self) -> Iterator[None]:
        """The block is a storage call: if :meth:`close` cuts it short (its connection
        closed under it), it raises the storage's "not open" :class:`RuntimeError`, as a
        call made after the close does, not the closed connection's
        :class:`ConnectionLost` (or a :class:`CallTimeout`)."""
        try:
            yield
        except (ConnectionLost, CallTimeout) as exc:
            if self._pool is None:
                raise RuntimeError(_NOT_OPEN) from exc
            raise

    async def listen(self, channel: str, callback: Callable[[Notification | None], None]) -> Hub:
        """Register ``callback`` for ``channel`` on the hub (see :meth:`Hub.listen`); the
        hub, for the caller's ``unlisten`` (which stays possible once the storage closed)."""
        hub = self.hub
        with self.closes_calls():
            await hub.listen(channel, callback)
        return hub

    # -- channels and events ------------------------------------------------------------

    @staticmethod
    def nonce() -> str:
        """A unique prefix for the ``n`` field of payloads built in SQL (PostgreSQL drops a
        NOTIFY identical to one already sent in the same transaction)."""
        return f"{_PROCESS}.{next(_nonce)}"

    def channel(self, queue: str, kind: str) -> str:
        """The NOTIFY channel of ``queue``: ``e`` (events), ``n`` (notice kinds), ``w``
        (wake-ups of claims)."""
        return _channel(self._settings.schema, queue, kind)

    def notifications(self, queue: str, events: Sequence[StorageEvent], wake: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        run: list[StorageEvent] = []
        run_channel = ""
        for ev in events:
            ch = self.channel(queue, "n" if ev.kind in NOTICE_KINDS else "e")
            if run and (ch != run_channel or len(run) >= _EVENTS_MAX):
                out.extend(self._chunks(run_channel, run))
                run = []
            run_channel = ch
            run.append(ev)
        if run:
            out.extend(self._chunks(run_channel, run))
        if wake:
            out.append((self.channel(queue, "w"), ""))
            self.wake_sent(queue)  # (before the commit: a claim may run early, never late)
        return out

    def wake_sent(self, queue: str) -> None:
        """Count a claim wake-up of ``queue`` this process is sending (see :meth:`count_wakes`)."""
        if queue in self.wakes_heard:
            self.wakes_heard[queue] += 1

    def _chunks(self, channel: str, events: list[StorageEvent]) -> list[tuple[str, str]]:
        payload = _encode(events)
        if len(payload) <= _PAYLOAD_MAX:
            return [(channel, payload)]
        if len(events) > 1:
            half = len(events) // 2
            return self._chunks(channel, events[:half]) + self._chunks(channel, events[half:])
        slim = _encode(events, slim=True)  # the reader reads result/error back
        if len(slim) <= _PAYLOAD_MAX:
            return [(channel, slim)]
        return [(channel, _encode([StorageEvent("resync", "")]))]  # (ids of extreme lengths)

    async def publish(self, conn: Connection, queue: str, events: Sequence[StorageEvent], *, wake: bool = False) -> None:
        """NOTIFY ``events`` (in order) and a wake-up, in the transaction open on ``conn``
        (delivered if and when it commits)."""
        pairs = self.notifications(queue, events, wake)
        if not pairs:
            return
        sql = "SELECT " + ", ".join(f"pg_notify(${2 * i + 1}, ${2 * i + 2})" for i in range(len(pairs)))
        await conn.execute(sql, *itertools.chain.from_iterable(pairs))

    # -- transactions ---------------------------------------------------------------------

    @asynccontextmanager
    async def tx(self, queue: str | None = None) -> AsyncIterator[Connection]:
        """A transaction on a pooled connection: committed (shielded: once the block is
        done, the outcome stands) when the block ends normally, rolled back when it raises
        or is cancelled. ``queue``: make sure its row in ``queues`` exists."""
        with self.closes_calls():
            async with self._transaction(queue) as conn:
                yield conn

    @asynccontextmanager
    async def _transaction(self, queue: str | None) -> AsyncIterator[Connection]:
        async with self.pool.connection(deadline=self.call_deadline()) as conn:
            await conn.execute("BEGIN")
            try:
                if queue is not None and queue not in self.known_queues:
                    await conn.execute(self.sql["queue_row"], queue)
                yield conn
            except BaseException:
                with trio.CancelScope(shield=True):
                    if not conn.closed:
                        try:
                            await conn.execute("ROLLBACK")
                        except Exception:  # noqa: BLE001 - the pool drops the connection
                            conn.close()
                raise
            with trio.CancelScope(shield=True):
                await conn.execute("COMMIT")
            if queue is not None:
                self.known_queues.add(queue)

    @asynccontextmanager
    async def conn(self) -> AsyncIterator[Connection]:
        """A pooled connection for a read (autocommit)."""
        with self.closes_calls():
            async with self.pool.connection(deadline=self.call_deadline()) as conn:
                yield conn

    def call_deadline(self) -> float:
        """The Trio time by which a storage call starting now must be done."""
        return trio.current_time() + self._settings.call_timeout

    @contextmanager
    def bounded(self, conn: Connection) -> Iterator[Connection]:
        """The block's statements on ``conn`` (the application's transaction) bounded
        by the call timeout (a :class:`CallTimeout` discards the connection)."""
        before = conn.deadline
        conn.deadline = min(before, self.call_deadline())
        try:
            yield conn
        finally:
            conn.deadline = before

    async def one_statement(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """One statement on a pooled connection (autocommit): its rows."""
        async with self.conn() as conn:
            return await conn.fetch(sql, *params)

    async def count_wakes(self, queue: str, channel: str) -> None:
        """Count the claim wake-ups of ``queue`` from the first claim on, between claims too
        (a listener that stays; a lost connection's None counts, a settlement's "s" not)."""
        if queue in self.wakes_heard:
            return
        self.wakes_heard[queue] = 0

        def heard(note: Notification | None) -> None:
            if note is None or note.payload != "s":
                self.wakes_heard[queue] += 1

        await self.listen(channel, heard)
