"""A Trio-native PostgreSQL connection over libpq (``psycopg.pq``), with no thread per query.

psycopg's own async API runs on asyncio only; its public libpq wrapper ``psycopg.pq`` can
be driven from any event loop. This module uses libpq's non-blocking calls
(``PQconnectStart``/``PQconnectPoll``, ``PQsendQueryParams``, ``PQflush``,
``PQconsumeInput``, ``PQisBusy``, ``PQgetResult``) and waits on the connection's socket
with :func:`trio.lowlevel.wait_readable` / :func:`trio.lowlevel.wait_writable`. Values
are converted by psycopg's adapters (:class:`psycopg.adapt.Transformer`), so parameters
are typed as psycopg types them (``int``, ``str``, ``bytes``, ``float``, ``bool``,
``None``, lists, ``datetime``, ...), results come back as Python values; lists of
``str``, ``bytes`` or ``float`` go as binary arrays encoded by :mod:`._arrays`.

Host names are resolved with :func:`trio.socket.getaddrinfo` before ``PQconnectStart``
(which would otherwise resolve them with a blocking call) and passed as ``hostaddr``.
"""

from __future__ import annotations

import collections
import itertools
import math
import select
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self

import trio
from psycopg import OperationalError, pq
from psycopg.adapt import PyFormat
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ._arrays import encode_arrays, transformer
from ._errors import CallTimeout, ConnectionLost, PostgresError, error_for

__all__ = ["Connection", "Notification", "Result", "resolve_conninfo"]

_DIAG = pq.DiagnosticField
_PREPARE_AFTER = 2  # a statement with parameters run this often on a connection is prepared
_PREPARED_MAX = 256  # at most this many prepared statements per connection (then: unnamed)
_SEEN_MAX = 1024
# A statement with a longer array parameter (a batch) runs unprepared, planned for its
# size: the generic plan of a settlement, fitted to a few rows, ran a batch of 100 in
# twice the time (the parse it saves is small beside such a batch's work anyway).
_PREPARED_ARRAY_MAX = 8
_CANCEL_TIMEOUT = 5.0
_LATE_CANCEL_TIMEOUT = 1.0  # the cancel request sent when a statement outlives its deadline


