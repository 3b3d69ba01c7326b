"""The only module that touches the valkey-glide API: a small adapter for RedisStorage.

On a standalone server (plain or TLS) commands, scripts, blocking calls and subscriptions
go through the lean client of :mod:`._resp` instead (a Trio socket, RESP parsed in Rust:
about 2.5x cheaper per awaited call than GLIDE under Trio, see ``benches/bench_resp.py``);
GLIDE serves Cluster, an application's own client (``client=``) and ``lean=False``.

What it encodes (see /work/shared/notes/redis-clients-under-trio.md for the measurements):

- one shared *command* client (multiplexed, never given a blocking command);
- *blocking* clients, one per concurrent blocking call, closed (not reused) when their
  call is cancelled: the server then drops the blocked command;
- *subscriber* clients with a pub/sub configuration whose messages are delivered by a
  callback that GLIDE runs on the Trio thread (its pipe reader system task), so no
  ``get_pubsub_message()`` is ever pending, let alone cancelled: nothing can be lost to a
  cancelled receive;
- retries with backoff on connection errors/timeouts/``LOADING`` while GLIDE reconnects.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from .. import _core
from .._errors import StorageError, ValidationError
from ._resp import ConnectionLost, ReplyError, RespClient, RespConnection, Subscriber

try:
    import glide as _g
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "RedisStorage needs valkey-glide: pip install 'trioqueue[redis]'"
    ) from exc

__all__ = ["ConnParams", "GlideAdapter", "Script", "make_script", "parse_url"]

# GLIDE's core logs straight to stdout, with colours: a program's stdout is its own. Off
# unless the application configured GLIDE's logger first (init() never overrides that).
_g.Logger.init(_g.LogLevel.OFF)

log = logging.getLogger("trioqueue.storage.redis")

Script = _g.Script
_SOURCES: dict[str, str] = {}  # script hash -> source, for the lean client's NOSCRIPT reload
# script hash -> (function name, library code): the FCALL form of a script
_FUNCTIONS: dict[str, tuple[str, str]] = {}


def make_script(code: str, library: tuple[str, str] | None = None) -> Script:
    """A GLIDE script object (EVALSHA, reloaded on NOSCRIPT). ``library``: the script as a
    Redis Function (``(function name, library code)``, see ``_lua.library``), called
    instead (FCALL, loaded on first use) where the server allows it."""
    script = _g.Script(code)  # type: ignore[no-untyped-call]
    sha = script.get_hash()
    _SOURCES[sha] = code
    if library is not None:
        _FUNCTIONS[sha] = library
    return script


def _as_evalsha(data: bytes, sha: str) -> bytes:
    """An encoded ``FCALL <function> ...`` of script ``sha`` as the same ``EVALSHA``: the two
    commands differ only in their first two elements."""
    name = _FUNCTIONS[sha][0].encode()
    head = b"$5\r\nFCALL\r\n$%d\r\n%s\r\n" % (len(name), name)
    return data.replace(head, b"$7\r\nEVALSHA\r\n$40\r\n" + sha.encode() + b"\r\n", 1)

def _refuses_functions(text: str) -> bool:
    """Whether an error to FCALL or FUNCTION LOAD says this server or user has no Functions:
    an older server (unknown command) or an ACL without them (NOPERM)."""
    if "NOPERM" in text:  # not one about keys or channels
        return "'fcall" in text.lower() or "'function" in text.lower()
    return "unknown command" in text or "unknown subcommand" in text


_RETRYABLE_TEXT = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "connection", "Connection",
                   "Broken pipe", "reset by peer", "disconnected", "Disconnected")


@dataclass(frozen=True, slots=True)
class ConnParams:
    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    insecure_tls: bool = False
    ca_certs: str | None = None  # PEM file of the CA(s) to trust (default: the system's)
    cluster: bool = False
    request_timeout: float = 5.0
    connect_timeout: float = 5.0
    client_name: str | None = None

    def display(self) -> str:
        """The server's URL without credentials."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.port}" + (f"/{self.db}" if self.db else "")


