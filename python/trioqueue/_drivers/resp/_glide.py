"""The ``glide`` transport: valkey-glide, for Redis Cluster, an application's own client
(``client=``) and ``lean=False``. The only module that touches the valkey-glide API
(the ``redis`` extra); it is imported only when this transport is chosen.

What it keeps of GLIDE's behaviour under Trio:

- one shared *command* client (multiplexed, never given a blocking command);
- *blocking* clients, one per concurrent blocking call, closed (not reused) when their
  call is cancelled: the server then drops the blocked command;
- *subscriber* clients with a pub/sub configuration whose messages are delivered by a
  callback that GLIDE runs on the Trio thread (its pipe reader system task), so no
  ``get_pubsub_message()`` is ever pending, let alone cancelled: nothing can be lost to a
  cancelled receive;
- retries with backoff on connection errors/timeouts/``LOADING`` while GLIDE reconnects.

On a Sentinel service (``lean=False``; valkey-glide has no Sentinel support of its own)
the clients are made for the primary :class:`~._sentinel.Sentinels` names; after a fault
the sentinels are asked again, and when they name another primary every client moves
there (the command client is replaced, idle blocking clients closed, subscriptions made
again: their listeners get a ``resync``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..._model._errors import StorageError, install_hint
from ._client import ConnectionLost, RespClient
from ._sentinel import Address, Sentinels
from ._transport import (
    Backoff,
    ConnParams,
    Script,
    Subscription,
    Transport,
    diagnose,
    refuses_functions,
    retryable,
    shielded,
)

try:
    import glide as _g
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"RedisStorage on Redis Cluster, with client= or with lean=False {install_hint('redis', 'valkey-glide')}"
    ) from exc

__all__ = ["GlideTransport"]

# GLIDE's core logs straight to stdout, with colours: a program's stdout is its own. Off
# unless the application configured GLIDE's logger first (init() never overrides that).
_g.Logger.init(_g.LogLevel.OFF)


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, (_g.ConnectionError, _g.TimeoutError)):
        return True
    return isinstance(exc, _g.RequestError) and retryable(str(exc))


class GlideTransport(Transport):
    """:class:`Transport` on valkey-glide clients (see the module docstring)."""

    def __init__(
        self, params: ConnParams, *, client: Any = None, retry_timeout: float, on_fault: Callable[[], None]
    ) -> None:
        super().__init__(params, retry_timeout=retry_timeout, on_fault=on_fault)
        self._external = client
        self._client: Any = client
        self._idle_blockers: list[Any] = []
        self._closed = False
        self._reconnect_lock: trio.Lock | None = None
        self._glide_scripts: dict[str, Any] = {}  # sha -> GLIDE's Script (EVALSHA, reloaded on NOSCRIPT)
        # Sentinel mode: the primary the clients are made for, a lean client to check that
        # a node says it is the primary, and an event set (then replaced) when it moves.
        self.sentinels = Sentinels(params) if params.sentinels else None
        self._address: Address = (params.host, params.port)
        self._probe = RespClient(params)
        self.moved = trio.Event()

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
            addresses=[_g.NodeAddress(*self._address)],
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

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self) -> None:
        """A plain TCP connection first (GLIDE takes its whole connect timeout to see a
        refusal, and says "timed out" for everything): a server that refuses, is unknown
        or unreachable is reported at once; then the command client."""
        self._closed = False
        self._reconnect_lock = trio.Lock()
        if self._client is not None:
            return  # the application's own
        if self.sentinels is not None:
            try:
                self._address = await self.sentinels.verified_primary(self._probe)
            except ConnectionLost as exc:
                raise StorageError(f"could not connect to {self.params.display()}: {exc}") from exc
        why = await diagnose(self.params, self._address)
        if why is None:
            try:
                config = self._config(request_timeout=self.params.request_timeout)
                self._client = await self._retry(lambda: self._create(config))
                return
            except StorageError as exc:
                why = await diagnose(self.params, self._address)
                if why is None:
                    raise StorageError(f"could not connect to {self.params.display()}: {exc}") from exc
        raise StorageError(f"could not connect to {self.params.display()}: {why}") from None

    async def close(self) -> None:
        self._closed = True
        blockers, self._idle_blockers = self._idle_blockers, []
        for c in blockers:
            await _close_quietly(c)
        if self._client is not None and self._client is not self._external:
            await _close_quietly(self._client)
        self._client = self._external

    # -- commands --------------------------------------------------------------------

    async def _retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        backoff = Backoff(self.retry_timeout)
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
            if self.sentinels is not None:
                await self._follow()

    async def _follow(self) -> None:
        """Sentinel mode, after a fault: ask the sentinels again; move to the primary they
        name if it is another one (a sentinel that cannot tell now is asked again after
        the next fault)."""
        self.sentinels.forget(self._address)  # type: ignore[union-attr]
        try:
            new = await self.sentinels.verified_primary(self._probe)  # type: ignore[union-attr]
        except ConnectionLost:
            return
        await self._move_to(new)

    async def _move_to(self, new: Address) -> None:
        """Every client to the primary ``new``: the command client replaced, the idle
        blocking clients closed, the subscriptions told (:attr:`moved`)."""
        assert self._reconnect_lock is not None
        async with self._reconnect_lock:
            if new == self._address or self._closed:
                return
            previous, self._address = self._address, new
            try:
                client = await self._create(self._config(request_timeout=self.params.request_timeout))
            except _g.GlideError:
                self._address = previous  # not reachable yet: the next fault tries again
                return
            old, self._client = self._client, client
            blockers, self._idle_blockers = self._idle_blockers, []
            for c in (*blockers, *([old] if old is not None else [])):
                await _close_quietly(c)
        moved, self.moved = self.moved, trio.Event()
        moved.set()

    async def watchdog(self) -> None:
        """On a Sentinel service: follow the sentinels' ``+switch-master``."""
        if self.sentinels is None:
            return
        await self.sentinels.watch(self._switched)

    async def _switched(self, old: Address | None, new: Address) -> None:
        self.sentinels.moved(new)  # type: ignore[union-attr]
        self._on_fault()
        await self._move_to(new)

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

    async def command(self, args: Sequence[str | bytes]) -> Any:
        return await self._retry(lambda: self._client.custom_command(list(args)))

    async def commands(self, batch: Sequence[Sequence[str | bytes]]) -> list[Any]:
        async def run() -> list[Any]:
            b = _g.ClusterBatch(is_atomic=False) if self.params.cluster else _g.Batch(is_atomic=False)
            for args in batch:
                b.custom_command(list(args))
            return list(await self._client.exec(b, raise_on_error=True) or ())

        replies: list[Any] = await self._retry(run)
        return replies

    async def script(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes], *, shield: float | None = None
    ) -> Any:
        call = functools.partial(self._script_acked, script, list(keys), list(args))
        return await (call() if shield is None else shielded(shield, call))

    async def _script_acked(self, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """The script's reply, once a replica acknowledged it where writes are
        acknowledged: ``WAIT`` on the client that ran it (never the script again: it ran)."""

        async def attempt() -> tuple[Any, Any]:
            client = self._client
            return client, await self._call_script(client, script, keys, args)

        client, reply = await self._retry(attempt)
        ack = self.replica_ack(script)
        if ack is not None:
            try:
                acks = await client.custom_command(list(ack.args))
            except _g.GlideError as exc:
                raise StorageError(f"the write ran, but whether a replica has it is unknown: {exc}") from exc
            ack.check(acks)
        return reply

    async def _call_script(self, client: Any, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """FCALL of the script's Function; a server without it gets the library
        (``FUNCTION LOAD REPLACE``: on every primary of a cluster, a new one included) and
        the call again; where Functions are refused, the script goes as EVALSHA (GLIDE's
        own script object, which loads it again after a NOSCRIPT)."""
        fn = self.scripts.function_of(script)
        if fn is not None:
            try:
                return await client.fcall(fn[0], keys=keys, arguments=args)
            except _g.RequestError as exc:
                text = str(exc)
                if "Function not found" in text:
                    try:
                        await client.function_load(fn[1], replace=True)
                    except _g.RequestError as refused:
                        self.scripts.refused(script, str(refused))
                    else:
                        return await client.fcall(fn[0], keys=keys, arguments=args)
                elif refuses_functions(text):
                    self.scripts.no_functions(text)
                else:
                    raise
        return await client.invoke_script(self._glide_script(script), keys=keys, args=args)

    def _glide_script(self, script: Script) -> Any:
        found = self._glide_scripts.get(script.sha)
        if found is None:
            found = self._glide_scripts[script.sha] = _g.Script(script.code)  # type: ignore[no-untyped-call]
        return found

    # -- blocking calls ----------------------------------------------------------------

    async def blocking_move_then(
        self, src: str, dst: str, timeout: float, script: Script, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> tuple[bytes | None, Any]:
        if self.params.cluster:
            batch: Any = _g.ClusterBatch(is_atomic=False)
            options: Any = _g.ClusterBatchOptions(timeout=int((timeout + 5.0) * 1000))
        else:
            batch = _g.Batch(is_atomic=False)
            options = _g.BatchOptions(timeout=int((timeout + 5.0) * 1000))
        batch.custom_command(["BLMOVE", src, dst, "LEFT", "RIGHT", f"{max(timeout, 0.01):.3f}"])
        batch.custom_command([*self.scripts.command(script, keys), *keys, *args])
        async with self._blocker(timeout, "blocking move failed") as client:
            replies = await client.exec(batch, raise_on_error=False, options=options)
        if not replies or len(replies) != 2 or isinstance(replies[0], Exception):
            raise StorageError(f"blocking move failed: {replies!r:.200}")
        return replies[0], replies[1]

    async def blocking_call(self, args: Sequence[str], timeout: float) -> Any:
        async with self._blocker(timeout, "blocking wait failed") as client:
            return await client.custom_command(list(args))

    @asynccontextmanager
    async def _blocker(self, timeout: float, what: str) -> AsyncIterator[Any]:
        """A dedicated client for one blocking call: back to the idle pool if the call
        completed, closed if it failed or was cancelled (the server drops what it was
        blocked on). Faults become :class:`StorageError`."""
        client = self._idle_blockers.pop() if self._idle_blockers else None
        ok = False
        try:
            if client is None:
                client = await self._create(self._config(request_timeout=timeout + 5.0))
            yield client
            ok = True
        except _g.GlideError as exc:
            self._on_fault()
            raise StorageError(f"{what}: {exc}") from exc
        finally:
            if client is not None:
                if ok and not self._closed:
                    self._idle_blockers.append(client)
                else:
                    await _close_quietly(client)

    # -- pub/sub ---------------------------------------------------------------------

    async def subscribe(self, channel: str, on_message: Callable[[bytes], None]) -> Subscription:
        def callback(msg: Any, _context: Any) -> None:
            on_message(msg.message)

        def config() -> Any:
            return self._config(request_timeout=self.params.request_timeout, pubsub=(channel, callback))

        client = await self._retry(lambda: self._create(config()))
        sub = _GlideSubscription(client, channel, self.params.cluster, self if self.sentinels else None, config)
        try:
            await sub.wait_subscribed()
        except BaseException:
            await sub.aclose()
            raise
        return sub


class _GlideSubscription(Subscription):
    """A GLIDE client with a pub/sub configuration: GLIDE delivers its messages and
    subscribes again after a reconnect by itself. On a Sentinel service (``transport``
    given) a new client is made whenever the primary moves."""

    def __init__(
        self,
        client: Any,
        channel: str,
        cluster: bool,
        transport: GlideTransport | None = None,
        config: Callable[[], Any] | None = None,
    ) -> None:
        self._client = client
        self._channel = channel
        self._cluster = cluster
        self._transport = transport
        self._make_config = config
        self._address = transport._address if transport is not None else None  # where it subscribed

    async def run(self) -> None:
        transport, make_config = self._transport, self._make_config
        if transport is None or make_config is None:
            await trio.sleep_forever()  # GLIDE delivers on its own
            return
        while True:
            if self._address == transport._address:
                await transport.moved.wait()
                continue
            address = transport._address
            try:
                new = await transport._retry(lambda: transport._create(make_config()))
            except StorageError:
                continue  # still away after the retries: try again (or where it moved since)
            self._address = address
            old, self._client = self._client, new
            await _close_quietly(old)

    async def connection_id(self) -> int | None:
        try:
            if self._cluster:
                return hash(str(await self._client.custom_command(["CLIENT", "ID"], _g.AllNodes())))
            return int(await self._client.custom_command(["CLIENT", "ID"]))
        except _g.GlideError:
            return None

    async def wait_subscribed(self, timeout: float = 10.0) -> None:
        want = self._channel.encode()
        with trio.move_on_after(timeout):
            delay = 0.005
            while True:
                try:
                    state = await self._client.get_subscriptions()
                    actual = set().union(*state.actual_subscriptions.values()) if state.actual_subscriptions else set()
                    if want in actual or self._channel in actual:
                        return
                except _g.GlideError:
                    pass
                await trio.sleep(delay)
                delay = min(delay * 2, 0.2)
        raise StorageError(f"could not subscribe to {self._channel!r}")

    async def aclose(self) -> None:
        await _close_quietly(self._client)


async def _close_quietly(client: Any) -> None:
    """Close a GLIDE client, shielded, ignoring what it raises."""
    with trio.CancelScope(shield=True):
        try:
            await client.close()
        except Exception:  # noqa: BLE001 - already closed/broken: nothing to release
            pass
