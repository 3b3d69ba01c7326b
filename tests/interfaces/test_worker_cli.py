"""``trioqueue worker``: a real worker process on a FileStorage shared with the test.

The test enqueues through its own Queue on the same directory, so the worker is seen doing
real work; signals are real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from trioqueue import FileStorage, JobState, Queue
from trioqueue.storage import from_url

from support import ProcessLines

APP = textwrap.dedent(
    """
    import os
    import trio
    from trioqueue import FileStorage, MemoryStorage, Job, Queue

    async def handle(job: Job[object]) -> object:
        if job.payload == "block":
            open(os.environ["APP_STORE"] + ".began", "w").close()  # its handler runs (for the test)
            await trio.sleep_forever()
        return job.payload * 2

    queue = Queue(FileStorage(os.environ["APP_STORE"]), name="jobs", handler=handle, block_timeout=0.5)
    NUMBER = 42

    async def make() -> Queue[object, object]:  # an async factory, on a storage the CLI replaces
        return Queue(MemoryStorage(), name="jobs", handler=handle, block_timeout=0.5)
    """
)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


async def _start_worker(app: Path, *args: str) -> tuple[trio.Process, ProcessLines]:
    env = {**os.environ, "APP_STORE": str(app / "store")}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "worker", *args, "--log-format", "json"],
        cwd=app,
        env=env,
        stdout=subprocess.PIPE,  # the log goes to stderr: swap them to read it line by line
        stderr=subprocess.STDOUT,
    )
    return proc, ProcessLines(proc)


async def _wait_log(lines: ProcessLines, fragment: str) -> dict[str, Any]:
    while True:
        line = await lines.readline()
        if line.startswith("{"):
            record = json.loads(line)
            if fragment in record["message"]:
                return record  # type: ignore[no-any-return]


async def test_worker_serves_and_first_signal_stops_gracefully(app: Path) -> None:
    proc, lines = await _start_worker(app, "app:queue")
    with trio.fail_after(60):
        started = await _wait_log(lines, "serving queue")
        assert "'jobs'" in started["message"] and started["logger"] == "trioqueue.worker"
        async with Queue(FileStorage(app / "store"), name="jobs") as producer:
            assert await producer.enqueue_and_wait("a", 21) == 42
        proc.send_signal(signal.SIGINT)
        await _wait_log(lines, "received SIGINT: stopping gracefully")
        assert await proc.wait() == 0


async def test_second_signal_forces_and_the_running_job_goes_back(app: Path) -> None:
    proc, lines = await _start_worker(app, "app:queue")
    with trio.fail_after(60):
        await _wait_log(lines, "serving queue")
        async with Queue(FileStorage(app / "store"), name="jobs") as producer:
            await producer.enqueue("stuck", "block")
            while not (app / "store.began").exists():  # its handler runs (a claim alone may be given back)
                await trio.sleep(0.05)  # in another process: no event to wait on
            proc.send_signal(signal.SIGTERM)
            await _wait_log(lines, "received SIGTERM: stopping gracefully")
            proc.send_signal(signal.SIGINT)
            await _wait_log(lines, "received SIGINT again: forcing the stop")
            assert await proc.wait() == 130
            status = await producer.get_status("stuck")
            assert status is not None and status.state is JobState.QUEUED and status.attempts == 1


async def test_factory_and_storage_url_override(app: Path) -> None:
    store = app / "other-store"
    proc, lines = await _start_worker(app, "app:make", "--storage", f"file://{store}", "--concurrency", "3")
    with trio.fail_after(60):
        record = await _wait_log(lines, "serving queue")
        assert "concurrency 3" in record["message"] and str(store) in record["message"]
        async with Queue(from_url(str(store)), name="jobs") as producer:
            assert await producer.enqueue_and_wait("b", "ab") == "abab"
        proc.send_signal(signal.SIGINT)
        assert await proc.wait() == 0


WORKER_APP = textwrap.dedent(
    """
    import os
    from trioqueue import FileStorage, Job, Queue, Worker

    async def handle(job: Job[int]) -> int:
        return job.payload + 1

    def make_worker() -> Worker:  # a factory returning a Worker of two producer-only Queues
        storage = FileStorage(os.environ["APP_STORE"])
        return Worker([Queue(storage, name="a"), Queue(storage, name="b")], handler=handle, block_timeout=0.5)
    """
)


async def test_worker_command_runs_a_worker_factory_over_two_queues(tmp_path: Path) -> None:
    (tmp_path / "workerapp.py").write_text(WORKER_APP)
    env = {**os.environ, "APP_STORE": str(tmp_path / "store")}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "worker", "workerapp:make_worker", "--concurrency", "2", "--log-format", "json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = ProcessLines(proc)
    with trio.fail_after(60):
        served = {(await _wait_log(lines, "serving queue"))["message"] for _ in range(2)}
        assert all("concurrency 2" in m for m in served) and {"'a'" in m for m in served} == {True, False}
        async with Queue(FileStorage(tmp_path / "store"), name="b") as producer:
            assert await producer.enqueue_and_wait("x", 1) == 2
        proc.send_signal(signal.SIGINT)
        await _wait_log(lines, "received SIGINT: stopping gracefully")
        assert await proc.wait() == 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["nope_module:queue"], 1, "trioqueue: error: cannot import 'nope_module' (from 'nope_module:queue')"),
        (["app:missing"], 1, "trioqueue: error: 'app' has no attribute 'missing' (from 'app:missing')"),
        (["app"], 1, "trioqueue: error: expected module:attribute (like myapp.tasks:queue), got 'app'"),
        (
            ["app:handle"],
            1,
            "trioqueue: error: 'app:handle' is a function taking arguments (job), not a Queue: QUEUE must be a"
            " Queue, or a factory returning one (called with no arguments)",
        ),
        (["app:NUMBER"], 1, "trioqueue: error: 'app:NUMBER' is not a trioqueue Queue (nor a factory returning one): 42"),
        (["app:queue", "app:make", "--name", "x"], 2, "trioqueue worker: error: --name applies to one QUEUE"),
        (["app:queue", "--storage", "ftp://x"], 2, "trioqueue worker: error: argument --storage: unsupported storage URL scheme 'ftp'"),
    ],
)
def test_worker_errors_are_one_line(app: Path, args: list[str], code: int, message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioqueue", "worker", *args],
        cwd=app,
        env={**os.environ, "APP_STORE": str(app / "store")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in proc.stderr


def test_version_and_help_show_defaults() -> None:
    out = subprocess.run([sys.executable, "-m", "trioqueue", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("trioqueue ")
    out = subprocess.run([sys.executable, "-m", "trioqueue", "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert "(default: 5000)" in out.stdout


def test_metrics_port_without_prometheus_client_names_the_extra(app: Path) -> None:
    """Without prometheus_client (an import blocked in the child), --metrics-port is one
    line naming the extra to install, not a bare ModuleNotFoundError."""
    blocked = "import sys; sys.modules['prometheus_client'] = None; from trioqueue.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", blocked, "worker", "app:queue", "--metrics-port", "0"],
        cwd=app,
        env={**os.environ, "APP_STORE": str(app / "store")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "trioqueue: error: --metrics-port needs prometheus-client, the 'metrics' extra:"
        " pip install 'trioqueue[metrics]' (in a checkout: pip install -e '.[metrics]')"
    ]
