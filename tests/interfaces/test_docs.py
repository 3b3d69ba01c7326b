"""The documentation's examples and commands: what a newcomer copies works as written."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import trioqueue
from support import TESTS

ROOT = TESTS.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if not p.name.startswith("_"))]


def _blocks(text: str, language: str) -> list[tuple[int, str]]:
    """(line, code) of each fenced block of ``language``."""
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
    ]


def test_development_runs_the_readme_test_command() -> None:
    """docs/development.md shows the command the README gives for the whole test suite
    (its second code block), not an older, shorter one."""
    readme = _blocks((ROOT / "README.md").read_text(), "sh")
    development = _blocks((ROOT / "docs" / "development.md").read_text(), "sh")
    assert development[0][1] == readme[1][1]


def _names(code: str) -> list[str]:
    """The names used in ``code`` (not those in comments or strings)."""
    return [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME]


def test_examples_import_the_trioqueue_names_they_use() -> None:
    """A Python example that uses a name of ``trioqueue`` (JobStatus, JobFailedError...)
    imports it, in that block or an earlier one of the page. Signatures (``Queue(storage,
    *, name=None, ...)``) are not examples."""
    public = set(trioqueue.__all__)
    missing = []
    for page in PAGES:
        imported: set[str] = set()
        for line, code in _blocks(page.read_text(), "python"):
            for m in re.finditer(r"^\s*from trioqueue[\w.]* import (\([^)]*\)|.*)$", code, re.M):
                imported |= set(re.findall(r"\w+", m.group(1)))
            names = _names(code)
            if "*" in code.split(")")[0] and re.match(r"\s*\w+\(", code):  # a signature
                continue
            used = sorted({n for n in names if n in public} - imported)
            if used:
                missing.append(f"{page.relative_to(ROOT)}:{line}: {', '.join(used)}")
    assert missing == []
