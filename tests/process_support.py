"""Helpers of the tests of worker processes and process pools (imported as
``process_support``): sync handlers for ``Queue(executor="process")`` (module-level, so a
pool process imports them), a test-side listener those handlers report to, and a check of
the process table."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import trio

from trioqueue import Job


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux: the process table)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def busy(seconds: float) -> int:
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


def report(port: int) -> socket.socket:
    """Connect to the test's :class:`Listener` and tell it this process's pid."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(f"{os.getpid()}\n".encode())
    return conn


# -- handlers run in a pool process -------------------------------------------------------


def crunch(job: Job[Any]) -> dict[str, Any]:
    """CPU-bound for ``job.payload`` seconds; the pid it ran in."""
    return {"pid": os.getpid(), "loops": busy(float(job.payload)) > 0}


def spin(job: Job[Any]) -> None:
    """Report to the test's listener (port ``job.payload``), then loop forever (no port:
    return at once, which warms the pool up)."""
    if job.payload is None:
        return
    conn = report(job.payload)  # kept open until the process is killed
    while conn:
        busy(1.0)


def write_late(job: Job[Any]) -> None:
    """Report to the test's listener (``job.payload["port"]``), work for
    ``job.payload["seconds"]``, then write the file ``job.payload["path"]``."""
    conn = report(job.payload["port"])
    busy(job.payload["seconds"])
    with open(job.payload["path"], "w") as f:
        f.write(str(os.getpid()))
    conn.close()


def fail(job: Job[Any]) -> None:
    raise ValueError(f"cannot handle {job.payload!r}")


class _Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def fail_unpicklable(job: Job[Any]) -> None:
    raise _Unpicklable(f"holding a lock for {job.id}")


def progress(job: Job[Any]) -> None:
    job.report_progress(0.5)


def step(job: Job[Any]) -> None:
    job.step("charge", abs, -1)  # (raises at once: no coroutine left unawaited)


def sleep(job: Job[Any]) -> None:
    job.sleep("nap", 60)  # (raises at once: no coroutine left unawaited)


def unencodable(job: Job[Any]) -> set[int]:
    return {1, 2}  # not JSON


# -- the test's side ------------------------------------------------------------------------


class Listener:
    """A TCP listener on 127.0.0.1 that handlers report to (:func:`report`): each
    :meth:`accept` returns the reporting process's pid and its connection, whose end (EOF)
    says that process is gone."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self._listener = listener
        self.port: int = listener.socket.getsockname()[1]

    @classmethod
    async def open(cls) -> Listener:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        return cls(listener)

    async def accept(self) -> tuple[int, trio.SocketStream]:
        stream = await self._listener.accept()
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(64)
            assert chunk, "the handler closed its connection before reporting"
            data += chunk
        return int(data), stream

    async def aclose(self) -> None:
        await self._listener.aclose()


async def until_closed(stream: trio.SocketStream) -> None:
    """Return when the other end of ``stream`` closed (its process died)."""
    try:
        while await stream.receive_some(64):
            pass
    except trio.BrokenResourceError:
        pass
