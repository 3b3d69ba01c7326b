"""MkDocs hooks for the documentation site (mkdocs.yml loads this file).

The benchmark results live in ``benches/results/`` (written there by the benchmark
scripts) and the site serves them as they are, under ``benchmarks/results/``: every
``*.md`` as a page, every ``*.png`` as an image and the ``*.json`` raw figures as files.
The Performance page links and shows the committed files themselves, with no copy in
``docs/`` to fall out of date. CHANGELOG.md, at the root of the repository, is served the
same way as the Changelog page (``changelog.md``). Nothing is generated on disk and nothing
is fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
CHANGELOG = ROOT / "CHANGELOG.md"
SERVED_AS = "benchmarks/results"
SUFFIXES = (".md", ".png", ".json")


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in SUFFIXES:
            files.append(File.generated(config, f"{SERVED_AS}/{path.name}", abs_src_path=str(path)))
    files.append(File.generated(config, "changelog.md", abs_src_path=str(CHANGELOG)))
    return files