def parse_url(url: str, *, cluster: bool = False, **overrides: Any) -> ConnParams:
    """``redis://[user[:password]@]host[:port][/db]``; ``rediss://`` for TLS, with
    ``?ssl_ca_certs=/path/ca.pem`` to trust a private CA or ``?ssl_cert_reqs=none`` to skip
    certificate checks (testing only)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "valkey", "valkeys"):
        raise ValidationError(f"unsupported URL scheme {parts.scheme!r} in {url!r} (use redis:// or rediss://)")
    query = parse_qs(parts.query)
    db_text = parts.path.lstrip("/") or query.get("db", ["0"])[0]
    cert_reqs = query.get("ssl_cert_reqs", [""])[0].lower()
    params: dict[str, Any] = dict(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 6379,
        db=int(db_text or 0),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme in ("rediss", "valkeys"),
        insecure_tls=cert_reqs in ("none", "cert_none"),
        ca_certs=query.get("ssl_ca_certs", [None])[0],
        cluster=cluster,
    )
    params.update({k: v for k, v in overrides.items() if v is not None})
    return ConnParams(**params)


_PING = _core.encode_command(("PING",))
_UNSENT = object()  # _retry_loop: no attempt made yet


async def _shielded(limit: float, call: Callable[[], Awaitable[Any]]) -> Any:
    """``await call()`` shielded from cancellation for up to ``limit`` seconds (a mutation
    whose reply matters); past that, the caller's cancellation is raised if there is one,
    else :class:`StorageError`."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + limit):
        return await call()
    await trio.lowlevel.checkpoint_if_cancelled()  # the caller was cancelled: honour it now
    raise StorageError(f"Redis did not complete a call within {limit:g} s")


