"""``trioqueue worker --processes N``: a supervisor of real worker processes on a real
storage shared with the test (FileStorage; Redis for the crash test).

The supervisor's and its workers' logs share one pipe, read line by line; every process
holding it (the supervisor, its workers, their pool processes) must be gone for it to end,
so its end (EOF) says no process outlived the supervisor. Handlers report their pid over a
socket (tests/process_support.py) when they start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from process_support import Listener, alive, children_of, until_closed
from support import TESTS, ProcessLines
from trioqueue import FileStorage, JobState, Queue, RedisStorage, Storage

APP = textwrap.dedent(
    """
    import os
    import socket
    import trio
    from trioqueue import FileStorage, Job, Queue
    from process_support import spin

    async def handle(job: Job[dict[str, object]]) -> dict[str, object]:
        port = job.payload.get("port")
        if port is not None and (job.attempts == 1 or not job.payload.get("once")):
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(f"{os.getpid()}\\n".encode())
                await trio.sleep(job.payload.get("seconds", float("inf")))
        return {"pid": os.getpid(), "attempt": job.attempts}

    SETTINGS = dict(block_timeout=0.5, visibility_timeout=1.0, retry_delay=0)
    queue = Queue(FileStorage(os.environ["APP_STORE"]), name="jobs", handler=handle, **SETTINGS)
    cpu = Queue(FileStorage(os.environ["APP_STORE"]), name="cpu", handler=spin, executor="process", **SETTINGS)
    """
)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


class Supervisor:
    """A ``trioqueue worker --processes`` process and its log (its workers' too)."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines = ProcessLines(process)
        self.workers: dict[int, int] = {}  # worker index -> pid, from the supervisor's log

    async def wait_log(self, fragment: str) -> dict[str, Any]:
        while True:
            line = await self.lines.readline()
            if line.startswith("{"):
                record = json.loads(line)
                message = record["message"]
                if record["logger"] == "trioqueue.supervisor" and message.startswith("worker process "):
                    words = message.split()
                    if words[3] == "started":  # "worker process 1 started (pid 123)"
                        self.workers[int(words[2])] = int(words[5].rstrip(")"))
                if fragment in message:
                    return record  # type: ignore[no-any-return]

    async def serving(self, count: int) -> None:
        for _ in range(count):
            await self.wait_log("serving queue")

    async def until_eof(self) -> None:
        """Read the log to its end: every process holding the pipe is gone."""
        try:
            while True:
                await self.lines.readline()
        except EOFError:
            pass


@pytest.fixture
async def start(app: Path) -> AsyncIterator[Any]:
    started: list[trio.Process] = []

    async def start(*args: str) -> Supervisor:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trioqueue", "worker", *args, "--log-format", "json"],
            cwd=app,
            env={**os.environ, "APP_STORE": str(app / "store"), "PYTHONPATH": _pythonpath()},
            stdout=subprocess.PIPE,  # the log goes to stderr: swap them to read it line by line
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        return Supervisor(process)

    try:
        yield start
    finally:
        with trio.CancelScope(shield=True):
            for process in started:
                for pid in children_of(process.pid):
                    os.kill(pid, signal.SIGKILL)
                if process.returncode is None:
                    process.kill()
                await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()


def _pythonpath() -> str:
    """The parent's path, and this directory (the app imports ``process_support``)."""
    here = str(TESTS)
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), here) if p)


@pytest.fixture(params=["file", "redis", "postgres"])
def shared(request: pytest.FixtureRequest, app: Path) -> tuple[Storage, list[str]]:
    """A storage for the test's producer, and the worker options pointing at the same queue."""
    if request.param == "file":
        return FileStorage(app / "store"), []
    if request.param == "postgres":
        from trioqueue.storage import from_url

        url = f"{request.getfixturevalue('postgres_url')}?schema=t_{uuid.uuid4().hex[:12]}"
        return from_url(url), ["--storage", url, "--name", f"q-{uuid.uuid4().hex[:8]}"]
    url = request.getfixturevalue("redis_url")
    name = f"q-{uuid.uuid4().hex[:8]}"
    return RedisStorage(url), ["--storage", url, "--name", name]


async def test_a_killed_worker_is_replaced_and_its_job_recovered(start: Any, shared: tuple[Storage, list[str]]) -> None:
    storage, options = shared
    name = options[-1] if options else "jobs"
    listener = await Listener.open()
    sup = await start("app:queue", "--processes", "2", *options)
    with trio.fail_after(60):
        await sup.serving(2)
        async with Queue(storage, name=name) as producer:
            await producer.enqueue("victim", {"port": listener.port, "once": True})
            pid, _ = await listener.accept()
            index = next(i for i, p in sup.workers.items() if p == pid)
            os.kill(pid, signal.SIGKILL)
            await sup.wait_log(f"worker process {index} (pid {pid}) exited (killed by SIGKILL); restarting it in 0.5 s")
            await sup.wait_log(f"worker process {index} started")
            assert sup.workers[index] != pid and alive(sup.workers[index])
            # The reaper (in a live worker) puts the job back once its lease runs out.
            result = await producer.enqueue_and_wait("victim", None, timeout=30)
            assert result["attempt"] == 2 and result["pid"] != pid
        sup.process.send_signal(signal.SIGTERM)
        assert await sup.process.wait() == 0
        await sup.until_eof()
    await listener.aclose()


