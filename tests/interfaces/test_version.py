"""One version: Cargo.toml's. maturin writes it into the package metadata (pyproject.toml
declares the version dynamic), which ``trioqueue.__version__`` and ``trioqueue --version``
read; CHANGELOG.md has its section."""

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