class _Backoff:
    """Waits between the retries of one operation (20 ms doubling to 0.5 s) until
    ``timeout`` seconds have passed, then raises :class:`StorageError` with the last
    fault."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.delay = 0.02
        self.deadline = trio.current_time() + timeout

    async def wait(self, err: BaseException) -> None:
        if trio.current_time() + self.delay > self.deadline:
            raise StorageError(f"Redis unavailable for {self.timeout:g} s: {err}") from err
        await trio.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.5)


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, (_g.ConnectionError, _g.TimeoutError)):
        return True
    if isinstance(exc, _g.RequestError):
        text = str(exc)
        return any(t in text for t in _RETRYABLE_TEXT)
    return False


class GlideAdapter:
    """Creates and drives the GLIDE clients of one RedisStorage."""

    def __init__(
        self,
        params: ConnParams,
        *,
        client: Any = None,
        retry_timeout: float = 30.0,
        on_fault: Callable[[], None] | None = None,
        lean: bool = True,
    ) -> None:
        self.params = params
        self.retry_timeout = retry_timeout
        self._external = client
        self._client: Any = client
        self._on_fault = on_fault or (lambda: None)
        self._idle_blockers: list[Any] = []
        # ordinary commands on a standalone server: the lean client
        self._fast = RespClient(params) if lean and client is None and not params.cluster else None
        self._closed = False
        self._reconnect_lock: trio.Lock | None = None
        # Scripts go as FCALL of their library form until the server refuses Functions (an
        # older server, an ACL without FUNCTION): then EVALSHA, as they all did before.
        self._functions = True
        self._eval_only: set[str] = set()  # scripts whose library would not load

    # -- configuration -------------------------------------------------------------

    def _config(self, *, request_timeout: float, pubsub: tuple[str, Callable[..., None]] | None = None) -> Any:
        p = self.params
        creds = _g.ServerCredentials(password=p.password, username=p.username) if p.password is not None else None
        adv_kwargs: dict[str, Any] = {"connection_timeout": int(p.connect_timeout * 1000)}
        if pubsub is not None:
            # after a reconnect GLIDE re-subscribes at its next reconciliation (default ~3 s)
            adv_kwargs["pubsub_reconciliation_interval"] = 100
        if p.tls and p.insecure_tls:
            adv_kwargs["tls_config"] = _g.TlsAdvancedConfiguration(use_insecure_tls=True)
        elif p.tls and p.ca_certs:
            try:
                with open(p.ca_certs, "rb") as f:
                    pem = f.read()
            except OSError as exc:
                raise StorageError(f"cannot read ssl_ca_certs {p.ca_certs!r}: {exc}") from exc
            adv_kwargs["tls_config"] = _g.TlsAdvancedConfiguration(root_pem_cacerts=pem)
        kwargs: dict[str, Any] = dict(
            addresses=[_g.NodeAddress(p.host, p.port)],
            use_tls=p.tls,
            credentials=creds,
            request_timeout=int(request_timeout * 1000),
            reconnect_strategy=_g.BackoffStrategy(num_of_retries=8, factor=10, exponent_base=2, jitter_percent=20),
            client_name=p.client_name,
        )
        if p.cluster:
            kwargs["advanced_config"] = _g.AdvancedGlideClusterClientConfiguration(**adv_kwargs)
            if pubsub is not None:
                channel, cb = pubsub
                modes = _g.GlideClusterClientConfiguration.PubSubChannelModes
                kwargs["pubsub_subscriptions"] = _g.GlideClusterClientConfiguration.PubSubSubscriptions(
                    channels_and_patterns={modes.Exact: {channel}}, callback=cb, context=None
                )
            return _g.GlideClusterClientConfiguration(**kwargs)
        kwargs["database_id"] = p.db or None
        kwargs["advanced_config"] = _g.AdvancedGlideClientConfiguration(**adv_kwargs)
        if pubsub is not None:
            channel, cb = pubsub
            modes = _g.GlideClientConfiguration.PubSubChannelModes
            kwargs["pubsub_subscriptions"] = _g.GlideClientConfiguration.PubSubSubscriptions(
                channels_and_patterns={modes.Exact: {channel}}, callback=cb, context=None
            )
        return _g.GlideClientConfiguration(**kwargs)

    async def _create(self, config: Any) -> Any:
        cls = _g.GlideClusterClient if self.params.cluster else _g.GlideClient
        return await cls.create(config)

    async def _create_retrying(self, config: Any) -> Any:
        return await self._retry(lambda: self._create(config))

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the storage's clients. A server that refuses, is unknown or unreachable, or
        does not answer (within the connect and request timeouts) is reported at once: the
        retries (``retry_timeout``) are for one that goes away while running."""
        self._closed = False
        self._reconnect_lock = trio.Lock()
        why: str | None = None
        try:
            if self._fast is not None:
                self._fast = RespClient(self.params)
                if isinstance(await self._fast.execute(_PING), ReplyError):
                    await self._retry_fast(_PING)  # LOADING...: the server is there, wait for it
            elif self._client is None:
                why = await self._diagnose()  # GLIDE takes its whole connect timeout to see a refusal
                if why is None:
                    self._client = await self._create_retrying(self._config(request_timeout=self.params.request_timeout))
        except (ConnectionLost, StorageError) as exc:
            why = await self._diagnose() or str(exc)
            raise StorageError(f"could not connect to {self.params.display()}: {why}") from exc
        if why is not None:
            raise StorageError(f"could not connect to {self.params.display()}: {why}")

    async def _diagnose(self) -> str | None:
        """Why the server cannot be reached, in words (GLIDE says "timed out" for all), from
        a TCP connection opened and closed; ``None`` when it can be."""
        p = self.params
        timeout = max(p.connect_timeout, 0.5)

        def probe() -> None:
            socket.create_connection((p.host, p.port), timeout=timeout).close()

        try:
            await trio.to_thread.run_sync(probe, abandon_on_cancel=True)
        except ConnectionRefusedError:
            return "connection refused"
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    async def close(self) -> None:
        self._closed = True
        blockers, self._idle_blockers = self._idle_blockers, []
        for c in blockers:
            await _close_quietly(c)
        if self._fast is not None:
            await self._fast.aclose()
        if self._client is not None and self._client is not self._external:
            await _close_quietly(self._client)
        self._client = self._external

    # -- commands --------------------------------------------------------------------

    async def _retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        backoff = _Backoff(self.retry_timeout)
        while True:
            try:
                return await fn()
            except _g.ClosingError as exc:
                if self._closed or self._client is None or self._client is self._external:
                    raise StorageError(f"Redis client closed: {exc}") from exc
                err: BaseException = exc
                await self._replace_client()
            except _g.GlideError as exc:
                if not _is_retryable(exc):
                    raise StorageError(f"Redis error: {exc}") from exc
                err = exc
            self._on_fault()
            await backoff.wait(err)

    async def _replace_client(self) -> None:
        assert self._reconnect_lock is not None
        old = self._client
        async with self._reconnect_lock:
            if self._client is old:
                try:
                    new = await self._create(self._config(request_timeout=self.params.request_timeout))
                except _g.GlideError:
                    return
                self._client = new
                await _close_quietly(old)

    async def script(
        self, script: Any, keys: Sequence[str | bytes], args: Sequence[str | bytes], *, shield: float | None = None
    ) -> Any:
        """FCALL of the script's Redis Function (loaded on first use), or EVALSHA where the
        server refuses Functions (loaded again on NOSCRIPT), retried on connection faults.
        ``shield`` (seconds): a mutation whose reply matters; once sent it is carried
        through a cancellation for up to that long (and returns its reply; the
        cancellation comes at the caller's next checkpoint)."""
        if self._fast is not None:
            sha = script.get_hash()
            return await self._retry_fast(self._invocation(sha, keys, args), sha, shield)
        fn = self._function_of(script.get_hash())
        if fn is None:
            op: Callable[[], Awaitable[Any]] = lambda: self._client.invoke_script(script, keys=list(keys), args=list(args))
        else:
            op = functools.partial(self._glide_fcall, script, fn, list(keys), list(args))
        call = functools.partial(self._retry, op)
        return await (call() if shield is None else _shielded(shield, call))

    async def _glide_fcall(self, script: Any, fn: tuple[str, str], keys: list[Any], args: list[Any]) -> Any:
        """FCALL through GLIDE (Cluster, ``lean=False``, a client passed in). A server
        without the function gets the library (``FUNCTION LOAD REPLACE``: on every primary
        of a cluster, a new one included) and the call again; where Functions are
        refused, the script goes as EVALSHA from then on."""
        sha = script.get_hash()
        try:
            return await self._client.fcall(fn[0], keys=keys, arguments=args)
        except _g.RequestError as exc:
            text = str(exc)
            if "Function not found" in text:
                try:
                    await self._client.function_load(fn[1], replace=True)
                except _g.RequestError as refused:
                    self._refused(sha, str(refused))
                else:
                    return await self._client.fcall(fn[0], keys=keys, arguments=args)
            elif _refuses_functions(text):
                self._no_functions(text)
            else:
                raise
        return await self._client.invoke_script(script, keys=keys, args=args)

    def _function_of(self, sha: str) -> tuple[str, str] | None:
        """Script ``sha``'s Redis Function (name, library code), or None where it goes as
        EVALSHA (none made for it, Functions refused here, its library would not load)."""
        fn = _FUNCTIONS.get(sha) if self._functions else None
        return None if fn is None or sha in self._eval_only else fn

    def _invocation(self, sha: str, keys: Sequence[str | bytes], args: Sequence[str | bytes]) -> bytes:
        """A script's call on the lean client: FCALL of its function, else EVALSHA."""
        fn = self._function_of(sha)
        if fn is None:
            return _core.encode_command(("EVALSHA", sha, len(keys)), keys, args)
        return _core.encode_command(("FCALL", fn[0], len(keys)), keys, args)

    async def _load_function(self, sha: str) -> None:
        """``FUNCTION LOAD REPLACE`` of script ``sha``'s library (after ``Function not
        found``: first use, a restart, ``FUNCTION FLUSH``), as :meth:`_glide_fcall` loads
        it: a library's name is the hash of its code, so replacing one that another client
        loaded meanwhile changes nothing. A server that refuses Functions (no such command,
        no permission) gets EVALSHA from now on, and a library that fails to load only
        its own script."""
        assert self._fast is not None
        loaded = await self._fast.execute(_core.encode_command(("FUNCTION", "LOAD", "REPLACE", _FUNCTIONS[sha][1])))
        if isinstance(loaded, ReplyError):
            self._refused(sha, str(loaded))

    def _refused(self, sha: str, why: str) -> None:
        """A library did not load: no Functions here at all, or not this one."""
        if _refuses_functions(why):
            self._no_functions(why)
        else:
            self._eval_only.add(sha)
            log.warning("Redis Function %s did not load (%s): its script goes as EVALSHA", _FUNCTIONS[sha][0], why)

    def _no_functions(self, why: str) -> None:
        if self._functions:
            self._functions = False
            log.info("Redis refused Functions (%s): scripts go as EVALSHA", why)

    async def watchdog(self) -> None:
        """The lean client's :meth:`RespClient.watchdog` (returns at once without one)."""
        if self._fast is not None:
            await self._fast.watchdog()

    async def command(self, args: Sequence[str | bytes]) -> Any:
        if self._fast is not None:
            return await self._retry_fast(_core.encode_command(args))
        return await self._retry(lambda: self._client.custom_command(list(args)))

    async def _retry_fast(self, data: bytes, sha: str | None = None, shield: float | None = None) -> Any:
        """One command on the lean client, retried like :meth:`_retry`: on a lost
        connection and on the server's transient errors (``LOADING``...). ``shield``
        (seconds): a mutation, carried through a cancellation that comes after it was
        sent, for up to that long (see ``RespConnection.call``); retries after a fault
        run shielded, within the same bound, as the first attempt's wait was."""
        assert self._fast is not None
        if shield is None:
            return await self._retry_loop(data, sha, _UNSENT)
        try:
            first: Any = await self._fast.execute(data, shield=shield)
        except ConnectionLost as exc:
            first = exc
        if not isinstance(first, (ReplyError, ConnectionLost)):
            return first
        return await _shielded(shield, functools.partial(self._retry_loop, data, sha, first))

    async def _retry_loop(self, data: bytes, sha: str | None, outcome: Any) -> Any:
        """The retries of :meth:`_retry_fast`; ``outcome``: the first attempt's reply or
        fault, or ``_UNSENT``."""
        assert self._fast is not None
        backoff: _Backoff | None = None  # made at the first fault: most calls have none
        while True:
            if outcome is _UNSENT:
                try:
                    outcome = await self._fast.execute(data)
                except ConnectionLost as exc:
                    outcome = exc
            if not isinstance(outcome, (ReplyError, ConnectionLost)):
                return outcome
            err: BaseException = outcome
            outcome = _UNSENT
            if isinstance(err, ReplyError):
                text = str(err)
                if sha is not None and text.startswith("NOSCRIPT"):
                    loaded = await self._fast.execute(_core.encode_command(("SCRIPT", "LOAD", _SOURCES[sha])))
                    if isinstance(loaded, ReplyError):
                        raise StorageError(f"Redis error: {loaded}")
                    continue
                if sha in _FUNCTIONS and data.find(b"FCALL", 0, 32) >= 0:
                    missing = text.startswith("ERR Function not found")
                    if missing:
                        await self._load_function(sha)
                    elif _refuses_functions(text):
                        self._no_functions(text)
                    if self._function_of(sha) is None:
                        data = _as_evalsha(data, sha)
                        continue
                    if missing:
                        continue
                if not any(t in text for t in _RETRYABLE_TEXT):
                    raise StorageError(f"Redis error: {text}")
            self._on_fault()
            if backoff is None:
                backoff = _Backoff(self.retry_timeout)
            await backoff.wait(err)

    # -- blocking move ---------------------------------------------------------------

    async def blocking_move_then(
        self, src: str, dst: str, timeout: float, script: Any, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> tuple[bytes | None, Any]:
        """``BLMOVE src dst LEFT RIGHT timeout`` on a dedicated client with ``script``
        (FCALL or EVALSHA) pipelined behind it on the same connection: the server runs the
        script as soon as the move returns (or times out), without a client round trip in
        between.

        Returns ``(moved entry or None, the script's reply)``; the reply is the exception
        the script raised instead (e.g. NOSCRIPT after a ``SCRIPT FLUSH``), for the caller
        to run it the ordinary way. Cancellation closes the client (the server drops the
        blocked command and the script behind it); a client whose call completed goes back
        to the idle pool. Connection faults are raised as :class:`StorageError` after the
        client was discarded (the caller retries)."""
        if self._fast is not None:
            data = _core.encode_command(("BLMOVE", src, dst, "LEFT", "RIGHT", f"{max(timeout, 0.01):.3f}"))
            data += self._invocation(script.get_hash(), keys, args)
            async with self._blocker(timeout, "blocking claim failed") as conn:
                moved, reply = await conn.call(data, 2, timeout=timeout + 5.0)
            if isinstance(moved, ReplyError):
                raise StorageError(f"blocking claim failed: {moved}")
            return moved, reply
        if self.params.cluster:
            batch: Any = _g.ClusterBatch(is_atomic=False)
            options: Any = _g.ClusterBatchOptions(timeout=int((timeout + 5.0) * 1000))
        else:
            batch = _g.Batch(is_atomic=False)
            options = _g.BatchOptions(timeout=int((timeout + 5.0) * 1000))
        batch.custom_command(["BLMOVE", src, dst, "LEFT", "RIGHT", f"{max(timeout, 0.01):.3f}"])
        sha = script.get_hash()
        fn = self._function_of(sha)
        batch.custom_command([*(["FCALL", fn[0]] if fn else ["EVALSHA", sha]), str(len(keys)), *keys, *args])
        async with self._blocker(timeout, "blocking claim failed") as client:
            replies = await client.exec(batch, raise_on_error=False, options=options)
        if not replies or len(replies) != 2 or isinstance(replies[0], Exception):
            raise StorageError(f"blocking claim failed: {replies!r:.200}")
        return replies[0], replies[1]

    async def blocking_call(self, args: Sequence[str], timeout: float) -> Any:
        """A blocking command (``XREAD BLOCK ...``) on a dedicated client from the same
        pool as :meth:`blocking_move_then`; cancellation closes the client."""
        if self._fast is not None:
            async with self._blocker(timeout, "blocking wait failed") as conn:
                reply = await conn.call(_core.encode_command(args), timeout=timeout + 5.0)
            if isinstance(reply, ReplyError):
                raise StorageError(f"blocking wait failed: {reply}")
            return reply
        async with self._blocker(timeout, "blocking wait failed") as client:
            return await client.custom_command(list(args))

    @asynccontextmanager
    async def _blocker(self, timeout: float, what: str) -> AsyncIterator[Any]:
        """A dedicated connection for one blocking call (the lean client's on a standalone
        server, a GLIDE client otherwise): back to the idle pool if the call completed,
        closed if it failed or was cancelled (the server drops what it was blocked on).
        Faults become :class:`StorageError`."""
        client = self._idle_blockers.pop() if self._idle_blockers else None
        ok = False
        try:
            if client is None:
                if self._fast is not None:
                    client = await self._fast.open_connection()
                else:
                    client = await self._create(self._config(request_timeout=timeout + 5.0))
            yield client
            ok = True
        except (ConnectionLost, _g.GlideError) as exc:
            self._on_fault()
            raise StorageError(f"{what}: {exc}") from exc
        finally:
            if client is not None:
                if ok and not self._closed and getattr(client, "broken", None) is None:
                    self._idle_blockers.append(client)
                else:
                    await _close_quietly(client)

    # -- pub/sub ---------------------------------------------------------------------

    async def subscriber(self, channel: str, on_message: Callable[[bytes], None]) -> Any:
        """A client subscribed to ``channel``; ``on_message(payload)`` runs on the Trio thread
        (for the lean client's subscriber, from :meth:`serve`, which the owner runs)."""
        if self._fast is not None:
            sub = Subscriber(self._fast, channel, on_message)
            try:
                await self._retry_connect(sub.subscribe)
            except StorageError as exc:
                raise StorageError(f"could not subscribe to {channel!r}: {exc}") from exc
            return sub

        def callback(msg: Any, _context: Any) -> None:
            on_message(msg.message)

        client = await self._create_retrying(
            self._config(request_timeout=self.params.request_timeout, pubsub=(channel, callback))
        )
        await self.wait_subscribed(client, channel)
        return client

    async def serve(self, client: Any) -> None:
        """Run ``client``'s message delivery until cancelled (GLIDE delivers on its own)."""
        if isinstance(client, Subscriber):
            await client.run()
        else:
            await trio.sleep_forever()

    async def _retry_connect(self, fn: Callable[[], Awaitable[None]]) -> None:
        backoff = _Backoff(self.retry_timeout)
        while True:
            try:
                return await fn()
            except ConnectionLost as exc:
                await backoff.wait(exc)

    async def wait_subscribed(self, client: Any, channel: str, timeout: float = 10.0) -> None:
        if isinstance(client, Subscriber):
            # its generation (connection_id) only changes once a new connection subscribed
            if not client.connected:
                raise StorageError(f"could not subscribe to {channel!r}: not connected")
            await trio.lowlevel.checkpoint()
            return
        want = channel.encode()
        with trio.move_on_after(timeout):
            delay = 0.005
            while True:
                try:
                    state = await client.get_subscriptions()
                    actual = set().union(*state.actual_subscriptions.values()) if state.actual_subscriptions else set()
                    if want in actual or channel in actual:
                        return
                except _g.GlideError:
                    pass
                await trio.sleep(delay)
                delay = min(delay * 2, 0.2)
        raise StorageError(f"could not subscribe to {channel!r}")

    async def connection_id(self, client: Any) -> int | None:
        """The server-side id of ``client``'s connection (for the lean subscriber, its
        connection's generation), or None if unreachable."""
        if isinstance(client, Subscriber):
            return client.generation if client.connected else None
        try:
            if self.params.cluster:
                return hash(str(await client.custom_command(["CLIENT", "ID"], _g.AllNodes())))
            return int(await client.custom_command(["CLIENT", "ID"]))
        except _g.GlideError:
            return None

    @staticmethod
    async def close_client(client: Any) -> None:
        await _close_quietly(client)


async def _close_quietly(client: Any) -> None:
    """Close a GLIDE client or a lean connection, shielded, ignoring what it raises."""
    with trio.CancelScope(shield=True):
        try:
            await (client.aclose() if isinstance(client, (RespConnection, Subscriber)) else client.close())
        except Exception:  # noqa: BLE001 - already closed/broken: nothing to release
            pass

