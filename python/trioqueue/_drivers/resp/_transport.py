"""The one interface between a Redis user (:class:`~trioqueue.storage.RedisStorage`) and
a server, and what its two implementations share. Part of the RESP driver: it knows
commands, scripts and connections, nothing of jobs.

:class:`Transport` is what the storage talks to: a command, several commands in one round
trip, a script call, a blocking call (with a script pipelined behind a blocking move), a
subscription. Two implementations, chosen once when the storage is made
(``trioqueue.storage.redis._storage``):

- ``lean`` (:mod:`._lean`, the default on a standalone server): the lean client of
  :mod:`._client`, a Trio socket with RESP parsed in Rust, about 2.5x cheaper per awaited
  call than valkey-glide under Trio (``benches/bench_resp.py``). It needs no valkey-glide.
- ``glide`` (:mod:`._glide`): valkey-glide, for Redis Cluster, an application's own
  client (``client=``) and ``lean=False``; imported only then.

Shared here: the connection parameters (:class:`ConnParams`, :func:`parse_url`, Sentinel
URLs included), the backoff between retries (:class:`Backoff`), which replies are worth
a retry, the script policy (:class:`ScriptPolicy`): each script goes as ``FCALL`` of its
Redis Function library where the server allows it, as ``EVALSHA`` otherwise; and
acknowledged writes (:class:`ReplicaAck`: ``WAIT 1`` behind each mutation).

Cancellation remedies both keep (measured with valkey-glide under Trio): a blocking call
runs on a dedicated connection that is closed when the call is cancelled, so the server
drops what it was blocked on; a subscription's messages are delivered by a reader that
is never cancelled but at close; a mutation whose reply matters is carried through a
cancellation for a bounded time (``shield``).
"""

from __future__ import annotations

import abc
import hashlib
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from ..._core import ReplyError as _ReplyError
from ..._core import encode_command
from ..._model._errors import StorageError, ValidationError

__all__ = [
    "Backoff",
    "ConnParams",
    "ReplicaAck",
    "Script",
    "ScriptPolicy",
    "Subscription",
    "Transport",
    "diagnose",
    "hello_role",
    "is_readonly",
    "parse_url",
    "retryable",
    "shielded",
]

log = logging.getLogger("trioqueue.storage.redis")  # the name applications configure

# Error replies and faults worth retrying while the server restarts, fails over or loads.
RETRYABLE_TEXT = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "connection", "Connection",
                  "Broken pipe", "reset by peer", "disconnected", "Disconnected")  # fmt: skip


def retryable(text: str) -> bool:
    """Whether an error (its text) says the server is away or busy for a while."""
    text = text.lower()  # valkey-glide words them its own way ("MasterDown: ...")
    return any(t.lower() in text for t in RETRYABLE_TEXT)


def is_readonly(reply: Any) -> bool:
    """Whether a reply (or one of a batch's replies) is ``READONLY``: the node was demoted."""
    if isinstance(reply, _ReplyError):
        return str(reply).startswith("READONLY")
    if isinstance(reply, list):
        return any(isinstance(r, _ReplyError) and str(r).startswith("READONLY") for r in reply)
    return False


def hello_role(reply: Any) -> str | None:
    """The ``role`` of a ``HELLO 2`` reply (a flat list of names and values)."""
    if isinstance(reply, list):
        for name, value in zip(reply[::2], reply[1::2], strict=False):
            if name == b"role" and isinstance(value, bytes):
                return value.decode()
    return None


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
    # Sentinel mode: the sentinels' addresses, the service (master name) they monitor, and
    # the sentinels' own credentials (host and port above are then unused).
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    # Acknowledged writes: wait (WAIT 1) up to this long for a replica after each mutation.
    replica_ack_timeout: float | None = None

    def display(self, address: tuple[str, int] | None = None) -> str:
        """The server's URL without credentials (``address``: a node of a sentinel
        service instead, e.g. the primary they named)."""
        scheme = "rediss" if self.tls else "redis"
        if address is not None:
            return f"{scheme}://{_hostport(*address)}" + (f"/{self.db}" if self.db else "")
        if self.sentinels:
            where = ",".join(_hostport(h, p) for h, p in self.sentinels)
            return f"{scheme}+sentinel://{where}/{self.service}" + (f"/{self.db}" if self.db else "")
        return f"{scheme}://{self.host}:{self.port}" + (f"/{self.db}" if self.db else "")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_SCHEMES = ("redis", "rediss", "valkey", "valkeys")
SENTINEL_PORT = 26379


