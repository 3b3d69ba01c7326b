"""The admin commands of the installed ``trioqueue`` console script, run as subprocesses
against a FileStorage directory and the suite's real Redis, while the test looks at (and
works on) the same storage through its own Queue."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from trioqueue import FileStorage, Job, JobState, Queue, Storage
from trioqueue.storage import RedisStorage

from support import Recorder

TRIOQUEUE = str(Path(sys.executable).parent / "trioqueue")


class Cli:
    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name

    async def run(self, *args: str, ok: bool = True) -> trio.CompletedProcess[bytes]:
        cmd = [TRIOQUEUE, *args, "--storage", self.url, "--name", self.name]
        with trio.fail_after(60):
            proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
        if ok:
            assert proc.returncode == 0, proc.stderr.decode()
        return proc

    async def json(self, *args: str) -> Any:
        return json.loads((await self.run(*args, "--json")).stdout)

    async def error(self, *args: str) -> str:
        """Run a command that must fail with one line on stderr; return that line."""
        proc = await self.run(*args, ok=False)
        assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trioqueue: error: "), lines
        return lines[0]


@pytest.fixture(params=["file", "redis", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path, queue_name: str) -> tuple[Cli, Callable[[], Storage]]:
    """The CLI and a factory of the same storage for the test's own Queue."""
    if request.param == "file":
        store = tmp_path / "store"
        return Cli(f"file://{store}", queue_name), lambda: FileStorage(store)
    if request.param == "postgres":
        from trioqueue.storage.postgres import PostgresStorage

        schema = f"cli_{queue_name.replace('-', '_')}"
        url = f"{request.getfixturevalue('postgres_url')}?schema={schema}"
        return Cli(url, queue_name), lambda: PostgresStorage(url.split("?")[0], schema=schema)
    url = request.getfixturevalue("redis_url")
    return Cli(url, queue_name), lambda: RedisStorage(url)  # the CLI's default prefix


async def double(job: Job[Any]) -> Any:
    if job.payload == "bad":
        raise ValueError("cannot double 'bad'")
    return job.payload * 2


async def test_admin_commands(target: tuple[Cli, Callable[[], Storage]]) -> None:
    cli, make_storage = target
    # Work done by a real worker: one completed job, one failed (with a traceback).
    done = Recorder()
    async with Queue(make_storage(), name=cli.name, handler=double, max_attempts=1, block_timeout=0.5) as q:
        q.on("completed", done)
        q.on("failed", done)
        await q.enqueue("ok", 21)
        await q.enqueue("bad", "bad")
        with trio.fail_after(30):
            await done.wait_until(lambda evs: len(evs) == 2)

    assert "queued" in (await cli.run("enqueue", "q1", "--payload", '{"n": 1}')).stdout.decode()
    for jid in ("q2", "q3"):
        await cli.run("enqueue", jid, "--payload", "[1, 2]")
    assert (await cli.json("enqueue", "later", "--payload", "null", "--delay", "3600"))["status"] == "queued"
    assert (await cli.json("enqueue", "after", "--payload", "null", "--depends-on", f'["later", ["{cli.name}", "q1"]]'))["status"] == "queued"
    assert "'ghost'" in await cli.error("enqueue", "never", "--payload", "null", "--depends-on", '["ghost"]')
    assert (await cli.json("show", "after"))["state"] == "waiting_children"
    await cli.run("remove", "after")
    stats = await cli.json("stats")
    assert stats[cli.name]["counts"] == {
        "queued": 3, "processing": 0, "failing": 0, "completed": 1, "failed": 1, "cancelled": 0, "delayed": 1,
        "waiting_children": 0, "waiting_signal": 0,
    }  # fmt: skip
    table = (await cli.run("stats")).stdout.decode()
    assert table.splitlines()[0].split()[:3] == ["queue", "queued", "processing"] and cli.name in table

    # list: newest first, paged with the printed cursor
    page = await cli.json("list", "queued", "--limit", "2")
    assert [j["id"] for j in page["jobs"]] == ["q3", "q2"] and page["cursor"]
    rest = await cli.json("list", "queued", "--limit", "2", "--cursor", page["cursor"])
    assert [j["id"] for j in rest["jobs"]] == ["q1"] and rest["cursor"] is None
    human = (await cli.run("list", "queued", "--limit", "2")).stdout.decode()
    assert human.splitlines()[-1] == f"more: --cursor {page['cursor']}"
    [failed] = (await cli.json("list", "failed"))["jobs"]
    assert failed["id"] == "bad" and failed["error"]["message"] == "cannot double 'bad'"

    # show: the error with its traceback; JSON for scripts
    shown = (await cli.run("show", "bad")).stdout.decode()
    assert "error:      ValueError: cannot double 'bad'" in shown and "Traceback" in shown
    assert (await cli.json("show", "ok"))["result"] == 42
    assert "not found" in await cli.error("show", "nope")

    # retry, cancel, remove, purge, pause/resume
    assert "only failed or cancelled" in await cli.error("retry", "q1")
    await cli.run("retry", "bad")
    assert (await cli.json("show", "bad"))["state"] == "queued"
    await cli.run("cancel", "later")
    assert "not found" in await cli.error("cancel", "nope")
    assert "already completed" in await cli.error("cancel", "ok")
    await cli.run("remove", "q1")
    assert "unknown" in await cli.error("remove", "q1")
    assert (await cli.json("purge", "completed", "--older-than", "3600"))["purged"] == 0
    assert (await cli.json("purge", "completed"))["purged"] == 1
    assert (await cli.json("pause"))["changed"] is True
    async with Queue(make_storage(), name=cli.name) as q:
        assert await q.is_paused()
        counts = await q.counts()
        assert (counts[JobState.QUEUED], counts[JobState.CANCELLED], counts[JobState.COMPLETED]) == (3, 1, 0)
    assert "was already paused" in (await cli.run("pause")).stdout.decode()
    assert (await cli.json("resume"))["changed"] is True

    # clear: refused without --yes (nothing cleared), then every job of every state goes
    line = await cli.error("clear")
    assert "--yes" in line and repr(cli.name) in line and "nothing was cleared" in line
    assert sum((await cli.json("stats"))[cli.name]["counts"].values()) == 4
    assert await cli.json("clear", "--yes") == {"queue": cli.name, "cleared": 4, "schedules_removed": False}
    assert set((await cli.json("stats"))[cli.name]["counts"].values()) == {0}
    assert "0 jobs forgotten" in (await cli.run("clear", "--yes")).stdout.decode()


