"""FileStorage's group commit (``Syncer``): how a flush's failure reaches the callers."""

from __future__ import annotations

import threading
from pathlib import Path

import trio
import trio.testing

from trioqueue.storage.file import _groupcommit
from trioqueue.storage.file._groupcommit import Syncer


async def test_ctrl_c_during_a_group_fsync_stays_a_keyboard_interrupt(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C landing while a group's fsync runs must reach the program as
    KeyboardInterrupt (exit 130, jobs back in the queue), not as ``OSError: fsync failed``
    (which the demo reported as an error, exit 1). The other caller of that group learns
    that its data may not be durable (OSError)."""
    gate = threading.Event()
    calls = []

    def flush(self: _groupcommit._Batch, syncfs_fd: int) -> None:
        calls.append(1)
        if len(calls) == 1:
            gate.wait(10)  # the first group's flush runs while the second group gathers
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(_groupcommit._Batch, "flush", flush)
    syncer = Syncer(-1)
    outcomes: list[BaseException | None] = []

    async def caller() -> None:
        try:
            await syncer.sync([], set())
            outcomes.append(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcomes.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)  # carries the first group
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(caller)  # these two share the second group
        nursery.start_soon(caller)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert outcomes[0] is None and len(calls) == 2
    kinds = sorted(type(e).__name__ for e in outcomes[1:])
    assert kinds == ["KeyboardInterrupt", "OSError"], outcomes


async def test_a_failed_fsync_is_an_oserror_for_every_caller_of_the_group(tmp_path: Path, monkeypatch) -> None:
    def failing_flush(self: _groupcommit._Batch, syncfs_fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_groupcommit._Batch, "flush", failing_flush)
    syncer = Syncer(-1)
    errors: list[BaseException] = []

    async def caller() -> None:
        try:
            await syncer.sync([], set())
        except OSError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(caller)
    assert len(errors) == 3 and all("Input/output error" in str(e) for e in errors)