def parse_url(url: str, *, cluster: bool = False, **overrides: Any) -> ConnParams:
    """``redis://[user[:password]@]host[:port][/db]``; ``rediss://`` for TLS, with
    ``?ssl_ca_certs=/path/ca.pem`` to trust a private CA or ``?ssl_cert_reqs=none`` to skip
    certificate checks (testing only); ``?replica_ack_timeout=<seconds>`` for
    acknowledged writes. Sentinel:
    ``redis+sentinel://[user[:password]@]host1[:26379],host2[:26379]/service[/db]``
    (``rediss+sentinel://`` for TLS; the credentials are the data nodes';
    ``?sentinel_password=`` and ``?sentinel_username=`` are the sentinels' own).
    Raises :class:`~trioqueue.ValidationError` naming what is wrong."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    sentinel = scheme.endswith("+sentinel")
    if sentinel:
        scheme = scheme[: -len("+sentinel")]
    if not sep or scheme not in _SCHEMES:
        raise ValidationError(
            f"unsupported URL scheme {url.partition('://')[0]!r} in {url!r}"
            " (use redis://, rediss:// or redis+sentinel://)"
        )
    if sentinel:
        if cluster:
            raise ValidationError(f"a Sentinel URL names no cluster: {url!r}")
        netloc, _, after = rest.partition("/")
        userinfo = netloc.rpartition("@")[0]
        parts = urlsplit(f"{scheme}://{userinfo + '@' if userinfo else ''}sentinels/{after}")
        hosts = netloc.rpartition("@")[2]
    else:
        parts = urlsplit(url)
    query = parse_qs(parts.query)
    path = [s for s in parts.path.split("/") if s]
    service = ""
    if sentinel:
        if not path:
            raise ValidationError(f"Sentinel URL without a service name (…/mymaster[/db]): {url!r}")
        service = unquote(path.pop(0))
    if len(path) > 1:
        raise ValidationError(f"unexpected path {parts.path!r} in {url!r} (only a database number)")
    db_text = (path[0] if path else "") or query.get("db", ["0"])[0]
    if not db_text.isdigit():
        raise ValidationError(f"database must be a number, got {db_text!r} in {url!r}")
    cert_reqs = query.get("ssl_cert_reqs", [""])[0].lower()
    params: dict[str, Any] = dict(
        db=int(db_text),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=scheme in ("rediss", "valkeys"),
        insecure_tls=cert_reqs in ("none", "cert_none"),
        ca_certs=query.get("ssl_ca_certs", [None])[0],
        cluster=cluster,
    )
    if sentinel:
        params.update(sentinels=_sentinel_hosts(hosts, url), service=service)
        params.update({k: query[k][0] for k in ("sentinel_username", "sentinel_password") if k in query})
    else:
        try:
            params.update(host=parts.hostname or "127.0.0.1", port=parts.port or 6379)
        except ValueError as exc:  # a port that is not a number
            raise ValidationError(f"{exc} in {url!r}") from exc
    if "replica_ack_timeout" in query:
        params["replica_ack_timeout"] = _seconds(query["replica_ack_timeout"][0], "replica_ack_timeout", url)
    params.update({k: v for k, v in overrides.items() if v is not None})
    conn = ConnParams(**params)
    ack = conn.replica_ack_timeout
    if ack is not None and not 0 < ack < conn.request_timeout:
        raise ValidationError(f"replica_ack_timeout must be > 0 s and less than request_timeout, got {ack!r}")
    if ack is not None and conn.cluster:  # WAIT would have to reach the shard that wrote
        raise ValidationError("replica_ack_timeout is not supported on Redis Cluster")
    return conn


def _sentinel_hosts(text: str, url: str) -> tuple[tuple[str, int], ...]:
    """``host1[:port],host2[:port]`` (``[::1]:26379`` for IPv6): the sentinels."""
    found: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        if item.startswith("["):
            host, _, port_text = item[1:].partition("]")
            port_text = port_text.removeprefix(":")
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValidationError(f"Sentinel URL with an empty sentinel address {item!r} in {url!r}")
        if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            raise ValidationError(f"bad sentinel port {port_text!r} in {url!r}")
        found.append((host, int(port_text) if port_text else SENTINEL_PORT))
    return tuple(found)


def _seconds(text: str, name: str, url: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValidationError(f"{name} must be a number of seconds > 0, got {text!r} in {url!r}")
    return value


async def diagnose(params: ConnParams, address: tuple[str, int] | None = None) -> str | None:
    """Why the server (or ``address``) cannot be reached, in words ("connection refused",
    "no answer within 5 s"...); ``None`` when a TCP connection opens (the client failed
    for another reason: TLS, a password...)."""
    timeout = max(params.connect_timeout, 0.5)
    host, port = address or (params.host, params.port)

    def probe() -> None:
        socket.create_connection((host, port), timeout=timeout).close()

    try:
        await trio.to_thread.run_sync(probe, abandon_on_cancel=True)
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


async def shielded(limit: float, call: Callable[[], Awaitable[Any]]) -> Any:
    """``await call()`` shielded from cancellation for up to ``limit`` seconds (a mutation
    whose reply matters); past that, the caller's cancellation is raised if there is one,
    else :class:`StorageError`."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + limit):
        return await call()
    await trio.lowlevel.checkpoint_if_cancelled()  # the caller was cancelled: honour it now
    raise StorageError(f"Redis did not complete a call within {limit:g} s")


