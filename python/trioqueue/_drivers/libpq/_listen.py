"""LISTEN/NOTIFY for PostgresStorage: one listening connection per storage, read by
whoever waits.

There is no background task of the storage's own: a task that waits for notifications
(a blocked claim, a subscription's pump) takes the *reader* role if nobody has it,
reads the connection and dispatches what arrives to every registered callback, and
hands the role over when its own wait ends (the next waiter takes it). Registering a
new channel interrupts the reader (its wait for notifications is cancel-safe), runs
``LISTEN`` and lets it carry on, so a registration is in force when :meth:`Hub.listen`
returns.

A lost connection is reopened with the pool's backoff, every channel is listened to
again, and every callback receives ``None``: notifications may have been missed
(subscribers turn it into a ``resync`` event, claims re-check the table). A reader that
hears nothing for ``ping_interval`` seconds sends ``SELECT 1`` (bounded by ``timeout``):
a connection that died without a word (a black-holed network) is found out and reopened,
instead of being listened to forever.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ._conn import Connection, Notification
from ._errors import CallTimeout, ConnectionLost
from ._pool import Pool

__all__ = ["Hub"]

Callback = Callable[[Notification | None], None]


class _Parked:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = trio.Event()


class Hub:
    """The storage's listening connection and the callbacks of each channel."""

    def __init__(self, pool: Pool, timeout: float = math.inf, ping_interval: float = math.inf) -> None:
        self._pool = pool
        self._timeout = timeout  # bounds each LISTEN and ping (a server that does not answer)
        self._ping_interval = ping_interval  # a reader hearing nothing that long pings the server
        self._conn: Connection | None = None
        self._callbacks: dict[str, list[Callback]] = {}
        self._listening: set[str] = set()
        self._admin = trio.Lock()  # connect, LISTEN: one at a time
        self._reader: object | None = None
        self._reader_scope: trio.CancelScope | None = None
        self._parked: set[_Parked] = set()
        self._closed = False
        self._missed = False  # the connection was lost: callbacks get None once it is back

    async def listen(self, channel: str, callback: Callback) -> None:
        """Call ``callback`` with every notification on ``channel`` from now on (until
        :meth:`unlisten`). Cancellation: the registration may or may not be in force."""
        self._callbacks.setdefault(channel, []).append(callback)
        if channel in self._listening:
            return
        async with self._admin:
            if channel in self._listening:
                return
            while True:
                conn = await self._connection()
                if self._reader_scope is not None:
                    self._reader_scope.cancel()  # the reader lets go of the connection
                try:
                    await self._listen(conn, channel)
                except CallTimeout:
                    raise  # (the connection is discarded: the next caller reconnects)
                except ConnectionLost:
                    continue  # reconnected (and re-listened) by _connection()
                self._listening.add(channel)
                return

    def unlisten(self, channel: str, callback: Callback) -> None:
        """Stop calling ``callback`` (the channel stays listened to: cheap, and reused)."""
        callbacks = self._callbacks.get(channel)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)

    async def _connection(self) -> Connection:
        """The listening connection, (re)opened if needed (with the pool's backoff); after
        a reconnect every callback gets ``None``. Called with ``_admin`` held."""
        if self._closed:
            raise ConnectionLost("the storage is closed", sqlstate="08003")
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._conn is not None:
            self._missed = True  # (kept across failed reconnects: the resync is owed)
        self._conn = None
        conn: Connection | None = None
        with trio.move_on_after(self._timeout):
            conn = await self._pool.open_connection()
        if conn is None:
            raise CallTimeout("cannot connect in time (to listen for notifications)")
        try:
            for channel in sorted(self._listening):
                await self._listen(conn, channel)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        if self._missed:
            self._missed = False
            self._dispatch(None)
        return conn

    async def _listen(self, conn: Connection, channel: str) -> None:
        await self._bounded(conn, f'LISTEN "{channel}"')

    async def _ping(self, conn: Connection) -> None:
        await self._bounded(conn, "SELECT 1")

    async def _bounded(self, conn: Connection, sql: str) -> None:
        conn.deadline = trio.current_time() + self._timeout
        try:
            await conn.execute(sql)
        finally:
            conn.deadline = math.inf

    def _dispatch(self, notes: list[Notification] | None) -> None:
        if notes is None:  # once per callback, however many channels it listens to
            for cb in dict.fromkeys(cb for callbacks in list(self._callbacks.values()) for cb in callbacks):
                cb(None)
            return
        for note in notes:
            for cb in list(self._callbacks.get(note.channel, ())):
                cb(note)

    async def wait(self, done: Callable[[], bool], timeout: float = math.inf) -> None:
        """Return when ``done()`` is true (checked after each batch of notifications) or
        after ``timeout`` seconds, reading the connection meanwhile if no one else does.
        Cancellation: safe at any point."""
        with trio.move_on_after(timeout):
            while not done() and not self._closed:
                if self._reader is None:
                    await self._read_until(done)
                else:
                    parked = _Parked()
                    self._parked.add(parked)
                    try:
                        await parked.event.wait()
                    finally:
                        self._parked.discard(parked)

    def poke(self) -> None:
        """Wake every parked waiter (a callback made some ``done()`` true)."""
        for parked in list(self._parked):
            parked.event.set()

    async def _read_until(self, done: Callable[[], bool]) -> None:
        me = self._reader = object()
        try:
            while not done() and not self._closed:
                with trio.CancelScope() as scope:
                    self._reader_scope = scope
                    async with self._admin:
                        if self._closed:
                            break
                        try:
                            conn = await self._connection()
                        except ConnectionLost:
                            continue  # unreachable for now (each attempt backs off): try again
                    try:
                        notes = None
                        with trio.move_on_after(self._ping_interval):
                            notes = await conn.notifications()
                        if notes is None:  # quiet for a while: does the server still answer?
                            await self._ping(conn)  # (a dead or black-holed one: CallTimeout)
                            continue
                    except ConnectionLost:
                        continue  # (reopened by _connection(); closed storage: the loop ends)
                    self._dispatch(notes)
                    self.poke()
                self._reader_scope = None
                if scope.cancelled_caught:
                    await trio.lowlevel.checkpoint()  # let the LISTEN have the connection
        finally:
            if self._reader is me:
                self._reader = None
                self._reader_scope = None
            self.poke()  # someone else takes over the reading

    def close(self) -> None:
        """Close the listening connection; waits for notifications end (their callers
        find the storage closed on their next call)."""
        self._closed = True
        if self._conn is not None:
            self._conn.close()
        self.poke()
