"""A lean Redis client for Trio: one connection, commands written as they come
(pipelined), replies matched to callers in order.

Why: an awaited valkey-glide command costs ~200 µs under Trio, most of it the client's
own machinery; a round trip on a plain Trio socket costs ~70 µs (measured in
``benches/bench_resp.py``). RedisStorage sends its ordinary commands and scripts through
this client on a standalone server (plain or TLS); blocking claims, pub/sub and Cluster
stay on GLIDE.

The protocol (RESP2) is parsed and encoded by the Rust core (``RespReader``,
``encode_command``); this module is the I/O around it. The caller whose reply is
due reads the socket (leader/follower), parses whatever arrived and hands every other
caller its reply.

Timeouts: while a :meth:`RespClient.watchdog` runs (a running Queue keeps one in its
nursery), it ends a call unanswered past its timeout by breaking the connection, and
calls wait with no cancel scope of their own (a Trio cancel scope costs about as much as
the rest of a call's Python); without one, each call bounds its wait with a scope.

Cancellation: a cancelled call's reply is still read and dropped when it arrives, so the
connection never falls out of step; a write is never cut in the middle (shielded, bounded
by the request timeout: a write that cannot finish breaks the connection). A call made
with ``shield`` (a mutation) goes on waiting for its reply when cancelled, within that
bound. A broken connection fails every call waiting on it with :class:`ConnectionLost`;
the next call opens a new one.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..._core import ReplyError as _ReplyError
from ..._core import RespProtocolError, RespReader, encode_command
from ..._model._errors import StorageError
from ._transport import hello_role, is_readonly

__all__ = ["ConnectionLost", "ReplyError", "RespClient", "RespConnection", "Subscriber"]

ReplyError = _ReplyError


class ConnectionLost(Exception):
    """The connection broke (or timed out) before the reply came; the command may or
    may not have run."""


class _Call:
    __slots__ = ("done", "event", "value", "timeout", "age")

    def __init__(self, timeout: float | None) -> None:
        self.done = False
        self.value: Any = None
        self.event: trio.Event | None = None
        self.timeout = timeout  # set if the client's watchdog enforces it (no cancel scope)
        self.age = 0.0  # the watchdog's ticks since it first saw the call (seconds)


class _Watch:
    """How many watchdogs (:meth:`RespClient.watchdog`) run for a client's connection."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = 0


_RECV_SIZE = 256 * 1024
_NO_SCOPE = contextlib.nullcontext()