class Backoff:
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


# -- scripts ---------------------------------------------------------------------------


class Script:
    """A Lua script: its source (sent with ``SCRIPT LOAD`` after a ``NOSCRIPT``), its
    SHA1 (``EVALSHA``) and, where it has one, its Redis Function form ``(function name,
    library code)`` (``FCALL``, loaded with ``FUNCTION LOAD REPLACE`` on first use).
    ``acked``: with acknowledged writes, a call waits for a replica (``False``: the script
    only reads, or losing its effect to a failover costs nothing; its owner decides)."""

    __slots__ = ("acked", "code", "library", "name", "sha")

    def __init__(self, name: str, code: str, library: tuple[str, str] | None = None, *, acked: bool = True) -> None:
        self.name = name
        self.code = code
        self.sha = hashlib.sha1(code.encode()).hexdigest()
        self.library = library
        self.acked = acked

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


def refuses_functions(text: str) -> bool:
    """Whether an error to FCALL or FUNCTION LOAD says this server or user has no Functions:
    an older server (unknown command) or an ACL without them (NOPERM)."""
    if "NOPERM" in text:  # not one about keys or channels
        return "'fcall" in text.lower() or "'function" in text.lower()
    return "unknown command" in text or "unknown subcommand" in text


class ScriptPolicy:
    """How a transport sends scripts: ``FCALL`` of their library until the server refuses
    Functions (an older server, an ACL without ``FUNCTION`` or ``FCALL``: ``EVALSHA`` from
    then on, logged once); a library that fails to load for another reason sends only its
    own script as ``EVALSHA``, with a warning."""

    def __init__(self) -> None:
        self.functions = True
        self.eval_only: set[str] = set()  # shas of the scripts whose library would not load

    def function_of(self, script: Script) -> tuple[str, str] | None:
        """The script's Function (name, library code), or None where it goes as EVALSHA."""
        if not self.functions or script.library is None or script.sha in self.eval_only:
            return None
        return script.library

    def command(self, script: Script, keys: Sequence[str | bytes]) -> list[str | bytes]:
        """The head of the script's call: ``FCALL <function> <numkeys>`` or ``EVALSHA
        <sha> <numkeys>`` (keys and arguments follow)."""
        fn = self.function_of(script)
        return ["FCALL", fn[0], str(len(keys))] if fn else ["EVALSHA", script.sha, str(len(keys))]

    def refused(self, script: Script, why: str) -> None:
        """The script's library did not load: no Functions here at all, or not this one."""
        if refuses_functions(why):
            self.no_functions(why)
        else:
            self.eval_only.add(script.sha)
            name = script.library[0] if script.library else script.name
            log.warning("Redis Function %s did not load (%s): its script goes as EVALSHA", name, why)

    def no_functions(self, why: str) -> None:
        if self.functions:
            self.functions = False
            log.info("Redis refused Functions (%s): scripts go as EVALSHA", why)


# -- acknowledged writes -----------------------------------------------------------------

