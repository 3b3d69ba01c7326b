"""The main job: ``trioqueue demo``."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from trioqueue import MemoryStorage
from trioqueue._demo import run_demo
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
