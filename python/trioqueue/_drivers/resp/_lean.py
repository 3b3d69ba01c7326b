"""The ``lean`` transport: the lean client of :mod:`._client` (one Trio socket for ordinary
commands and scripts, pipelined; a dedicated connection per blocking call; one per
subscription). The default on a standalone server (plain or TLS) and on a Sentinel
service (:mod:`._sentinel`); it needs no valkey-glide."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..._core import encode_command
from ..._model._errors import StorageError
from ._client import ConnectionLost, ReplyError, RespClient, RespConnection, Subscriber
from ._sentinel import Address, Sentinels
from ._transport import (
    Backoff,
    ConnParams,
    ReplicaAck,
    Script,
    ScriptPolicy,
    Subscription,
    Transport,
    diagnose,
    refuses_functions,
    retryable,
    shielded,
)

__all__ = ["LeanTransport"]

_PING = encode_command(("PING",))
_UNSENT = object()  # _retry_loop: no attempt made yet


class LeanTransport(Transport):
    """:class:`Transport` on the lean client (see the module docstring)."""

    def __init__(self, params: ConnParams, *, retry_timeout: float, on_fault: Callable[[], None]) -> None:
        super().__init__(params, retry_timeout=retry_timeout, on_fault=on_fault)
        self.sentinels = Sentinels(params) if params.sentinels else None
        self._client = RespClient(params, self.sentinels)
        self._idle: list[RespConnection] = []  # dedicated connections of completed blocking calls
        self._closed = False

    async def connect(self) -> None:
        """One ``PING`` outside the retry loop: a server that refuses, is unknown or
        unreachable, or does not answer (connect and request timeouts) is reported at
        once. An error reply (``LOADING``...) says it is there: that one is waited for."""
        self._closed = False
        self._client = RespClient(self.params, self.sentinels)
        try:
            if isinstance(await self._client.execute(_PING), ReplyError):
                await self._retry(_PING)
        except (ConnectionLost, StorageError) as exc:
            why = None if self.sentinels else await diagnose(self.params)
            if why is None:
                raise StorageError(f"could not connect to {self.params.display()}: {exc}") from exc
        else:
            return
        # the server is not there: the reason says all (the client's chain of causes held
        # an exception group of the connect attempts: a traceback of 60 lines for one fact)
        raise StorageError(f"could not connect to {self.params.display()}: {why}") from None

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()
        await self._client.aclose()

    async def watchdog(self) -> None:
        """The client's :meth:`RespClient.watchdog`: the request timeouts of its calls;
        on a Sentinel service, also the sentinels' ``+switch-master`` announcements."""
        if self.sentinels is None:
            await self._client.watchdog()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._client.watchdog)
            nursery.start_soon(self.sentinels.watch, self._switched)

    async def _switched(self, old: Address | None, new: Address) -> None:
        await self._client.primary_moved(old, new)
        self._on_fault()

    # -- commands ----------------------------------------------------------------------

    async def command(self, args: Sequence[str | bytes]) -> Any:
        return await self._retry(encode_command(args))

    async def commands(self, batch: Sequence[Sequence[str | bytes]]) -> list[Any]:
        data = b"".join(encode_command(args) for args in batch)
        replies = await self._retry(data, count=len(batch))
        return list(replies) if len(batch) > 1 else [replies]

    async def script(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes], *, shield: float | None = None
    ) -> Any:
        if self._ack is not None:  # acknowledged writes (one check a call without them)
            return await self._acked_script(script, keys, args, shield)
        call = _ScriptCall(self.scripts, script, keys, args)
        return await self._retry(call.data(), script=call, shield=shield)

    async def _acked_script(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes], shield: float | None
    ) -> Any:
        ack = self.replica_ack(script)
        if ack is None:  # a script whose writes need no acknowledgement
            call = _ScriptCall(self.scripts, script, keys, args)
            return await self._retry(call.data(), script=call, shield=shield)
        call = _AckedScriptCall(self.scripts, script, keys, args)
        call.ack = ack
        reply, acks = await self._retry(call.data(), count=2, script=call, shield=shield)
        ack.check(acks)
        return reply

    async def _retry(
        self, data: bytes, *, count: int = 1, script: _ScriptCall | None = None, shield: float | None = None
    ) -> Any:
        """Send ``data`` (``count`` commands), retried on a lost connection and on the
        server's transient errors (the replies of several commands come back as they
        are: an error reply in its place). ``shield`` (seconds): a mutation, carried
        through a cancellation that comes after it was sent, for up to that long (see
        ``RespConnection.call``); retries after a fault run shielded, within the same
        bound, as the first attempt's wait was."""
        if shield is None:
            return await self._retry_loop(data, count, script, _UNSENT)
        try:
            first: Any = await self._client.execute(data, count, shield=shield)
        except ConnectionLost as exc:
            first = exc
        if not isinstance(first, (ReplyError, ConnectionLost)) and not (
            count > 1 and any(isinstance(r, ReplyError) for r in first)
        ):
            return first
        return await shielded(shield, functools.partial(self._retry_loop, data, count, script, first))

    async def _retry_loop(self, data: bytes, count: int, script: _ScriptCall | None, outcome: Any) -> Any:
        """The retries of :meth:`_retry`; ``outcome``: the first attempt's reply or fault,
        or ``_UNSENT``."""
        backoff: Backoff | None = None  # made at the first fault: most calls have none
        while True:
            if outcome is _UNSENT:
                try:
                    outcome = await self._client.execute(data, count)
                except ConnectionLost as exc:
                    outcome = exc
            if count > 1 and isinstance(outcome, list):
                # several commands: an error reply stands in the list (read-only batches,
                # sent again whole after a transient one, as a single command is)
                outcome = next((r for r in outcome if isinstance(r, ReplyError)), outcome)
            if not isinstance(outcome, (ReplyError, ConnectionLost)):
                return outcome
            err: BaseException = outcome
            outcome = _UNSENT
            if isinstance(err, ReplyError):
                text = str(err)
                if script is not None and await self._script_missing(script.script, text):
                    data = script.data()  # loaded, or sent as EVALSHA from now on
                    continue
                if not retryable(text):
                    raise StorageError(f"Redis error: {text}")
            self._on_fault()
            if backoff is None:
                backoff = Backoff(self.retry_timeout)
            await backoff.wait(err)

    async def _script_missing(self, script: Script, text: str) -> bool:
        """After a script's error reply: whether it was about the script itself (not
        loaded, or Functions refused), now dealt with, so the call is to be sent again."""
        if text.startswith("NOSCRIPT"):
            loaded = await self._client.execute(encode_command(("SCRIPT", "LOAD", script.code)))
            if isinstance(loaded, ReplyError):
                raise StorageError(f"Redis error: {loaded}")
            return True
        fn = self.scripts.function_of(script)
        if fn is None:
            return False
        if text.startswith("ERR Function not found"):
            # first use, a restart, FUNCTION FLUSH: load it (REPLACE: a library's name is
            # the hash of its code, so replacing one another client loaded changes nothing)
            loaded = await self._client.execute(encode_command(("FUNCTION", "LOAD", "REPLACE", fn[1])))
            if isinstance(loaded, ReplyError):
                self.scripts.refused(script, str(loaded))
            return True
        if refuses_functions(text):
            self.scripts.no_functions(text)
            return True
        return False

    # -- blocking calls ----------------------------------------------------------------

    async def blocking_move_then(
        self, src: str, dst: str, timeout: float, script: Script, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> tuple[bytes | None, Any]:
        data = encode_command(("BLMOVE", src, dst, "LEFT", "RIGHT", f"{max(timeout, 0.01):.3f}"))
        data += _ScriptCall(self.scripts, script, keys, args).data()
        async with self._blocker("blocking move failed") as conn:
            moved, reply = await conn.call(data, 2, timeout=timeout + 5.0)
            if self.sentinels is not None and isinstance(moved, ReplyError) and str(moved).startswith("READONLY"):
                await self._client.primary_moved(conn.address)  # demoted: ask the sentinels again
        if isinstance(moved, ReplyError):
            raise StorageError(f"blocking move failed: {moved}")
        return moved, reply

    async def blocking_call(self, args: Sequence[str], timeout: float) -> Any:
        async with self._blocker("blocking wait failed") as conn:
            reply = await conn.call(encode_command(args), timeout=timeout + 5.0)
        if isinstance(reply, ReplyError):
            raise StorageError(f"blocking wait failed: {reply}")
        return reply

    @asynccontextmanager
    async def _blocker(self, what: str) -> AsyncIterator[RespConnection]:
        """A dedicated connection for one blocking call: back to the idle pool if the call
        completed, closed if it failed or was cancelled (the server drops what it was
        blocked on). Faults become :class:`StorageError`."""
        conn = None
        while self._idle and conn is None:
            conn = self._idle.pop()
            if conn.broken is not None:  # closed meanwhile (the primary moved)
                conn = None
        ok = False
        try:
            if conn is None:
                conn = await self._client.open_connection()
            yield conn
            ok = True
        except ConnectionLost as exc:
            self._on_fault()
            raise StorageError(f"{what}: {exc}") from exc
        finally:
            if conn is not None:
                if ok and not self._closed and conn.broken is None:
                    self._idle.append(conn)
                else:
                    await conn.aclose()

    # -- pub/sub -----------------------------------------------------------------------

    async def subscribe(self, channel: str, on_message: Callable[[bytes], None]) -> Subscription:
        sub = Subscriber(self._client, channel, on_message)
        backoff = Backoff(self.retry_timeout)
        while True:
            try:
                await sub.subscribe()
                return _LeanSubscription(sub, channel)
            except ConnectionLost as exc:
                try:
                    await backoff.wait(exc)
                except StorageError as gone:
                    raise StorageError(f"could not subscribe to {channel!r}: {gone}") from exc


class _LeanSubscription(Subscription):
    def __init__(self, sub: Subscriber, channel: str) -> None:
        self._sub = sub
        self._channel = channel

    async def run(self) -> None:
        await self._sub.run()

    async def connection_id(self) -> int | None:
        await trio.lowlevel.checkpoint()
        # its generation changes only once a new connection subscribed
        return self._sub.generation if self._sub.connected else None

    async def wait_subscribed(self) -> None:
        if not self._sub.connected:
            raise StorageError(f"could not subscribe to {self._channel!r}: not connected")
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await self._sub.aclose()


class _ScriptCall:
    """A script call as the lean client sends it (encoded again after its form changed)."""

    __slots__ = ("args", "keys", "policy", "script")

    def __init__(
        self, policy: ScriptPolicy, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes]
    ) -> None:
        self.policy = policy
        self.script = script
        self.keys = keys
        self.args = args

    def data(self) -> bytes:
        """``FCALL`` (or ``EVALSHA``) of the script, as the policy says now."""
        return encode_command(self.policy.command(self.script, self.keys), self.keys, self.args)


class _AckedScriptCall(_ScriptCall):
    """An acknowledged write's script call: the ``WAIT`` of its ``ack`` goes behind it (a
    class of its own, so that a call without acks pays nothing for them)."""

    __slots__ = ("ack",)
    ack: ReplicaAck

    def data(self) -> bytes:
        return super().data() + self.ack.command
