"""``from_url`` and the command line's ``--storage``: the forms a storage URL takes, and the
mistyped ones refused before anything is created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trioqueue import FileStorage, MemoryStorage, ValidationError
from trioqueue.storage import from_url

MISTYPED = [
    "redis:/127.0.0.1:6395",
    "redis//127.0.0.1:6395",
    "REDIS:127.0.0.1:6395",
    "redis",
    "localhost:6395",
    "127.0.0.1:6395",
    "db.example:5432/jobs",
    "postgresql:/u@h:1/db",
    "postgres//u@h/db",
    "memory:",
    "file:/tmp/jobs",
    "valkey:/h:1",
]


@pytest.mark.parametrize("url", MISTYPED)
def test_a_mistyped_storage_url_is_refused_not_made_a_directory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as info:
        from_url(url)
    message = str(info.value)
    assert repr(url) in message and "redis://" in message and "./jobs" in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_paths_and_file_urls_are_still_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("./jobs", "jobs", "redis-data", "redis/jobs", "./localhost:6395", str(tmp_path / "abs"), f"file://{tmp_path}/f"):
        storage = from_url(url)
        assert isinstance(storage, FileStorage), url
    assert isinstance(from_url("memory://"), MemoryStorage)


@pytest.mark.parametrize("command", [["stats"], ["worker", "app:queue"], ["dashboard"], ["bench"]])
def test_a_mistyped_storage_url_is_a_one_line_usage_error_of_the_cli(command: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioqueue", *command, "--storage", "redis:/127.0.0.1:6395"],
        cwd=tmp_path,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"trioqueue {command[0]}: error: argument --storage: ") and "'redis:/127.0.0.1:6395'" in lines[0]
    assert list(tmp_path.iterdir()) == []


MISSING_EXTRAS = """
import sys
for name in ("psycopg", "trio_parallel", "prometheus_client"):
    sys.modules[name] = None  # as if the extra were not installed: importing it fails
from trioqueue import MemoryStorage, Queue, TrioQueueError, ValidationError
from trioqueue.storage import from_url

try:
    from_url("postgresql://u@h/db")
except ValidationError as exc:
    print(exc)
try:
    Queue(MemoryStorage(), executor="process")
except TrioQueueError as exc:
    print(exc)
try:
    import trioqueue.metrics
except ImportError as exc:
    print(exc)
"""


def test_a_missing_extra_names_the_command_that_installs_it() -> None:
    """Every hint about a missing optional dependency names the exact command that installs
    the extra for a user (``pip install 'trioqueue[extra]'``: the package index) and, for a
    contributor, the one for a checkout, in the same words."""
    proc = subprocess.run([sys.executable, "-c", MISSING_EXTRAS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        "'postgresql://u@h/db' needs psycopg, the 'postgres' extra:"
        " pip install 'trioqueue[postgres]' (in a checkout: pip install -e '.[postgres]')"
    )
    assert lines[1] == (
        "executor='process' needs trio-parallel, the 'process' extra:"
        " pip install 'trioqueue[process]' (in a checkout: pip install -e '.[process]')"
    )
    assert lines[2] == (
        "trioqueue.metrics needs prometheus-client, the 'metrics' extra:"
        " pip install 'trioqueue[metrics]' (in a checkout: pip install -e '.[metrics]')"
    )