class RespConnection:
    """One open connection. :meth:`call` sends pre-encoded commands and returns their
    replies; calls from any number of tasks are pipelined."""

    def __init__(
        self, stream: trio.abc.Stream, timeout: float, sock: socket.socket | None = None, watch: _Watch | None = None
    ) -> None:
        self._stream = stream
        self._watch = watch
        # The plain TCP socket under ``stream``. A call made when the connection is quiet
        # (nothing in flight, and the last read brought a single reply: one caller at a
        # time, the latency case) sends and receives on it directly, which saves the
        # scheduler trips a SocketStream makes on every call (a third of a sequential
        # call's CPU). With calls in flight the stream is used: its yields let the commands
        # of the tasks that run meanwhile share one write.
        self._sock = sock
        self._last_read = 0  # replies the last read brought
        self._sent_now = False  # _send_now wrote and nobody has read since
        # _recv_now's buffer, made at its first read and kept: a recv() of _RECV_SIZE
        # bytes maps a fresh buffer, shrinks it and unmaps it on every reply (three
        # system calls for a 15-byte reply)
        self._rbuf: bytearray | None = None
        self._timeout = timeout
        self._reader = RespReader()
        self._pending: deque[_Call] = deque()
        self._wbuf = bytearray()
        self._writing = False
        self._reading = False
        self.broken: BaseException | None = None
        self.address: tuple[str, int] | None = None  # the server's, as connected to

    async def call(self, data: bytes, count: int = 1, timeout: float | None = None, *, shield: float | None = None) -> Any:
        """Send ``data`` (``count`` encoded commands) and return the reply (a list of
        ``count`` replies if ``count > 1``). Error replies are returned, not raised.
        ``timeout`` (default: the connection's) bounds the wait for the last reply; when
        it passes, the connection is broken and :class:`ConnectionLost` raised.
        ``shield`` (seconds): a call whose reply matters (a mutation) and that is
        cancelled while waiting goes on waiting for its reply, up to that long, and
        returns it (the cancellation is then delivered at the caller's next checkpoint),
        or raises the cancellation when the reply does not come in time."""
        timeout = self._timeout if timeout is None else timeout
        if self.broken is not None:
            raise ConnectionLost(str(self.broken))
        # With a watchdog running for this connection (a plain TCP one), the watchdog
        # enforces the timeout: the wait needs no cancel scope of its own (a scope costs
        # ~50k instructions, a fifth of a call's CPU).
        watch = self._watch
        watched = watch is not None and watch.active > 0 and timeout >= self._timeout and self._sock is not None
        calls = [_Call(timeout if watched else None) for _ in range(count)]
        self._pending.extend(calls)
        self._wbuf += data
        if not self._writing:
            if self._sock is not None and len(self._pending) == count and self._last_read <= count:
                self._send_now()
            else:
                await self._flush()
        last = calls[-1]
        try:
            if watched:
                await self._wait(last, count)
            else:
                # No scope of our own when an enclosing one ends first anyway.
                deadline = trio.current_time() + timeout
                with _NO_SCOPE if trio.current_effective_deadline() <= deadline else trio.CancelScope(deadline=deadline):
                    await self._wait(last, count)
        except trio.Cancelled:
            if shield is None:
                self._abandon(last)
                raise
            # The reply matters: wait for it after all (shielded only now that a
            # cancellation came: a scope on every call would cost what the wait does).
            with trio.CancelScope(shield=True, deadline=trio.current_time() + shield):
                await self._wait(last, count)
            if not last.done:
                self._abandon(last)
                raise
        if not last.done:
            self._abandon(last)
            self._break(ConnectionLost(f"no reply within {timeout:g} s"))
        if isinstance(last.value, ConnectionLost):
            raise last.value
        return last.value if count == 1 else [c.value for c in calls]

    async def _wait(self, last: _Call, count: int) -> None:
        """Until ``last`` (the last of ``count`` calls sent together) is answered: read the
        socket, or wait for the reader to."""
        while not last.done:
            if not self._reading:
                self._reading = True
                try:
                    await self._read_until(last, count)
                finally:
                    self._reading = False
                    self._hand_over_reading()
            else:
                last.event = trio.Event()
                await last.event.wait()

    def _abandon(self, last: _Call) -> None:
        """The caller of ``last`` stops waiting (cancelled or timed out): it is never
        picked to read again, and if the reading turn was just handed to it, it passes
        the turn on. Its reply is still read and dropped when it comes."""
        last.event = None
        if not self._reading:
            self._hand_over_reading()

    def age_calls(self, tick: float) -> None:
        """One tick of the watchdog: a watched call unanswered for longer than its
        timeout (at least the timeout, at most two ticks more) breaks the connection,
        which fails every call waiting on it with :class:`ConnectionLost`."""
        for c in self._pending:
            if c.timeout is not None:
                c.age += tick
                if c.age >= c.timeout + tick:
                    self._break(ConnectionLost(f"no reply within {c.timeout:g} s"))
                    if self._sock is not None:
                        trio.lowlevel.notify_closing(self._sock)  # wakes the reader
                    return

    def _send_now(self) -> None:
        """Write the buffer straight on the socket; what the kernel did not take is left
        for :meth:`_flush` (there is no writer when this runs)."""
        assert self._sock is not None
        try:
            sent = self._sock.send(self._wbuf)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._break(ConnectionLost(f"connection lost: {exc}"))
            return
        del self._wbuf[:sent]
        self._sent_now = True

    async def _flush(self) -> None:
        self._writing = True
        try:
            # a send_all cut short by a cancellation would leave half a command on the
            # wire: shielded, but bounded
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self._timeout) as scope:
                # send_all yields after each write: the commands of the tasks that run
                # meanwhile share the next one
                while self._wbuf and self.broken is None:
                    chunk = bytes(self._wbuf)
                    self._wbuf.clear()
                    await self._stream.send_all(chunk)
            if scope.cancelled_caught:
                self._break(ConnectionLost(f"could not send within {self._timeout:g} s"))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._break(ConnectionLost(f"connection lost: {exc}"))
        finally:
            self._writing = False

    async def _read_until(self, call: _Call, count: int = 1) -> None:
        while not call.done:
            try:
                if self._wbuf and not self._writing:
                    await self._flush()  # what _send_now left
                data: bytes | bytearray
                if self._sock is not None and len(self._pending) <= count:
                    data = await self._recv_now()  # only our calls are pending
                else:
                    data = await self._stream.receive_some(_RECV_SIZE)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._break(ConnectionLost(f"connection lost: {exc}"))
                return
            if not data:
                self._break(ConnectionLost("connection closed by the server"))
                return
            self._reader.feed(data)
            try:
                replies = self._reader.pop_all()
            except RespProtocolError as exc:
                self._break(ConnectionLost(str(exc)))
                return
            self._last_read = len(replies)
            pending = self._pending
            for value in replies:
                if not pending:
                    self._break(ConnectionLost("a reply nobody asked for"))
                    return
                c = pending.popleft()
                c.value = value
                c.done = True
                if c.event is not None:
                    c.event.set()

    async def _recv_now(self) -> bytearray:
        """Receive on the socket directly: a call yields once, while it waits for its
        reply (and once more if the reply was there before it looked, so that every call
        is a schedule point)."""
        assert self._sock is not None
        waited = False
        if self._sent_now:
            # we have just sent: the reply cannot be there yet, so wait before looking
            # (a recv now would only fail with EAGAIN: a syscall and an exception)
            self._sent_now = False
            await trio.lowlevel.wait_readable(self._sock)
            waited = True
        buf = self._rbuf
        if buf is None:
            buf = self._rbuf = bytearray(_RECV_SIZE)
        while True:
            try:
                n = self._sock.recv_into(buf)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._sock)
                waited = True
                continue
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return buf[:n]

    def _hand_over_reading(self) -> None:
        """Wake the oldest caller still waiting, to read in our place."""
        for c in self._pending:
            if c.event is not None and not c.done and not c.event.is_set():
                c.event.set()
                return

    def _break(self, exc: ConnectionLost) -> None:
        if self.broken is None:
            self.broken = exc
        pending, self._pending = self._pending, deque()
        for c in pending:
            c.value = exc
            c.done = True
            if c.event is not None:
                c.event.set()

    async def send(self, data: bytes) -> None:
        """Send ``data`` expecting no reply (a subscriber's ``SUBSCRIBE``: what comes back
        is read with :meth:`receive_pushes`)."""
        if self.broken is not None:
            raise ConnectionLost(str(self.broken))
        self._wbuf += data
        if not self._writing:
            await self._flush()
        if self.broken is not None:
            raise ConnectionLost(str(self.broken))

    async def receive_pushes(self) -> list[Any]:
        """For a connection in subscriber mode (after ``SUBSCRIBE``, with no call
        pending): wait for the next bytes and return the messages they complete (maybe
        none). Raises :class:`ConnectionLost` when the connection breaks."""
        if self.broken is not None:
            raise ConnectionLost(str(self.broken))
        try:
            data = await (self._recv_now() if self._sock is not None else self._stream.receive_some(_RECV_SIZE))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._break(ConnectionLost(f"connection lost: {exc}"))
            raise ConnectionLost(str(self.broken)) from exc
        if not data:
            self._break(ConnectionLost("connection closed by the server"))
            raise ConnectionLost(str(self.broken))
        self._reader.feed(data)
        try:
            return self._reader.pop_all()
        except RespProtocolError as exc:
            self._break(ConnectionLost(str(exc)))
            raise ConnectionLost(str(exc)) from exc

    async def aclose(self) -> None:
        self._break(ConnectionLost("connection closed"))
        with trio.CancelScope(shield=True):
            try:
                await self._stream.aclose()
            except (OSError, trio.BrokenResourceError):
                pass


