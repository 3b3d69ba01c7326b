"""Assert that a release's directory holds exactly the distributions it should, before any is
uploaded (the release workflow, .github/workflows/release.yml, runs it on the downloaded
artifacts).

    python scripts/check_release_files.py dist [--tag v0.1.0]

Every expected file (below) must be there exactly once and nothing else may be: a build that
silently produced nothing, or a wheel with an unexpected tag (a version-specific wheel where
abi3 was meant, a linux_x86_64 one PyPI refuses), stops the release. The version is
Cargo.toml's; with --tag, the tag must name it (v0.1.0 for 0.1.0).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (what, file-name pattern); {v} is the version.
EXPECTED = [
    ("sdist", "trioqueue-{v}.tar.gz"),
    ("abi3, manylinux2014 x86_64", "trioqueue-{v}-cp311-abi3-manylinux*_x86_64.whl"),
    ("abi3, manylinux2014 aarch64", "trioqueue-{v}-cp311-abi3-manylinux*_aarch64.whl"),
    ("abi3, musllinux 1.2 x86_64", "trioqueue-{v}-cp311-abi3-musllinux_1_2_x86_64.whl"),
    ("abi3, musllinux 1.2 aarch64", "trioqueue-{v}-cp311-abi3-musllinux_1_2_aarch64.whl"),
    ("abi3, macOS universal2", "trioqueue-{v}-cp311-abi3-macosx_*_universal2.whl"),
    ("abi3, Windows x86_64", "trioqueue-{v}-cp311-abi3-win_amd64.whl"),
    ("free-threaded 3.14t, manylinux2014 x86_64", "trioqueue-{v}-cp314-cp314t-manylinux*_x86_64.whl"),
    ("free-threaded 3.14t, manylinux2014 aarch64", "trioqueue-{v}-cp314-cp314t-manylinux*_aarch64.whl"),
    ("free-threaded 3.14t, macOS universal2", "trioqueue-{v}-cp314-cp314t-macosx_*_universal2.whl"),
    ("free-threaded 3.14t, Windows x86_64", "trioqueue-{v}-cp314-cp314t-win_amd64.whl"),
]


def cargo_version() -> str:
    with open(ROOT / "Cargo.toml", "rb") as f:
        version: str = tomllib.load(f)["package"]["version"]
    return version


def problems(names: list[str], version: str) -> list[str]:
    """What is wrong with a release directory holding ``names`` (empty: nothing)."""
    found: list[str] = []
    matched: set[str] = set()
    for what, pattern in EXPECTED:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern.format(v=version))]
        matched.update(hits)
        if len(hits) != 1:
            found.append(f"{what}: {len(hits)} files match {pattern.format(v=version)} ({', '.join(hits) or 'none'})")
    found += [f"unexpected file: {n}" for n in sorted(set(names) - matched)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path, help="the directory of the release's files")
    parser.add_argument("--tag", help="the git tag being released (v<version>)")
    args = parser.parse_args()
    version = cargo_version()
    errors = []
    if args.tag is not None and args.tag != f"v{version}":
        errors.append(f"the tag {args.tag} does not name Cargo.toml's version {version} (v{version})")
    names = sorted(p.name for p in args.dist.iterdir() if p.is_file())
    errors += problems(names, version)
    for line in errors:
        print(f"check_release_files: {line}", file=sys.stderr)
    if not errors:
        print(f"trioqueue {version}: the {len(names)} expected files")
        for name in names:
            print(f"  {name}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
