"""The main job: ``trioqueue demo``."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from trioqueue import MemoryStorage, ValidationError
from trioqueue.cli._demo import run_demo
from trioqueue.storage.file import FileStorage


async def test_demo_workload_accounts_for_every_job(tmp_path: Path) -> None:
    for storage in (MemoryStorage(), FileStorage(tmp_path / "store")):
        out = io.StringIO()
        summary = await run_demo(
            jobs=400, concurrency=20, fail_rate=0.1, fatal_rate=0.05, storage=storage, out=out, progress=False
        )
        assert summary["completed"] + summary["failed"] == 400
        assert summary["failed"] > 0 and summary["retries"] > summary["failed"]  # flaky jobs retried
        assert summary["requests"] > 0 and summary["p99_ms"] >= summary["p50_ms"] > 0
        assert "400 jobs on" in out.getvalue() and "p50" in out.getvalue()


def test_demo_command_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioqueue", "demo", "--jobs", "300", "--location", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "300 jobs on FileStorage" in proc.stdout
    assert "300/300" in proc.stderr  # the progress bar reached the end
    assert (tmp_path / "d").is_dir()  # --location kept the store


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioqueue", *args], capture_output=True, text=True, timeout=timeout
    )


def test_demo_rerun_on_the_same_store_runs_new_jobs(tmp_path: Path) -> None:
    """A second run on the same location used to hang at 0%: its fixed ids were cached."""
    for _ in range(2):
        proc = _cli("demo", "--jobs", "200", "--location", str(tmp_path / "d"), timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "200 jobs on FileStorage" in proc.stdout and "200/200" in proc.stderr


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--jobs", "0"], "argument --jobs: expected a positive integer, got 0"),
        (["--jobs", "-5"], "argument --jobs: expected a positive integer, got -5"),
        (["--concurrency", "0"], "argument --concurrency: expected a positive integer, got 0"),
        (["--jobs", "many"], "argument --jobs: expected a positive integer, got 'many'"),
    ],
)
def test_demo_rejects_bad_arguments_in_one_line(args: list[str], complaint: str) -> None:
    proc = _cli("demo", *args, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"trioqueue demo: error: {complaint} (see --help)"]
    assert proc.stdout == ""


async def test_run_demo_validates_its_arguments() -> None:
    with pytest.raises(ValidationError, match="jobs must be a positive integer, got 0"):
        await run_demo(jobs=0, storage=MemoryStorage(), out=io.StringIO(), progress=False)
    with pytest.raises(ValidationError, match="concurrency must be a positive integer, got -1"):
        await run_demo(jobs=1, concurrency=-1, storage=MemoryStorage(), out=io.StringIO(), progress=False)


async def test_demo_without_requests_prints_no_nan_percentiles() -> None:
    out = io.StringIO()
    summary = await run_demo(jobs=50, request_share=0.0, storage=MemoryStorage(), out=out, progress=False)
    assert summary["requests"] == 0
    assert "nan" not in out.getvalue() and "request/response: no calls" in out.getvalue()


def test_runtime_error_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    proc = _cli("demo", "--jobs", "5", "--location", str(blocker), "--no-progress", timeout=60)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("trioqueue: error: ") and str(blocker) in line
    proc = _cli("--debug", "demo", "--jobs", "5", "--location", str(blocker), "--no-progress", timeout=60)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


async def test_ctrl_c_stops_the_demo_with_exit_130_and_no_traceback(tmp_path: Path) -> None:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "demo", "--jobs", "200000", "--location", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    err = b""
    with trio.fail_after(60):
        while b"jobs/s" not in err:  # the first progress line: the workers are busy
            err += await proc.stderr.receive_some(4096)
        proc.send_signal(signal.SIGINT)
        async for chunk in proc.stderr:
            err += chunk
        code = await proc.wait()
    text = err.decode()
    assert code == 130, text
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == "trioqueue: interrupted (jobs not finished went back to their queue)"


def test_ctrl_c_cancels_the_command_instead_of_raising_inside_it() -> None:
    """An early Ctrl-C of the demo ended in a TrioInternalError about one run in thirty:
    Trio raised KeyboardInterrupt wherever the code was, cutting an exit in half. Now the
    command is cancelled (its cleanup runs as for any cancellation, a lock held across a
    checkpoint is released by its owner) and KeyboardInterrupt comes after, from outside."""
    from trioqueue.cli._run import until_interrupted as _until_interrupted

    seen: list[str] = []
    lock = trio.Lock()

    async def command(args: object) -> int:
        try:
            async with lock:
                signal.raise_signal(signal.SIGINT)
                while True:
                    try:
                        await trio.sleep(0)
                    except KeyboardInterrupt:  # pragma: no cover - the old way
                        seen.append("KeyboardInterrupt inside")
                        raise
        except trio.Cancelled:
            seen.append("cancelled")
            raise

    with pytest.raises(KeyboardInterrupt):
        trio.run(_until_interrupted, command, None)
    assert seen == ["cancelled"]
    assert not lock.locked()


def test_demo_runs_on_postgres(postgres_url: str) -> None:
    schema = f"t_demo_{uuid.uuid4().hex[:8]}"
    proc = _cli("demo", "--storage", "postgres", "--location", f"{postgres_url}?schema={schema}", "--jobs", "200", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "200 jobs on PostgresStorage" in proc.stdout


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        ([], "--storage postgres needs --location postgresql://user@host:port/dbname"),
        (["--location", "redis://127.0.0.1:1"], "--storage postgres needs --location postgresql://user@host:port/dbname"),
        (["--location", "postgresql:/u@h/db"], "argument --location: 'postgresql:/u@h/db' is not a storage URL"),
    ],
)
def test_demo_on_postgres_needs_its_url(args: list[str], complaint: str) -> None:
    proc = _cli("demo", "--storage", "postgres", *args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"trioqueue demo: error: {complaint}"), line
