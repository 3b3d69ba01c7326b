"""The one interface between :class:`~trioqueue.storage.RedisStorage` and a server, and
what its two implementations share.

:class:`Transport` is what the storage talks to: a command, several commands in one round
trip, a script call, a blocking call (with a script pipelined behind a blocking move), a
subscription. Two implementations, chosen once when the storage is made (``_storage``):

- ``lean`` (:mod:`._lean`, the default on a standalone server): the lean client of
  :mod:`._resp`, a Trio socket with RESP parsed in Rust, about 2.5x cheaper per awaited
  call than valkey-glide under Trio (``benches/bench_resp.py``). It needs no valkey-glide.
- ``glide`` (:mod:`._glide`): valkey-glide, for Redis Cluster, an application's own
  client (``client=``) and ``lean=False``; imported only then.

Shared here: the connection parameters (:class:`ConnParams`, :func:`parse_url`), the
backoff between retries (:class:`Backoff`), which replies are worth a retry, and the
script policy (:class:`ScriptPolicy`): each script goes as ``FCALL`` of its Redis
Function library where the server allows it, as ``EVALSHA`` otherwise.

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

from ..._model._errors import StorageError, ValidationError

__all__ = [
    "Backoff",
    "ConnParams",
    "Script",
    "ScriptPolicy",
    "Subscription",
    "Transport",
    "diagnose",
    "parse_url",
    "retryable",
    "shielded",
]

log = logging.getLogger("trioqueue.storage.redis")

# Error replies and faults worth retrying while the server restarts, fails over or loads.
RETRYABLE_TEXT = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "connection", "Connection",
                  "Broken pipe", "reset by peer", "disconnected", "Disconnected")  # fmt: skip


def retryable(text: str) -> bool:
    """Whether an error (its text) says the server is away or busy for a while."""
    text = text.lower()  # valkey-glide words them its own way ("MasterDown: ...")
    return any(t.lower() in text for t in RETRYABLE_TEXT)


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


async def diagnose(params: ConnParams) -> str | None:
    """Why the server cannot be reached, in words ("connection refused", "no answer
    within 5 s"...); ``None`` when a TCP connection opens (the client failed for another
    reason: TLS, a password...)."""
    timeout = max(params.connect_timeout, 0.5)

    def probe() -> None:
        socket.create_connection((params.host, params.port), timeout=timeout).close()

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
    library code)`` (``FCALL``, loaded with ``FUNCTION LOAD REPLACE`` on first use)."""

    __slots__ = ("code", "library", "name", "sha")

    def __init__(self, name: str, code: str, library: tuple[str, str] | None = None) -> None:
        self.name = name
        self.code = code
        self.sha = hashlib.sha1(code.encode()).hexdigest()
        self.library = library

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
    """The commands RedisStorage sends, and how. Every call retries on a lost connection
    and on the server's transient errors (``LOADING``...) until ``retry_timeout``, then
    raises :class:`StorageError`; ``on_fault`` is called at each fault (the storage tells
    its subscribers to resync)."""

    def __init__(self, params: ConnParams, *, retry_timeout: float, on_fault: Callable[[], None]) -> None:
        self.params = params
        self.retry_timeout = retry_timeout
        self._on_fault = on_fault
        self.scripts = ScriptPolicy()

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
        checkpoint)."""

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
