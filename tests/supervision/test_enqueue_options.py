"""The enqueue options are declared once (``trioqueue.EnqueueOptions``) and every way of
enqueueing takes each of them with the same effect: the Queue's three methods, the sync and
asyncio producers, and ``trioqueue enqueue`` on the command line. (The dashboard enqueues
nothing: it retries, cancels and removes.) An option added to the declaration and not to
:data:`EFFECTS` below fails here, and so does a way of enqueueing that drops one."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from trioqueue import AsyncioProducer, Child, EnqueueOptions, JobState, Queue, SyncProducer, ValidationError
from trioqueue._core import decode_envelope
from trioqueue._model._options import ENQUEUE_OPTIONS, JobOptions
from trioqueue.cli import main
from trioqueue.storage import FileStorage, MemoryStorage, Storage

QUEUE = "opts"
AT = time.time() + 3600.0

# option -> (a value other than the default, what the stored job must then show)
EFFECTS: dict[str, tuple[Any, Any]] = {
    "max_attempts": (7, lambda rec, env, opts: rec.max_attempts == 7 and env[4] == 7),
    "result_ttl": (12.5, lambda rec, env, opts: env[5] == 12500),
    "retry_delay": (0.25, lambda rec, env, opts: opts.retry_delay == 0.25),
    "job_timeout": (9.0, lambda rec, env, opts: opts.job_timeout == 9.0),
    "delay": (600.0, lambda rec, env, opts: rec.state.startswith("delayed") and opts.run_at is not None),
    "at": (AT, lambda rec, env, opts: rec.state.startswith("delayed") and abs(opts.run_at - AT) < 0.01),
    "priority": (1, lambda rec, env, opts: rec.priority == 1),
    "debounce": (600.0, lambda rec, env, opts: rec.state.startswith("delayed")),
    # (with debounce=600, its companion): due within max_wait of its creation
    "max_wait": (30.0, lambda rec, env, opts: int(rec.state.split(":")[2]) <= env[2] + 31_000),
    "dedup_window": (7200.0, lambda rec, env, opts: env[5] == 7_200_000),  # its record kept that long
    "group": ("tenant-42", lambda rec, env, opts: rec.group == "tenant-42"),
    # a child per job (ids are unique per storage): the job waits for it
    "children": (lambda jid: [Child(f"{jid}-child")], lambda rec, env, opts: rec.state.startswith("waiting_children")),
    # (its effect, on a tree, is tested in test_flows.py: here, that it is taken)
    "on_child_failure": ("continue", lambda rec, env, opts: rec.state.startswith("queued")),
    # an existing job (PREREQUISITES): the job waits for it (test_dependencies.py tests the rest)
    "depends_on": (["dep"], lambda rec, env, opts: rec.state.startswith("waiting_children")),
}

# jobs enqueued first for an option (by every way of enqueueing: same storage)
PREREQUISITES: dict[str, list[str]] = {"depends_on": ["dep"]}


# options that need another one
COMPANIONS: dict[str, dict[str, Any]] = {"max_wait": {"debounce": 600.0}}


def _options(option: str, job_id: str) -> dict[str, Any]:
    """``option`` for job ``job_id``, with its companions."""
    return {option: _value(option, job_id), **COMPANIONS.get(option, {})}


def _value(option: str, job_id: str) -> Any:
    """The value of ``option`` for job ``job_id``."""
    value = EFFECTS[option][0]
    return value(job_id) if callable(value) else value


def _cli_value(option: str, job_id: str) -> str:
    value = _value(option, job_id)
    if option == "children":
        return json.dumps([{"id": c.id} for c in value])
    if option == "depends_on":
        return json.dumps(value)
    return str(value)


def test_the_options_declared_are_the_options_tested() -> None:
    assert list(EFFECTS) == list(ENQUEUE_OPTIONS) == list(EnqueueOptions.__annotations__)


async def _check_stored(storage: Storage, job_id: str, option: str) -> None:
    rec = await storage.get_job(QUEUE, job_id)
    envelope = await storage.get_envelope(QUEUE, job_id)
    assert rec is not None and envelope is not None, (option, job_id)
    env = decode_envelope(envelope)
    opts = JobOptions.decode(env[7])
    assert EFFECTS[option][1](rec, env, opts), (option, rec, env, opts)


@pytest.mark.parametrize("option", list(EFFECTS))
async def test_every_queue_method_takes_every_option(option: str) -> None:
    storage = MemoryStorage()
    async with Queue(storage, name=QUEUE, block_timeout=0.1) as q:
        for first in PREREQUISITES.get(option, []):
            await q.enqueue(first, 1)
        await q.enqueue("one", 1, **_options(option, "one"))
        await q.enqueue_many([("many", 1)], **_options(option, "many"))
        async with trio.open_nursery() as nursery:  # nobody runs it: the wait times out
            nursery.start_soon(lambda: _wait_quietly(q, _options(option, "wait")))
            await trio.testing.wait_all_tasks_blocked(0.05)
        for job_id in ("one", "many", "wait"):
            await _check_stored(storage, job_id, option)


async def _wait_quietly(q: Queue[Any, Any], options: dict[str, Any]) -> None:
    with pytest.raises(TimeoutError):
        await q.enqueue_and_wait("wait", 1, timeout=0.2, **options)


@pytest.mark.parametrize("option", list(EFFECTS))
async def test_the_producers_take_every_option(option: str, tmp_path: Path) -> None:
    def sync_side() -> None:
        with SyncProducer(tmp_path / "store", name=QUEUE) as producer:
            for first in PREREQUISITES.get(option, []):
                producer.enqueue(first, 1)
            producer.enqueue("sync", 1, **_options(option, "sync"))
            producer.enqueue_many([("sync-many", 1)], **_options(option, "sync-many"))

    async def asyncio_side() -> None:
        async with AsyncioProducer(tmp_path / "store", name=QUEUE) as producer:
            await producer.enqueue("aio", 1, **_options(option, "aio"))
            await producer.enqueue_many([("aio-many", 1)], **_options(option, "aio-many"))

    await trio.to_thread.run_sync(sync_side)
    await trio.to_thread.run_sync(asyncio.run, asyncio_side())
    async with FileStorage(tmp_path / "store") as storage:
        for job_id in ("sync", "sync-many", "aio", "aio-many"):
            await _check_stored(storage, job_id, option)


@pytest.mark.parametrize("option", list(EFFECTS))
def test_the_command_line_takes_every_option(option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path / 'store'}"
    flags = [f"--{option.replace('_', '-')}", _cli_value(option, "cli")]
    for other, value in COMPANIONS.get(option, {}).items():
        flags += [f"--{other.replace('_', '-')}", str(value)]
    for first in PREREQUISITES.get(option, []):
        assert main(["enqueue", first, "--payload", "1", "--storage", url, "--name", QUEUE]) == 0
        capsys.readouterr()
    code = main(["enqueue", "cli", "--payload", "1", *flags, "--storage", url, "--name", QUEUE, "--json"])
    assert code == 0, capsys.readouterr()
    assert json.loads(capsys.readouterr().out)["status"] == "queued"

    async def check() -> None:
        async with FileStorage(tmp_path / "store") as storage:
            await _check_stored(storage, "cli", option)

    trio.run(check)


async def test_an_unknown_option_is_refused_naming_it_and_the_job_and_writes_nothing() -> None:
    storage = MemoryStorage()
    async with Queue(storage, name=QUEUE) as q:
        with pytest.raises(TypeError, match=r"unknown enqueue option 'priorty' \(job 'x'\)"):
            await q.enqueue("x", 1, priorty=1)  # type: ignore[call-arg]
        with pytest.raises(ValidationError, match=r"priority must be from 0 to 9, got 12 \(job 'ok'\)"):
            await q.enqueue_many([("ok", 1), ("y", 1)], priority=12)
        assert await q.get_status("x") is None and await q.get_status("ok") is None
        assert (await q.enqueue("z", 1, max_attempts=None)).status.value == "queued"  # None: the queue's
        status = await q.get_status("z")
        assert status is not None and status.priority == 5 and status.state is JobState.QUEUED