async def test_enqueue_wait_prints_the_result_or_the_failure(target: tuple[Cli, Callable[[], Storage]]) -> None:
    cli, make_storage = target
    async with Queue(make_storage(), name=cli.name, handler=double, max_attempts=1, block_timeout=0.5):
        assert await cli.json("enqueue", "w", "--payload", '"ab"', "--wait") == {"id": "w", "result": "abab"}
        assert (await cli.run("enqueue", "w2", "--payload", "4", "--wait")).stdout.decode().strip() == "8"
        line = await cli.error("enqueue", "w3", "--payload", '"bad"', "--wait", "--timeout", "30")
        assert "'w3'" in line and "cannot double 'bad'" in line


async def test_usage_errors_and_help(tmp_path: Path) -> None:
    cli = Cli(str(tmp_path / "store"), "jobs")
    line = await cli.error("enqueue", "x", "--payload", "{bad")
    assert "--payload is not valid JSON" in line
    proc = await cli.run("list", "nope", ok=False)
    assert proc.returncode == 2 and b"invalid choice: 'nope'" in proc.stderr
    proc = await Cli("bogus://x", "jobs").run("stats", ok=False)
    assert proc.returncode == 2 and b"bogus://x" in proc.stderr  # a bad --storage is a usage error
    for command in ("stats", "list", "show", "cancel", "retry", "remove", "purge", "clear", "pause", "resume", "enqueue"):
        with trio.fail_after(60):
            out = (await trio.run_process([TRIOQUEUE, command, "--help"], capture_stdout=True)).stdout.decode()
        assert "--storage URL" in out and "(default:" in out, command


async def test_stats_by_group(target: tuple[Cli, Callable[[], Storage]]) -> None:
    cli, make_storage = target
    async with Queue(make_storage(), name=cli.name) as q:
        await q.enqueue_many([(f"a{i}", i) for i in range(3)], group="tenant-a")
        await q.enqueue("b0", 0, group="tenant-b")
        await q.enqueue("plain", 0)
        assert await q.pause_group("tenant-c")
        [claim] = await q.storage.dequeue(q.name, "w", 1, 1.0, 60.0)
    assert claim.id == "a0"  # the first turn: tenant-a's first job
    stats = await cli.json("stats", "--group")
    groups = stats[cli.name]["groups"]
    assert groups == {
        "": {"queued": 1, "processing": 0, "paused": False},
        "tenant-a": {"queued": 2, "processing": 1, "paused": False},
        "tenant-b": {"queued": 1, "processing": 0, "paused": False},
        "tenant-c": {"queued": 0, "processing": 0, "paused": True},
    }
    table = (await cli.run("stats", "--group")).stdout.decode()
    assert "(no group)" in table and "tenant-c" in table
    shown = (await cli.run("show", "b0")).stdout.decode()
    assert "group:      tenant-b" in shown


async def test_show_prints_the_steps_and_retry_reset_steps_starts_over(target: tuple[Cli, Callable[[], Storage]]) -> None:
    """``show`` lists a job's stored steps in order; ``retry`` keeps them (the job resumes
    after the last one), ``retry --reset-steps`` forgets them."""
    cli, make_storage = target
    ran: list[str] = []
    fail = True

    def record(name: str, value: Any) -> Any:
        ran.append(name)
        return value

    async def handler(job: Job[Any]) -> str:
        await job.step("charge", record, "charge", {"paid": 10})
        await job.step("reserve", record, "reserve", "box-7")
        if fail:
            raise ValueError("the mail server is down")
        await job.step("mail", record, "mail", True)
        return "done"

    done = Recorder()
    q = Queue(make_storage(), name=cli.name, handler=handler, max_attempts=1, block_timeout=0.5)
    q.on("failed", done)
    q.on("completed", done)
    async with q:
        await q.enqueue("order", None)
        with trio.fail_after(30):
            await done.wait_for("failed", "order")
        shown = (await cli.run("show", "order")).stdout.decode()
        assert 'steps:      2\n  charge: {"paid": 10}\n  reserve: "box-7"\n' in shown
        assert (await cli.json("show", "order"))["steps"] == {"charge": {"paid": 10}, "reserve": "box-7"}
        fail = False
        assert (await cli.json("retry", "order"))["reset_steps"] is False
        with trio.fail_after(30):
            await done.wait_for("completed", "order")
        assert ran == ["charge", "reserve", "mail"]  # resumed after "reserve"
        assert list((await cli.json("show", "order"))["steps"]) == ["charge", "reserve", "mail"]
        fail = True
        await q.remove("order")  # a new incarnation of the id: no steps
        await q.enqueue("order", None)
        with trio.fail_after(30):
            await done.wait_for("failed", "order", count=2)
        assert "its steps reset" in (await cli.run("retry", "order", "--reset-steps")).stdout.decode()
        with trio.fail_after(30):
            await done.wait_for("failed", "order", count=3)  # started over, failed again
        assert ran == ["charge", "reserve", "mail", "charge", "reserve", "charge", "reserve"]
