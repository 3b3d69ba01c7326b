"""Redis Sentinel: where the primary of a monitored service is, and when it moves.

A storage made from sentinels (``redis+sentinel://h1:26379,h2:26379/mymaster/0`` or
:meth:`RedisStorage.from_sentinels`) asks them for the primary's address
(``SENTINEL get-master-addr-by-name``, each sentinel in turn until one answers) whenever
it opens a connection and knows of no primary; a connection to it counts only once the
node itself says it is the primary (``role master`` in its ``HELLO``), so a stale answer in
the middle of a failover is asked again (with the transport's backoff). The primary is
forgotten, and asked for again, when a connection to it fails, when it answers
``READONLY`` (demoted: it is a replica now), and when the sentinels announce
``+switch-master`` on their pub/sub (:meth:`Sentinels.watch`, run by a running Queue
through the storage's watchdog); the connections still open to the old primary are then
closed, so subscriptions subscribe again on the new one (their listeners get a
``resync``).

The sentinels are reached with the lean client's connections (:mod:`._client`), whichever
transport the storage uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import trio

from ..._core import encode_command
from ..._model._errors import StorageError, ValidationError
from ._client import ConnectionLost, ReplyError, RespClient, RespConnection
from ._transport import ConnParams, hello_role, log

__all__ = ["Address", "Sentinels", "sentinel_url"]

Address = tuple[str, int]


class Sentinels:
    """The sentinels of one service, and the primary they last named (see the module
    docstring). One per transport."""

    def __init__(self, params: ConnParams) -> None:
        if not params.sentinels or not params.service:
            raise ValueError("Sentinels need sentinel addresses and a service name")
        self.params = params
        self.service = params.service
        self._order: list[Address] = list(params.sentinels)  # the one that answered last first
        self._primary: Address | None = None
        self._lock = trio.Lock()
        self._clients = {
            addr: RespClient(
                ConnParams(
                    host=addr[0],
                    port=addr[1],
                    username=params.sentinel_username,
                    password=params.sentinel_password,
                    tls=params.tls,
                    insecure_tls=params.insecure_tls,
                    ca_certs=params.ca_certs,
                    request_timeout=params.request_timeout,
                    connect_timeout=params.connect_timeout,
                )
            )
            for addr in params.sentinels
        }

    @property
    def known(self) -> Address | None:
        """The primary last named, if not forgotten since."""
        return self._primary

    async def primary(self) -> Address:
        """The primary's address: the one known, else the sentinels' answer.
        :class:`ConnectionLost` when no sentinel names one (the caller backs off and
        asks again). Never ``None``: a :meth:`forget` that lands while this checkpoints
        makes it ask the sentinels."""
        if self._primary is not None:
            await trio.lowlevel.checkpoint()
            known = self._primary  # read after the checkpoint: forgotten meanwhile, or moved
            if known is not None:
                return known
        async with self._lock:  # one question at a time: the others take its answer
            if self._primary is None:
                self._primary = await self.ask()
            return self._primary

    def forget(self, address: Address | None) -> None:
        """``address`` is no primary now (unreachable, a replica, demoted): ask again."""
        if address is not None and self._primary == address:
            self._primary = None

    def moved(self, new: Address) -> None:
        """The sentinels named ``new`` as the primary."""
        self._primary = new

    async def ask(self) -> Address:
        """Ask each sentinel in turn for the primary's address (the first answer wins, and
        its sentinel is asked first from then on)."""
        why: list[str] = []
        for addr in list(self._order):
            try:
                conn = await self._clients[addr].open_connection()
            except (ConnectionLost, StorageError) as exc:
                why.append(f"sentinel {addr[0]}:{addr[1]}: {exc}")
                continue
            try:
                reply = await conn.call(encode_command(("SENTINEL", "get-master-addr-by-name", self.service)))
            except ConnectionLost as exc:
                why.append(f"sentinel {addr[0]}:{addr[1]}: {exc}")
                continue
            finally:
                await conn.aclose()
            if isinstance(reply, ReplyError) or not (isinstance(reply, list) and len(reply) == 2):
                unknown = reply is None
                why.append(
                    f"sentinel {addr[0]}:{addr[1]}: "
                    + (f"does not monitor {self.service!r}" if unknown else f"answered {reply!r:.100}")
                )
                continue
            self._order.remove(addr)
            self._order.insert(0, addr)
            return (reply[0].decode(), int(reply[1]))
        raise ConnectionLost(f"no sentinel named the primary of {self.service!r} ({'; '.join(why)})")

    async def verified_primary(self, client: RespClient) -> Address:
        """:meth:`primary`, checked on a connection of its own (``client``: one made with
        the data nodes' parameters) to say ``role master``; forgotten and
        :class:`ConnectionLost` otherwise. For a transport that does not connect through
        the lean client (valkey-glide)."""
        address = await self.primary()
        try:
            conn = await client.open_connection_to(address)
        except ConnectionLost:
            self.forget(address)
            raise
        try:
            role = hello_role(await conn.call(encode_command(("HELLO", "2"))))
        finally:
            await conn.aclose()
        if role != "master":
            self.forget(address)
            raise ConnectionLost(f"{address[0]}:{address[1]} is not the primary of {self.service!r} (role {role})")
        return address

    async def watch(self, on_switch: Callable[[Address | None, Address], Awaitable[None]]) -> None:
        """Follow the sentinels' ``+switch-master`` announcements until cancelled:
        ``on_switch(old, new)`` for each one about this service, and once after each
        (re)subscription when the primary named then is not the one known (a switch may
        have been announced while no sentinel was listened to). Sentinels that are away
        are tried in turn, with backoff."""
        delay = 0.05
        while True:
            for addr in list(self._order):
                try:
                    conn = await self._subscribe(addr)
                except (ConnectionLost, StorageError):
                    continue
                try:
                    delay = 0.05
                    try:
                        named = await self.ask()
                    except ConnectionLost:
                        named = None
                    if named is not None and named != self._primary:
                        await on_switch(self._primary, named)
                    while True:
                        for push in await conn.receive_pushes():
                            switch = self._switch_of(push)
                            if switch is not None:
                                log.warning(
                                    "Redis Sentinel +switch-master: the primary of %r moved from %s:%d to %s:%d",
                                    self.service, *switch[0], *switch[1],
                                )  # fmt: skip
                                await on_switch(*switch)
                except ConnectionLost:
                    pass
                finally:
                    await conn.aclose()
            await trio.sleep(delay)  # every sentinel away: back off, then try them again
            delay = min(delay * 2, 1.0)

    async def _subscribe(self, addr: Address) -> RespConnection:
        conn = await self._clients[addr].open_connection()
        try:
            await conn.send(encode_command(("SUBSCRIBE", "+switch-master")))
            confirmed: list[Any] = []
            with trio.move_on_after(self.params.request_timeout):
                while not confirmed:
                    confirmed = await conn.receive_pushes()
            if not confirmed or not (isinstance(confirmed[0], list) and confirmed[0][:1] == [b"subscribe"]):
                raise ConnectionLost(f"sentinel {addr[0]}:{addr[1]} did not subscribe: {confirmed!r:.100}")
        except BaseException:
            await conn.aclose()
            raise
        return conn

    def _switch_of(self, push: Any) -> tuple[Address, Address] | None:
        """``(old, new)`` of a ``+switch-master`` message about this service."""
        if not (isinstance(push, list) and len(push) == 3 and push[0] == b"message"):
            return None
        fields = bytes(push[2]).decode(errors="replace").split()
        if len(fields) != 5 or fields[0] != self.service:
            return None
        try:
            return (fields[1], int(fields[2])), (fields[3], int(fields[4]))
        except ValueError:
            return None


def sentinel_url(
    sentinels: Sequence[str | tuple[str, int]],
    *,
    service: str,
    db: int = 0,
    username: str | None = None,
    password: str | None = None,
    sentinel_username: str | None = None,
    sentinel_password: str | None = None,
    tls: bool = False,
) -> str:
    """The ``redis+sentinel://`` URL of :meth:`RedisStorage.from_sentinels`'s arguments."""
    if isinstance(sentinels, str):
        raise ValidationError(f"sentinels must be a list of addresses, got the string {sentinels!r}")
    hosts: list[str] = []
    for s in sentinels:
        if isinstance(s, str):
            hosts.append(s)
        else:
            try:
                host, port = str(s[0]), int(s[1])
            except (TypeError, ValueError, IndexError) as exc:
                raise ValidationError(f"a sentinel address is 'host:port' or (host, port), got {s!r}") from exc
            hosts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if not hosts:
        raise ValidationError("from_sentinels needs at least one sentinel address")
    if not service or "/" in service:
        raise ValidationError(f"service must be the sentinels' master name, got {service!r}")
    auth = ""
    if username is not None or password is not None:
        auth = quote(username or "", safe="") + (f":{quote(password, safe='')}" if password is not None else "") + "@"
    query = urlencode({k: v for k, v in (("sentinel_username", sentinel_username), ("sentinel_password", sentinel_password)) if v})
    url = f"{'rediss' if tls else 'redis'}+sentinel://{auth}{','.join(hosts)}/{quote(service, safe='')}/{int(db)}"
    return url + (f"?{query}" if query else "")