@dataclass(frozen=True, slots=True)
class Notification:
    """A ``NOTIFY`` received on a connection that ran ``LISTEN channel``."""

    channel: str
    payload: str
    pid: int


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one statement: its rows (tuples of Python values), column names,
    command tag (``b"UPDATE 3"`` as ``"UPDATE 3"``) and affected/returned row count."""

    rows: list[tuple[Any, ...]]
    columns: list[str]
    status: str
    rowcount: int


async def resolve_conninfo(conninfo: str) -> str:
    """``conninfo`` (a URL or ``key=value`` string) with its host names resolved through
    Trio into ``hostaddr`` (one entry per address, host names kept for TLS and
    ``.pgpass``). Unix-socket directories and numeric addresses pass through."""
    params = conninfo_to_dict(conninfo)
    host = params.get("host")
    if not host or params.get("hostaddr"):
        return make_conninfo("", **params)
    ports = str(params.get("port") or "5432").split(",")
    hosts, addrs, out_ports = [], [], []
    for i, name in enumerate(str(host).split(",")):
        port = ports[i] if len(ports) > 1 else ports[0]
        if name.startswith(("/", "@")):
            hosts.append(name)
            addrs.append("")
            out_ports.append(port)
            continue
        infos = await trio.socket.getaddrinfo(name, int(port or 5432), type=trio.socket.SOCK_STREAM)
        for info in dict.fromkeys(str(info[4][0]) for info in infos):
            hosts.append(name)
            addrs.append(info)
            out_ports.append(port)
    params.update(host=",".join(hosts), hostaddr=",".join(addrs), port=",".join(out_ports))
    return make_conninfo("", **params)


# Refusals that no retry cures (libpq reports a failed connect as text only): a wrong
# password, an unknown role or database. Everything else (refused, reset, timed out, the
# server starting or shutting down) may pass, and is ConnectionLost.
_PERMANENT = (
    ("password authentication failed", "28P01"),
    ("no pg_hba.conf entry", "28000"),
    ("role \"", "28000"),
    ("database \"", "3D000"),
)


def _where(conninfo: str) -> str:
    """The server(s) ``conninfo`` names, for messages: ``host:port`` (several: joined by
    commas; a Unix-socket directory: its socket file)."""
    try:
        params = conninfo_to_dict(conninfo)
    except Exception:  # noqa: BLE001 - libpq reports a malformed conninfo itself
        return "?"
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "5432").split(",")
    out = []
    for i, host in enumerate(hosts):
        port = (ports[i] if len(ports) > 1 else ports[0]) or "5432"
        if not host or host.startswith(("/", "@")):
            out.append(f"{host or 'the default socket directory'}/.s.PGSQL.{port}")
        else:
            out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return ", ".join(out)


def _connect_error(where: str, message: str) -> PostgresError:
    # libpq: 'connection to server at "h" (addr), port p failed: why\n\thint' once per address tried
    reasons: list[str] = []
    for line in message.strip().splitlines():
        line = line.strip()
        if not line:
            continue
        _, sep, why = line.partition(" failed: ")
        text = why if sep else line
        if len(text) > 1 and text[0].isupper() and text[1].islower():  # "Connection refused"
            text = text[0].lower() + text[1:]
        if text and text not in reasons:
            reasons.append(text)
    text = f"cannot connect to PostgreSQL at {where}: {'; '.join(reasons) or 'unknown error'}"
    if "does not exist" in message or "authentication failed" in message or "pg_hba.conf" in message:
        for needle, sqlstate in _PERMANENT:
            if needle in message:
                return PostgresError(text, sqlstate=sqlstate)
    return ConnectionLost(text, sqlstate="08001")


def _format(value: Any) -> PyFormat:
    # Lists of bytes go in binary: psycopg's text dumper for bytea arrays, used without a
    # psycopg connection, escapes quotes for a SQL literal (it's -> it''s).
    if isinstance(value, list) and any(isinstance(v, (bytes, bytearray, memoryview)) for v in value):
        return PyFormat.BINARY
    return PyFormat.AUTO


class Connection:
    """One PostgreSQL session. Open with ``await Connection.connect(url)`` and close with
    :meth:`aclose` (or ``async with``). One statement at a time: concurrent calls on one
    connection queue up (FIFO); use a :class:`~._pool.Pool` to run
    statements in parallel.

    Cancellation: a Trio cancellation while a statement runs sends libpq's cancel request
    to the server, waits (shielded, up to 5 s) for the statement to end, and leaves the
    connection usable (an open transaction is left in the failed state, to be rolled
    back); if the cancel cannot be completed the connection is closed. A cancelled
    :meth:`connect` leaves nothing open.

    :attr:`deadline` (a :func:`trio.current_time` value, ``math.inf`` by default) bounds
    every statement: one still unanswered then is abandoned: a cancel request is sent
    (best effort, up to 1 s), the connection is closed and :class:`CallTimeout` raised.
    A server that stops answering (stopped, a black-holed network) costs the caller the
    time to its deadline, not forever.
    """

    def __init__(self, pgconn: pq.abc.PGconn) -> None:
        self._pgconn = pgconn
        self._fd = pgconn.socket
        self._lock = trio.StrictFIFOLock()
        self._tx = transformer()
        self._notifies: collections.deque[Notification] = collections.deque()
        self._closed = False
        #: statements unanswered at this Trio time are abandoned (:class:`CallTimeout`)
        self.deadline = math.inf
        #: prepare the statements run again and again (False: never, e.g. behind a pooler
        #: that does not keep protocol-level prepared statements)
        self.prepare = True
        self._seen: dict[tuple[str, tuple[int, ...]], int] = {}
        self._prepared: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self._names = itertools.count()

    # -- lifecycle --------------------------------------------------------------------

    @classmethod
    async def connect(cls, conninfo: str, *, timeout: float = 5.0) -> Self:
        """Connect to ``conninfo`` (``postgresql://...`` or ``key=value``), waiting at most
        ``timeout`` seconds, the host names' resolution included (:class:`ConnectionLost`
        then, or on any failure; :class:`PostgresError` for a refusal no retry cures: a
        wrong password, an unknown role or database). The message names the server
        (``cannot connect to PostgreSQL at host:port: why``)."""
        where = _where(conninfo)
        pgconn = None
        try:
            with trio.move_on_after(timeout) as scope:
                try:
                    resolved = await resolve_conninfo(conninfo)
                except OSError as exc:  # socket.gaierror: an unknown host
                    raise ConnectionLost(
                        f"cannot connect to PostgreSQL at {where}: cannot resolve the host name ({exc.strerror or exc})",
                        sqlstate="08001",
                    ) from None
                pgconn = pq.PGconn.connect_start(resolved.encode())
                while True:
                    status = pgconn.connect_poll()
                    if status == pq.PollingStatus.OK:
                        break
                    if status == pq.PollingStatus.FAILED:
                        raise _connect_error(where, pgconn.get_error_message())
                    if status == pq.PollingStatus.READING:
                        await trio.lowlevel.wait_readable(pgconn.socket)
                    else:
                        await trio.lowlevel.wait_writable(pgconn.socket)
            if scope.cancelled_caught or pgconn is None:
                raise ConnectionLost(f"cannot connect to PostgreSQL at {where} within {timeout:g} s", sqlstate="08001")
            pgconn.nonblocking = 1
        except BaseException:
            if pgconn is not None:
                pgconn.finish()
            raise
        return cls(pgconn)

    @property
    def closed(self) -> bool:
        """True once the connection is closed or found broken."""
        return self._closed or self._pgconn.status != pq.ConnStatus.OK

    @property
    def backend_pid(self) -> int:
        """The server process id of this session (for ``pg_terminate_backend`` & co)."""
        return self._pgconn.backend_pid

    @property
    def in_transaction(self) -> bool:
        """True inside a transaction block (also a failed one)."""
        return self._pgconn.transaction_status not in (pq.TransactionStatus.IDLE, pq.TransactionStatus.UNKNOWN)

    def check_alive(self) -> bool:
        """Whether an idle connection is still usable, without a round trip: input
        waiting on an idle session is read (a server that ended the session has sent
        its error and closed the socket); a broken connection is closed. Synchronous."""
        if self.closed:
            self.close()
            return False
        if self._lock.locked():
            return True
        for _ in range(4):  # the server's goodbye message, then the end of the stream
            readable, _, _ = select.select([self._fd], [], [], 0)
            if not readable:
                break
            try:
                self._consume()
                self._pgconn.is_busy()  # (parses what arrived)
            except ConnectionLost:
                return False
            if self._pgconn.status != pq.ConnStatus.OK:
                self.close()
                return False
        return True

    def close(self) -> None:
        """Close at once (synchronous, never blocks). Idempotent."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self._fd)
        self._pgconn.finish()

    async def aclose(self) -> None:
        """Close the connection (a checkpoint; the session ends on the server)."""
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- statements -------------------------------------------------------------------

    async def execute(self, sql: str, *params: Any) -> Result:
        """Run one statement with ``$1, $2, ...`` parameters (extended protocol, so one
        statement only) and return its :class:`Result`. Server errors raise
        :class:`PostgresError` (or its subclass for the SQLSTATE); a broken connection
        :class:`ConnectionLost`."""
        key = None
        async with self._locked():
            self._check_open()
            if params:
                batch = any(isinstance(p, list) and len(p) > _PREPARED_ARRAY_MAX for p in params)
                params = encode_arrays(params)
                values = self._tx.dump_sequence(params, [_format(p) for p in params])
                types, formats = self._tx.types, self._tx.formats
                key = (sql, tuple(types or ()))
                name = None
                if not batch:
                    name = self._prepared.get(key) or (await self._prepare(key) if self._due(key) else None)
                if name is not None:
                    self._pgconn.send_query_prepared(name, values, formats, pq.Format.BINARY)
                else:
                    self._pgconn.send_query_params(sql.encode(), values, types, formats, pq.Format.BINARY)
            else:
                self._pgconn.send_query_params(sql.encode(), None, result_format=pq.Format.BINARY)
            results = await self._wait_results()
        try:
            return self._convert(results[-1])
        except PostgresError as exc:
            if exc.sqlstate == "0A000" and key is not None:  # "cached plan must not change result type"
                self._prepared.pop(key, None)  # (after DDL: prepared anew)
            raise

    def _due(self, key: tuple[str, tuple[int, ...]]) -> bool:
        """Whether to prepare the statement ``key`` now: the second time it runs (the
        server parses and plans a prepared statement once, not at every run)."""
        if not self.prepare or len(self._prepared) >= _PREPARED_MAX:
            return False
        seen = self._seen.get(key, 0) + 1
        if seen >= _PREPARE_AFTER:
            self._seen.pop(key, None)
            return True
        if len(self._seen) < _SEEN_MAX:
            self._seen[key] = seen
        return False

    async def _prepare(self, key: tuple[str, tuple[int, ...]]) -> bytes:
        """Prepare ``key`` (a round trip of its own, once); a name is never reused (a
        cancelled prepare may or may not exist on the server)."""
        name = b"tq_%d" % next(self._names)
        self._pgconn.send_prepare(name, key[0].encode(), key[1])
        for res in await self._wait_results():
            self._raise_for(res)
        self._prepared[key] = name
        return name

    async def execute_script(self, sql: str) -> None:
        """Run several ``;``-separated statements without parameters (simple protocol),
        e.g. DDL. Stops at the first error, which is raised."""
        async with self._locked():
            self._check_open()
            self._pgconn.send_query(sql.encode())
            results = await self._wait_results()
        for res in results:
            self._raise_for(res)

    async def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """The rows of :meth:`execute`."""
        return (await self.execute(sql, *params)).rows

    async def fetchrow(self, sql: str, *params: Any) -> tuple[Any, ...] | None:
        """The first row, or ``None``."""
        rows = (await self.execute(sql, *params)).rows
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *params: Any) -> Any:
        """The first column of the first row, or ``None``."""
        rows = (await self.execute(sql, *params)).rows
        return rows[0][0] if rows else None

    # -- notifications ----------------------------------------------------------------

    async def notifications(self) -> list[Notification]:
        """Wait for (at least one) notification of the channels this session listens to
        (``await conn.execute('LISTEN "channel"')``) and return those received, in order.
        Notifications that arrived during other statements are returned first, at once.
        Cancellation: safe at any point (nothing is lost; the next call returns them)."""
        async with self._lock:
            self._check_open()
            while not self._notifies:
                await self._wait(readable=True)
                self._consume()
            out = list(self._notifies)
            self._notifies.clear()
            return out

    # -- internals --------------------------------------------------------------------

    @asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        # uncontended: take the lock without the two scheduler passes of ``acquire`` (the
        # statement's own socket wait is the checkpoint); contended: queue up FIFO
        if self._lock.locked() or self._lock.statistics().tasks_waiting:
            await self._lock.acquire()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._lock.acquire_nowait()
        try:
            yield
        finally:
            self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionLost("the connection is closed", sqlstate="08003")
        if self._pgconn.status != pq.ConnStatus.OK:
            self.close()
            raise ConnectionLost("the connection is broken", sqlstate="08006")

    def _lost(self, exc: BaseException | None = None) -> ConnectionLost:
        message = self._pgconn.get_error_message() if not self._closed else ""
        self.close()
        return ConnectionLost(f"connection lost: {message or exc or 'server closed the connection'}", sqlstate="08006")

    async def _wait(self, *, readable: bool) -> None:
        try:
            if readable:
                await trio.lowlevel.wait_readable(self._fd)
            else:
                await trio.lowlevel.wait_writable(self._fd)
        except trio.ClosedResourceError as exc:
            raise self._lost(exc) from None

    def _consume(self) -> None:
        try:
            self._pgconn.consume_input()
        except OperationalError as exc:
            raise self._lost(exc) from None
        while (n := self._pgconn.notifies()) is not None:
            self._notifies.append(Notification(n.relname.decode(), n.extra.decode(), n.be_pid))

    async def _wait_results(self) -> list[pq.abc.PGresult]:
        """Flush the sent statement and collect its results; on cancellation, cancel it on
        the server and drain (shielded), closing the connection if that fails; past
        :attr:`deadline`, send a cancel request and close the connection."""
        with trio.CancelScope(deadline=self.deadline) as timer:
            try:
                while True:
                    try:
                        pending = self._pgconn.flush()
                    except OperationalError as exc:
                        raise self._lost(exc) from None
                    if not pending:
                        break
                    await self._wait(readable=False)
                return await self._collect()
            except trio.Cancelled:
                if not timer.cancel_called:
                    with trio.CancelScope(shield=True):
                        await self._cancel_and_drain()
                raise
        # the deadline passed (the scope caught its own cancellation): give up on the server
        with trio.CancelScope(shield=True):
            try:
                await self._send_cancel(_LATE_CANCEL_TIMEOUT)
            except (trio.TooSlowError, PostgresError, OperationalError):
                pass  # (best effort: a server that does not answer ignores it anyway)
        self.close()
        raise CallTimeout("the server did not answer in time: the connection was discarded")

    async def _send_cancel(self, timeout: float) -> None:
        """Send libpq's cancel request for the statement in flight (at most ``timeout``
        seconds); raises :class:`ConnectionLost` (or ``trio.TooSlowError``) if it could not."""
        with trio.fail_after(timeout):
            cancel = self._pgconn.cancel_conn()
            try:
                cancel.start()
                while True:
                    status = cancel.poll()
                    if status == pq.PollingStatus.OK:
                        return
                    if status == pq.PollingStatus.FAILED:
                        raise ConnectionLost(cancel.get_error_message())
                    if status == pq.PollingStatus.READING:
                        await trio.lowlevel.wait_readable(cancel.socket)
                    else:
                        await trio.lowlevel.wait_writable(cancel.socket)
            finally:
                cancel.finish()

    async def _collect(self) -> list[pq.abc.PGresult]:
        results: list[pq.abc.PGresult] = []
        while True:
            while self._pgconn.is_busy():
                await self._wait(readable=True)
                self._consume()
            res = self._pgconn.get_result()
            if res is None:
                if self._pgconn.status != pq.ConnStatus.OK:
                    raise self._lost()
                return results
            if res.status == pq.ExecStatus.FATAL_ERROR and self._pgconn.status != pq.ConnStatus.OK:
                raise self._lost()
            results.append(res)

    async def _cancel_and_drain(self) -> None:
        if self._closed:
            return
        try:
            with trio.fail_after(_CANCEL_TIMEOUT):
                await self._send_cancel(_CANCEL_TIMEOUT)
                await self._collect()
        except (trio.TooSlowError, PostgresError, OperationalError):
            self.close()

    def _raise_for(self, res: pq.abc.PGresult) -> None:
        if res.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR, pq.ExecStatus.BAD_RESPONSE):

            def field(code: pq.DiagnosticField) -> str | None:
                value = res.error_field(code)
                return value.decode(errors="replace") if value is not None else None

            message = field(_DIAG.MESSAGE_PRIMARY) or res.get_error_message() or "unknown error"
            raise error_for(message, field(_DIAG.SQLSTATE), field(_DIAG.MESSAGE_DETAIL), field(_DIAG.MESSAGE_HINT))

    def _convert(self, res: pq.abc.PGresult) -> Result:
        self._raise_for(res)
        status = (res.command_status or b"").decode()
        rowcount = res.command_tuples
        if res.status != pq.ExecStatus.TUPLES_OK:
            return Result([], [], status, rowcount if rowcount is not None else -1)
        self._tx.set_pgresult(res)
        rows = self._tx.load_rows(0, res.ntuples, tuple)
        columns = [(res.fname(i) or b"").decode() for i in range(res.nfields)]
        return Result(rows, columns, status, res.ntuples)
