"""Shared pieces of PostgresStorage: the connection-owning base class, transactions,
events over NOTIFY, and job rows as :class:`JobRecord`."""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio

from ..._core import format_state
from ..._drivers.libpq import Connection, Hub, Notification, Pool
from ..._model._errors import ValidationError
from .._base import NOTICE_KINDS, JobRecord, Storage, StorageEvent
from .._records import waiting_state
from ._schema import check_schema_name, migrate
from ._sql import statements

__all__ = ["JOB_COLUMNS", "PostgresBase", "decode_events", "now_ms", "record", "state_string"]

# The columns read to build a JobRecord / state string, in this order (the statements of
# sql/ that read jobs name them so: test_postgres_sql checks).
JOB_COLUMNS = (
    "id, state, state_ms, created_ms, attempts, max_attempts, result, error, token, progress, priority, worker, run_at_ms,"
    " parent_queue, parent_id, nchildren, grp"
)
_PAYLOAD_MAX = 7000  # NOTIFY payloads must stay under 8000 bytes
_EVENTS_MAX = 80  # events a payload at most (fewer when they are longer: halved to fit)
_nonce = itertools.count()
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


class PostgresBase(Storage):
    """Connections, schema, transactions and NOTIFY for the PostgresStorage mixins."""

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
        self.call_timeout = float(call_timeout)
        self.url = url
        self.schema = check_schema_name(schema)
        self.auto_migrate = migrate
        self.poll_interval = poll_interval
        self._s = f'"{schema}"'  # the quoted schema name
        self._sql = statements(self.schema)  # the statements of sql/ by name, for this schema
        self._pool_size = pool_size
        self._reconnect_timeout = reconnect_timeout
        self.synchronous_commit = synchronous_commit
        self.prepared_statements = prepared_statements
        self._pool: Pool | None = None
        self._hub: Hub | None = None
        self._known_queues: set[str] = set()
        self._grouped_queues: set[str] = set()  # queues whose ring had groups at the last claim
        # per queue: the claim wake-ups heard so far (a listener that stays, see dequeue)
        self._wakes_heard: dict[str, int] = {}
        # per (queue, worker): the wake-ups heard when its last claim came back short, and
        # when something changes by itself (due job), or None
        self._short_claims: dict[tuple[str, str], tuple[int, float | None]] = {}

    @property
    def pool(self) -> Pool:
        """The connection pool (for the application's own SQL; open while the storage is)."""
        if self._pool is None:
            raise RuntimeError("PostgresStorage is not open: use `async with storage:`")
        return self._pool

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise RuntimeError("PostgresStorage is not open: use `async with storage:`")
        return self._hub

    async def _connect(self) -> None:
        setup = () if self.synchronous_commit else ("SET synchronous_commit = off",)
        pool = Pool(
            self.url,
            size=self._pool_size,
            reconnect_timeout=self._reconnect_timeout,
            setup=setup,
            prepare=self.prepared_statements,
        )
        try:
            # the first connection: a server that is not there is reported at once (no retry)
            async with pool.connection() as conn:
                if self.auto_migrate:
                    await migrate(conn, self.schema)
        except BaseException:
            await pool.aclose()
            raise
        self._pool = pool
        self._hub = Hub(pool, self.call_timeout, ping_interval=max(self.poll_interval, 0.1))
        self._wakes_heard.clear()  # (their listeners were the old hub's)
        self._short_claims.clear()

    async def _disconnect(self) -> None:
        if self._hub is not None:
            self._hub.close()
        if self._pool is not None:
            await self._pool.aclose()
        self._pool = self._hub = None

    # -- channels and events ------------------------------------------------------------

    @staticmethod
    def nonce() -> str:
        """A unique prefix for the ``n`` field of payloads built in SQL (PostgreSQL drops a
        NOTIFY identical to one already sent in the same transaction)."""
        return f"{_PROCESS}.{next(_nonce)}"

    def channel(self, queue: str, kind: str) -> str:
        """The NOTIFY channel of ``queue``: ``e`` (events), ``n`` (notice kinds), ``w``
        (wake-ups of claims)."""
        return _channel(self.schema, queue, kind)

    def _notifications(self, queue: str, events: Sequence[StorageEvent], wake: bool) -> list[tuple[str, str]]:
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
            if queue in self._wakes_heard:  # (before the commit: a claim may run early, never late)
                self._wakes_heard[queue] += 1
        return out

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
        pairs = self._notifications(queue, events, wake)
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
        async with self.pool.connection(deadline=self.call_deadline()) as conn:
            await conn.execute("BEGIN")
            try:
                if queue is not None and queue not in self._known_queues:
                    await conn.execute(self._sql["queue_row"], queue)
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
                self._known_queues.add(queue)

    @asynccontextmanager
    async def conn(self) -> AsyncIterator[Connection]:
        """A pooled connection for a read (autocommit)."""
        async with self.pool.connection(deadline=self.call_deadline()) as conn:
            yield conn

    def call_deadline(self) -> float:
        """The Trio time by which a storage call starting now must be done."""
        return trio.current_time() + self.call_timeout

    @contextmanager
    def bounded(self, conn: Connection) -> Iterator[Connection]:
        """The block's statements on ``conn`` (the application's transaction) bounded
        by :attr:`call_timeout` (a :class:`CallTimeout` discards the connection)."""
        before = conn.deadline
        conn.deadline = min(before, self.call_deadline())
        try:
            yield conn
        finally:
            conn.deadline = before