async def test_sigterm_stops_gracefully_and_running_jobs_finish(start: Any, app: Path) -> None:
    listener = await Listener.open()
    sup = await start("app:queue", "--processes", "2")
    with trio.fail_after(60):
        await sup.serving(2)
        async with Queue(FileStorage(app / "store"), name="jobs") as producer:
            assert [(await producer.enqueue_and_wait(f"quick-{i}", {}))["attempt"] for i in range(4)] == [1] * 4
            await producer.enqueue("slow", {"port": listener.port, "seconds": 0.5})
            await listener.accept()  # it runs
            sup.process.send_signal(signal.SIGTERM)
            await sup.wait_log("received SIGTERM: stopping the 2 worker processes gracefully")
            assert await sup.process.wait() == 0
            status = await producer.get_status("slow")
            assert status is not None and status.state is JobState.COMPLETED  # it finished first
        await sup.until_eof()
    await listener.aclose()


async def test_ctrl_c_twice_forces_the_stop_and_leaves_no_process(start: Any, app: Path) -> None:
    listener = await Listener.open()
    sup = await start("app:queue", "app:cpu", "--processes", "2")
    with trio.fail_after(60):
        await sup.serving(4)  # two queues in each of two workers
        workers = children_of(sup.process.pid)
        assert sorted(workers) == sorted(sup.workers.values())
        async with Queue(FileStorage(app / "store"), name="jobs") as jobs, Queue(jobs.storage, name="cpu") as cpu:
            await jobs.enqueue("held", {"port": listener.port})
            await cpu.enqueue("spinning", listener.port)
            running = [await listener.accept(), await listener.accept()]
            pool_pid = next(pid for pid, _ in running if pid not in workers)  # the pool process
            sup.process.send_signal(signal.SIGINT)
            await sup.wait_log("received SIGINT: stopping the 2 worker processes gracefully")
            sup.process.send_signal(signal.SIGINT)
            await sup.wait_log("received SIGINT again: forcing the stop")
            assert await sup.process.wait() == 130
            await sup.until_eof()
            assert not any(alive(pid) for pid in [*workers, pool_pid])
            for conn in (conn for _, conn in running):
                await until_closed(conn)
            for queue, job_id in ((jobs, "held"), (cpu, "spinning")):
                status = await queue.get_status(job_id)
                assert status is not None and status.state is JobState.QUEUED  # back to the queue
    await listener.aclose()


async def test_workers_of_a_killed_supervisor_stop(start: Any, app: Path) -> None:
    sup = await start("app:queue", "--processes", "2")
    with trio.fail_after(60):
        await sup.serving(2)
        workers = children_of(sup.process.pid)
        assert len(workers) == 2
        sup.process.kill()
        await sup.until_eof()  # the workers noticed, stopped and exited
    assert not any(alive(pid) for pid in workers)


async def _give_up_lines(sup: Supervisor) -> list[str]:
    """The supervisor's output to its end, once it exited 1, giving up."""
    lines = []
    with trio.fail_after(60):  # a hang guard
        try:
            while True:
                lines.append(await sup.lines.readline())
        except EOFError:
            pass
        assert await sup.process.wait() == 1
    return lines


@pytest.mark.parametrize("target", ["app", "postgres"])
async def test_a_fleet_that_cannot_start_reports_the_error_once_and_gives_up(start: Any, target: str) -> None:
    """Worker 0 starts first, the others once it serves: a broken application or a
    storage that is not there makes it exit before serving, and the supervisor gives up
    at once, the worker's error printed once (it used to be restarted three times, each
    of the N workers printing the error each time: 20 lines and 95 s for PostgreSQL)."""
    from postgres_server import free_port

    url = f"postgresql://u@127.0.0.1:{free_port()}/db"
    args = ["app:missing"] if target == "app" else ["app:queue", "--storage", url]
    sup = await start(*args, "--processes", "2")
    lines = await _give_up_lines(sup)
    error = (
        "trioqueue: error: 'app' has no attribute 'missing'"
        if target == "app"
        else f"trioqueue: error: cannot connect to PostgreSQL at {url.split('@')[1].split('/')[0]}: "
    )
    assert [line for line in lines if line.startswith(error)] != [], lines
    assert len([line for line in lines if "error: " in line and ("missing" in line or "PostgreSQL" in line)]) == 1, lines
    assert lines[-1] == "trioqueue: error: worker process 0 exited before serving its queues (exit code 1); giving up"
    assert sum('worker process 1 started' in line for line in lines) == 0, lines
    assert len(lines) <= 6, lines


def test_help_shows_processes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trioqueue", "worker", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--processes PROCESSES" in out.stdout and "--supervised" not in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "trioqueue", "worker", "app:queue", "--processes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "expected a positive integer, got 0" in out.stderr