def _stdlib_socket(stream: trio.SocketStream) -> socket.socket | None:
    """The stdlib socket under a Trio stream, or None if this Trio hides it."""
    sock = getattr(stream.socket, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


class RespClient:
    """A connection to one standalone server, opened on first use and again after it
    broke. ``params`` is the storage's :class:`~._transport.ConnParams`.
    With ``sentinels`` (a :class:`~._sentinel.Sentinels`), the
    server is the primary they name, checked to say so at each connection; a ``READONLY``
    reply closes every connection to it (:meth:`primary_moved`)."""

    def __init__(self, params: Any, sentinels: Any = None) -> None:
        self.params = params
        self._sentinels = sentinels
        self._conn: RespConnection | None = None
        self._lock = trio.Lock()
        self._closed = False
        self._ssl: ssl.SSLContext | None = None
        self._watch = _Watch()
        self._conns: weakref.WeakSet[RespConnection] = weakref.WeakSet()  # every one opened (watchdog)

    async def execute(self, data: bytes, count: int = 1, *, shield: float | None = None) -> Any:
        """``RespConnection.call`` on the client's connection, opened first if there is
        none or it broke (shielded, bounded by ``shield``, when that is given)."""
        conn = self._conn
        if conn is None or conn.broken is not None:
            if shield is None:
                conn = await self._reconnect(conn)
            else:
                fresh: RespConnection | None = None
                with trio.CancelScope(shield=True, deadline=trio.current_time() + shield):
                    fresh = await self._reconnect(conn)
                if fresh is None:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    raise ConnectionLost(f"could not reconnect within {shield:g} s")
                conn = fresh
        reply = await conn.call(data, count, shield=shield)
        if self._sentinels is not None and is_readonly(reply):
            await self.primary_moved(conn.address)  # demoted: ask the sentinels again
        return reply

    async def primary_moved(self, old: tuple[str, int] | None, new: tuple[str, int] | None = None) -> None:
        """Sentinel mode: the primary is no longer ``old`` (it answered ``READONLY``, or the
        sentinels announced ``new``). Forget it and close every connection to it: their
        calls fail with :class:`ConnectionLost` (and are retried), subscribers subscribe
        again, and the next connection goes where the sentinels say."""
        if new is not None:
            self._sentinels.moved(new)
        else:
            self._sentinels.forget(old)
        for conn in list(self._conns):
            if conn.address == old and conn.broken is None:
                await conn.aclose()

    async def watchdog(self) -> None:
        """Enforce the request timeout of the calls on the client's connection while
        this runs (it never returns; cancel it). Meanwhile a call waits for its reply with
        no cancel scope of its own; without a watchdog each call bounds its wait itself.
        It ticks ten times per timeout: a call is ended at most two ticks past its timeout."""
        tick = self.params.request_timeout / 10
        self._watch.active += 1
        try:
            while True:
                await trio.sleep(tick)
                for conn in list(self._conns):  # the shared one and the dedicated ones
                    if conn.broken is None:
                        conn.age_calls(tick)
        finally:
            self._watch.active -= 1

    async def open_connection(self) -> RespConnection:
        """A new connection of its own (for a blocking command: close it to make the
        server drop what it is blocked on)."""
        if self._closed:
            raise StorageError("Redis client closed")
        return await self._open()

    async def open_connection_to(self, address: tuple[str, int]) -> RespConnection:
        """A new connection to ``address`` (not the client's server) with the client's
        parameters (credentials, TLS, database)."""
        return await self._open(address)

    async def _reconnect(self, old: RespConnection | None) -> RespConnection:
        async with self._lock:
            if self._closed:
                raise StorageError("Redis client closed")
            if self._conn is old or self._conn is None:
                if old is not None:
                    await old.aclose()
                self._conn = await self._open()
            return self._conn

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            p = self.params
            try:
                ctx = ssl.create_default_context(cafile=p.ca_certs)
            except OSError as exc:
                raise StorageError(f"cannot read ssl_ca_certs {p.ca_certs!r}: {exc}") from exc
            if p.insecure_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        return self._ssl

    async def _open(self, address: tuple[str, int] | None = None) -> RespConnection:
        p = self.params
        primary = address is None and self._sentinels is not None
        if address is None:
            address = await self._sentinels.primary() if primary else (p.host, p.port)
        host, port = address
        stream: trio.abc.Stream
        try:
            with trio.fail_after(p.connect_timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream = tcp
                sock = None if p.tls else _stdlib_socket(tcp)
                if p.tls:
                    stream = trio.SSLStream(tcp, self._ssl_context(), server_hostname=host)
                    await stream.do_handshake()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
            if primary:
                self._sentinels.forget(address)
            raise ConnectionLost(f"could not connect to {p.display(address)}: {exc!r}") from exc
        conn = RespConnection(stream, p.request_timeout, sock, self._watch)
        conn.address = address
        self._conns.add(conn)
        hello: list[list[Any]] = []
        if p.password is not None:
            hello.append(["AUTH", p.username, p.password] if p.username else ["AUTH", p.password])
        if p.db:
            hello.append(["SELECT", p.db])
        if p.client_name:
            hello.append(["CLIENT", "SETNAME", p.client_name])
        if primary:
            # the node the sentinels named must say it is the primary: in the middle of a
            # failover they may name one that is not yet, or no longer
            hello.append(["HELLO", "2"])
        if hello:
            data = b"".join(encode_command(c) for c in hello)
            try:
                replies = await conn.call(data, len(hello))
            except ConnectionLost:
                if primary:
                    self._sentinels.forget(address)
                raise
            replies = replies if len(hello) > 1 else [replies]
            for cmd, r in zip(hello, replies, strict=True):
                if isinstance(r, ReplyError):
                    await conn.aclose()
                    raise StorageError(f"Redis refused {cmd[0]}: {r}")
            if primary and (role := hello_role(replies[-1])) != "master":
                await conn.aclose()
                self._sentinels.forget(address)
                raise ConnectionLost(f"{p.display(address)} is not the primary (role {role})")
        return conn

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()


class Subscriber:
    """A connection subscribed to one pub/sub channel. :meth:`run` (a task of the
    subscriber's nursery) hands each message's payload to ``on_message`` and, when the
    connection breaks, opens and subscribes a new one (with backoff). Messages published
    while it was away are lost: :attr:`generation` changes with every new connection, for
    the owner to announce a ``resync``."""

    def __init__(self, client: RespClient, channel: str, on_message: Callable[[bytes], None]) -> None:
        self._client = client
        self._channel = channel
        self._on_message = on_message
        self._conn: RespConnection | None = None
        self.generation = 0

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.broken is None

    async def subscribe(self) -> None:
        """Open a connection and subscribe (returns once the server confirmed)."""
        conn = await self._client.open_connection()
        try:
            await conn.send(encode_command(("SUBSCRIBE", self._channel)))
            early: list[Any] = []
            with trio.move_on_after(self._client.params.request_timeout):
                while not early:
                    early = await conn.receive_pushes()
            reply = early[0] if early else None
            if isinstance(reply, ReplyError) or not (isinstance(reply, list) and reply[:1] == [b"subscribe"]):
                raise StorageError(f"could not subscribe to {self._channel!r}: {reply!r:.200}")
        except BaseException:
            await conn.aclose()
            raise
        old, self._conn = self._conn, conn
        self.generation += 1
        self._deliver(early[1:])  # messages that came in the confirmation's read
        if old is not None:
            await old.aclose()

    def _deliver(self, pushes: list[Any]) -> None:
        for push in pushes:
            # [b"message", channel, payload]; confirmations and pongs are skipped
            if isinstance(push, list) and len(push) == 3 and push[0] == b"message":
                self._on_message(push[2])

    async def run(self) -> None:
        """Deliver messages until cancelled; reconnect after a fault."""
        delay = 0.02
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None:
                try:
                    await self.subscribe()
                    delay = 0.02
                except (ConnectionLost, StorageError):
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.5)
                continue
            try:
                pushes = await conn.receive_pushes()
            except ConnectionLost:
                continue
            self._deliver(pushes)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()
