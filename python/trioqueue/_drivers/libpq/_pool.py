"""A small pool of Trio-native PostgreSQL connections, reconnecting with backoff."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Self

import trio

from ._conn import Connection, Result
from ._errors import CallTimeout, ConnectionLost

__all__ = ["Pool", "Transaction"]


class Transaction:
    """A transaction on one pooled connection (see :meth:`Pool.transaction`): the
    application's own SQL with ``$1, $2, ...`` parameters, on the same connection."""

    def __init__(self, conn: Connection, owner: object | None = None) -> None:
        self.connection = conn
        #: what made it (a PostgresStorage checks that a transaction is its own)
        self.owner = owner
        #: True until the transaction commits or rolls back
        self.active = True

    async def execute(self, sql: str, *params: Any) -> Result:
        """Run one statement in the transaction (see :meth:`Connection.execute`)."""
        return await self.connection.execute(sql, *params)

    async def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """The rows of one statement."""
        return await self.connection.fetch(sql, *params)

    async def fetchval(self, sql: str, *params: Any) -> Any:
        """The first column of the first row (or ``None``)."""
        return await self.connection.fetchval(sql, *params)


class Pool:
    """Up to ``size`` connections to ``conninfo``, opened on demand and reused.

    ``async with pool.connection() as conn`` lends one (waiting while all are lent). A
    connection found broken is dropped; a new one is opened with exponential backoff
    (``backoff_min`` doubling up to ``backoff_max`` seconds, with jitter) for up to
    ``reconnect_timeout`` seconds before :class:`ConnectionLost` is raised, so a server
    restart or a ``pg_terminate_backend`` costs the statement in flight (which raises
    ``ConnectionLost``), not the pool. Until a first connection succeeded, a failed
    connect raises at once (one attempt of at most ``connect_timeout`` seconds): a server
    that is not there, a mistyped host or port, is reported, not retried.

    A connection handed back inside a transaction (a statement failed or was cancelled
    inside ``BEGIN``) is rolled back first (shielded; closed if that fails).
    ``setup`` statements run on every new connection (``SET search_path ...``).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        size: int = 4,
        connect_timeout: float = 5.0,
        reconnect_timeout: float = 30.0,
        backoff_min: float = 0.05,
        backoff_max: float = 2.0,
        setup: tuple[str, ...] = (),
        prepare: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.conninfo = conninfo
        self.size = size
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.setup = setup
        self.prepare = prepare  # (Connection.prepare of every connection)
        self._idle: list[Connection] = []
        self._slots = trio.Semaphore(size)
        self._lent: set[Connection] = set()
        self._closed = False
        #: How many connections were opened (a reconnect counts): for tests and metrics.
        self.connects = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection (lent ones too: their statements fail)."""
        self._closed = True
        for conn in [*self._idle, *self._lent]:
            conn.close()
        self._idle.clear()
        await trio.lowlevel.checkpoint()

    async def open_connection(self) -> Connection:
        """A new connection (not pooled; the caller closes it), opened with the pool's
        backoff (once one connection succeeded; the first attempt's failure is raised).
        Cancellation: nothing is left open."""
        delay = self.backoff_min
        last: ConnectionLost | None = None
        with trio.move_on_after(self.reconnect_timeout):
            while True:
                try:
                    conn = await Connection.connect(self.conninfo, timeout=self.connect_timeout)
                except (ConnectionLost, OSError) as exc:
                    if self.connects == 0:
                        raise
                    last = exc if isinstance(exc, ConnectionLost) else ConnectionLost(f"cannot connect: {exc}")
                    await trio.sleep(delay * (0.5 + random.random() / 2))
                    delay = min(delay * 2, self.backoff_max)
                    continue
                conn.prepare = self.prepare
                try:
                    conn.deadline = trio.current_time() + self.connect_timeout
                    for statement in self.setup:
                        await conn.execute(statement)
                    conn.deadline = math.inf
                except BaseException:
                    conn.close()
                    raise
                self.connects += 1
                return conn
        why = last.message if last is not None else "cannot connect"
        raise ConnectionLost(f"{why} (for {self.reconnect_timeout:g} s)", sqlstate="08001")

    @asynccontextmanager
    async def connection(self, *, deadline: float = math.inf) -> AsyncIterator[Connection]:
        """Lend a connection for the block (see the class docstring). Cancellation: the
        wait for a free connection and the connect are cancellable; the connection goes
        back to the pool (or is closed) whatever happens in the block. ``deadline`` (a
        :func:`trio.current_time` value) bounds the wait for a connection, the connect
        and every statement of the block (:class:`CallTimeout` past it; a statement cut
        short discards its connection)."""
        if self._closed:
            raise ConnectionLost("the pool is closed", sqlstate="08003")
        # a free slot: taken without the scheduler pass of ``acquire`` (the block's first
        # statement waits on its socket: the checkpoint); none free: queue up FIFO
        await trio.lowlevel.checkpoint_if_cancelled()
        acquired = False
        try:
            self._slots.acquire_nowait()
            acquired = True
        except trio.WouldBlock:
            with trio.move_on_at(deadline):
                await self._slots.acquire()
                acquired = True
        if not acquired:
            raise CallTimeout("no connection of the pool came free in time")
        try:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if candidate.check_alive():  # (a terminated session is dropped here)
                    conn = candidate
                    break
            if conn is None:
                with trio.move_on_at(deadline):
                    conn = await self.open_connection()
                if conn is None:
                    raise CallTimeout("cannot connect in time")
            conn.deadline = deadline
            self._lent.add(conn)
            try:
                yield conn
            finally:
                self._lent.discard(conn)
                conn.deadline = math.inf
                await self._give_back(conn)
        finally:
            self._slots.release()

    async def _give_back(self, conn: Connection) -> None:
        if not conn.closed and conn.in_transaction:
            with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                try:
                    await conn.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the connection is dropped below
                    conn.close()
            if conn.in_transaction:
                conn.close()
        if conn.closed or self._closed:
            conn.close()
        else:
            self._idle.append(conn)

    @asynccontextmanager
    async def transaction(self, owner: object | None = None, *, timeout: float = math.inf) -> AsyncIterator[Transaction]:
        """``BEGIN`` on a pooled connection; ``COMMIT`` when the block ends normally,
        ``ROLLBACK`` when it raises (or is cancelled). A failed ``COMMIT`` raises (the
        transaction did not commit; :class:`ConnectionLost`: unknown). Cancellation: the
        ``COMMIT`` is shielded (once the block is done, its outcome stands). ``timeout``
        bounds getting the connection with its ``BEGIN``, and the ``COMMIT`` (or
        ``ROLLBACK``), not the block's own statements."""
        async with self.connection(deadline=trio.current_time() + timeout) as conn:
            await conn.execute("BEGIN")
            conn.deadline = math.inf
            tx = Transaction(conn, owner)
            try:
                yield tx
            except BaseException:
                tx.active = False
                with trio.CancelScope(shield=True):
                    if not conn.closed:
                        conn.deadline = trio.current_time() + timeout
                        try:
                            await conn.execute("ROLLBACK")
                        except Exception:  # noqa: BLE001 - dropped by the pool
                            conn.close()
                raise
            tx.active = False
            with trio.CancelScope(shield=True):
                conn.deadline = trio.current_time() + timeout
                await conn.execute("COMMIT")
