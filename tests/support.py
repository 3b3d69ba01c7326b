"""Test helpers shared by the suite (imported as ``support``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from trioqueue import QueueEvent


class Recorder:
    """An event callback that records what it is given and lets a test wait for a
    condition on the recorded events (woken by each event, never by a timer)."""

    def __init__(self) -> None:
        self.events: list[QueueEvent] = []
        self._changed = trio.Event()

    def __call__(self, event: QueueEvent) -> None:
        self.events.append(event)
        self._changed.set()

    def ids(self, name: str | None = None) -> list[str | None]:
        return [e.job_id for e in self.events if name is None or e.name == name]

    async def wait_until(self, predicate: Callable[[list[QueueEvent]], bool]) -> None:
        while not predicate(self.events):
            if self._changed.is_set():  # (a new one only then: other tasks may wait on it)
                self._changed = trio.Event()
            await self._changed.wait()

    async def wait_for(self, name: str, job_id: str | None = None, count: int = 1) -> None:
        await self.wait_until(
            lambda evs: sum(1 for e in evs if e.name == name and (job_id is None or e.job_id == job_id)) >= count
        )


class ProcessLines:
    """Line-by-line reader of a child process's stdout, under Trio."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self.process = process
        self._stream = process.stdout
        self._buf = b""

    async def readline(self) -> str:
        while b"\n" not in self._buf:
            chunk = await self._stream.receive_some(4096)
            if not chunk:
                raise EOFError(f"process {self.process.pid} closed its stdout (exit code {self.process.returncode})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    async def wait_for(self, prefix: str) -> str:
        while not (line := await self.readline()).startswith(prefix):
            pass
        return line


TESTS = Path(__file__).resolve().parent
"""The suite's root folder (``tests/``): its helper modules are importable from every test
folder (``conftest.py`` puts the folders on ``sys.path``)."""
HELPERS = TESTS / "helpers"
"""The programs the tests run as separate processes."""