class ReplicaAck:
    """``WAIT 1 <timeout>`` sent behind a mutation on the same connection (it covers
    every write that connection sent before it), and the check of its reply: no replica
    acknowledged in time raises :class:`StorageError` (the write is on the primary, not
    known to be on a replica: a failover now could lose it)."""

    __slots__ = ("args", "command", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.args = ("WAIT", "1", str(max(1, round(timeout * 1000))))
        self.command = encode_command(self.args)

    def check(self, acks: Any) -> None:
        if isinstance(acks, BaseException):
            raise StorageError(f"Redis error waiting for a replica: {acks}")
        if int(acks) < 1:
            raise StorageError(
                f"no replica acknowledged the write within {self.timeout:g} s (replica_ack_timeout):"
                " it is on the primary but a failover now could lose it"
            )


# -- the interface -----------------------------------------------------------------------


class Subscription(abc.ABC):
    """A connection subscribed to one pub/sub channel, whose messages go to the
    ``on_message`` callback it was made with, on the Trio thread."""

    @abc.abstractmethod
    async def run(self) -> None:
        """Deliver messages until cancelled, subscribing again after a reconnect (run it
        in the owner's nursery; a transport that delivers on its own just waits)."""

    @abc.abstractmethod
    async def connection_id(self) -> int | None:
        """An id of the connection currently subscribed, which changes with every new
        one (the owner announces a ``resync`` then); ``None`` while not connected."""

    @abc.abstractmethod
    async def wait_subscribed(self) -> None:
        """Return once the current connection is subscribed; :class:`StorageError` if it
        is not in time."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Unsubscribe and close (shielded; never raises)."""


class Transport(abc.ABC):
    """The commands a storage sends, and how. Every call retries on a lost connection
    and on the server's transient errors (``LOADING``...) until ``retry_timeout``, then
    raises :class:`StorageError`; ``on_fault`` is called at each fault (the storage tells
    its subscribers to resync)."""

    def __init__(self, params: ConnParams, *, retry_timeout: float, on_fault: Callable[[], None]) -> None:
        self.params = params
        self.retry_timeout = retry_timeout
        self._on_fault = on_fault
        self.scripts = ScriptPolicy()
        self._ack = ReplicaAck(params.replica_ack_timeout) if params.replica_ack_timeout else None

    def replica_ack(self, script: Script) -> ReplicaAck | None:
        """The replica acknowledgement a call of ``script`` waits for, if any."""
        if self._ack is None or not script.acked:
            return None
        return self._ack

    @abc.abstractmethod
    async def connect(self) -> None:
        """Reach the server once: :class:`StorageError` at once if it cannot be reached
        (naming it and why), rather than retrying as for a server that went away."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every connection (shielded)."""

    async def watchdog(self) -> None:
        """Timers the transport's calls rely on, run by a running Queue for as long as it
        runs (see :meth:`Storage.watchdog`). Default: nothing to do."""

    @abc.abstractmethod
    async def command(self, args: Sequence[str | bytes]) -> Any:
        """One command's reply."""

    @abc.abstractmethod
    async def commands(self, batch: Sequence[Sequence[str | bytes]]) -> list[Any]:
        """Several read-only commands in one round trip (not a transaction): their replies.
        An error reply from a server that cannot serve for a while (LOADING, MASTERDOWN …)
        sends the batch again, as :meth:`command` does; another raises
        :class:`StorageError`."""

    @abc.abstractmethod
    async def script(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes], *, shield: float | None = None
    ) -> Any:
        """Run ``script`` (FCALL or EVALSHA, see :class:`ScriptPolicy`; a missing library
        or script is loaded and the call sent again). ``shield`` (seconds): a mutation
        whose reply matters; once sent it is carried through a cancellation for up to
        that long (its reply is returned; the cancellation comes at the caller's next
        checkpoint). With acknowledged writes (:meth:`replica_ack`), the reply comes once
        a replica has the write; :class:`StorageError` if none did in time."""

    @abc.abstractmethod
    async def blocking_move_then(
        self, src: str, dst: str, timeout: float, script: Script, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> tuple[bytes | None, Any]:
        """``BLMOVE src dst LEFT RIGHT timeout`` on a dedicated connection with ``script``
        pipelined behind it on the same connection: the server runs the script as soon
        as the move returns (or times out), with no round trip in between. Returns
        ``(moved entry or None, the script's reply)``; the reply is the exception the
        script raised instead (say NOSCRIPT after a ``SCRIPT FLUSH``), for the caller to
        run it the ordinary way. Cancellation closes the connection (the server drops the
        blocked command and the script behind it); faults raise :class:`StorageError`
        (the caller retries)."""

    @abc.abstractmethod
    async def blocking_call(self, args: Sequence[str], timeout: float) -> Any:
        """A blocking command (``XREAD BLOCK ...``) on a dedicated connection, closed if
        the call is cancelled."""

    @abc.abstractmethod
    async def subscribe(self, channel: str, on_message: Callable[[bytes], None]) -> Subscription:
        """A subscription to ``channel``, subscribed when this returns."""
