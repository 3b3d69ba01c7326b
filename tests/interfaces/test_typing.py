"""The public API is typed: the package (with its ``_core.pyi`` stub) passes ``mypy --strict``,
and a typical user program type-checks against it. The package checked is the one the tests
import: the checkout's ``python/trioqueue``, or an installed wheel's (scripts/check-dist)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import trioqueue
from support import TESTS

ROOT = TESTS.parent
PACKAGE = Path(trioqueue.__file__).parent
# An installed package (in site-packages) is checked by name, as mypy finds it there (PEP 561:
# py.typed); a source tree by its path (mypy refuses site-packages as a path of sources).
INSTALLED = PACKAGE.parent in {Path(sysconfig.get_path(k)) for k in ("purelib", "platlib")}


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "--no-incremental", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_package_passes_mypy_strict() -> None:
    proc = _mypy("-p", "trioqueue") if INSTALLED else _mypy(str(PACKAGE))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_user_code_type_checks_and_misuse_is_caught(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        textwrap.dedent(
            """
            import trio
            from trioqueue import EnqueueStatus, Job, JobState, MemoryStorage, Queue

            async def handler(job: Job[dict[str, int]]) -> int:
                return job.payload["n"] + job.attempts

            async def main() -> None:
                queue: Queue[dict[str, int], int] = Queue(MemoryStorage(), handler=handler, concurrency=2)
                async with queue:
                    r = await queue.enqueue("a", {"n": 1})
                    assert r.status is EnqueueStatus.QUEUED
                    total: int = await queue.enqueue_and_wait("b", {"n": 2})
                    print(total + 1)
                    status = await queue.get_status("a")
                    if status is not None and status.state is JobState.COMPLETED:
                        print(status.result)

            trio.run(main)
            """
        )
    )
    bad = tmp_path / "bad.py"
    bad.write_text("from trioqueue import Queue, MemoryStorage\nQueue(MemoryStorage(), concurrency='2')\n")
    assert _mypy(str(good)).returncode == 0, _mypy(str(good)).stdout
    result = _mypy(str(bad))
    assert result.returncode != 0 and "concurrency" in result.stdout


def test_enqueue_and_wait_is_typed_with_the_queues_result_type(tmp_path: Path) -> None:
    """``enqueue_and_wait`` used to return ``Any``: a wrong use of its result went unnoticed."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        textwrap.dedent(
            """
            from trioqueue import MemoryStorage, Queue

            async def main(queue: Queue[dict[str, int], int]) -> None:
                name: str = await queue.enqueue_and_wait("a", {"n": 1})
            """
        )
    )
    result = _mypy(str(wrong))
    assert result.returncode != 0
    assert 'Incompatible types in assignment (expression has type "int", variable has type "str")' in result.stdout
