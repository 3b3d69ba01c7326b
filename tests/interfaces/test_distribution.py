"""What the distributions promise: one version, Cargo.toml's (maturin writes it into the
package metadata, pyproject.toml declares the version dynamic), which ``trioqueue.__version__``
and ``trioqueue --version`` read and CHANGELOG.md has a section for; and a package that
imports wherever its wheels install (macOS and Windows too), whatever one backend needs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import trioqueue
from support import TESTS

ROOT = TESTS.parent


def test_trioqueue_version_and_the_module_version_agree() -> None:
    proc = subprocess.run([sys.executable, "-m", "trioqueue", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"trioqueue {trioqueue.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", trioqueue.__version__), trioqueue.__version__


def test_the_version_is_cargo_tomls_and_the_changelog_has_it() -> None:
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert trioqueue.__version__ == cargo
    assert re.search(rf"^## \[{re.escape(cargo)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", (ROOT / "CHANGELOG.md").read_text(), re.M)


def test_importing_trioqueue_loads_no_linux_only_backend() -> None:
    """FileStorage needs Linux (inotify; fcntl): ``import trioqueue``, ``trioqueue.storage``
    and the command line must not import it before it is used, or the package would not
    import at all on macOS and Windows, where its wheels install too."""
    code = (
        "import sys, trioqueue, trioqueue.storage, trioqueue.cli; "
        "from trioqueue import MemoryStorage, Queue; from trioqueue.storage import from_url; "
        "print(sorted(m for m in sys.modules if m.startswith('trioqueue.storage.file')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
