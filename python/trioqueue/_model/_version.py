"""The version of trioqueue: ``trioqueue.__version__`` and ``trioqueue --version``."""

from __future__ import annotations


def package_version() -> str:
    """The installed package's version, from its metadata: the one version of trioqueue is
    Cargo.toml's, which maturin writes into the wheel's and sdist's metadata (pyproject.toml
    declares it dynamic). ``"unknown"`` where the package runs uninstalled (its source on
    ``sys.path``, no metadata). Read on demand: ``importlib.metadata`` is not imported with
    trioqueue."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trioqueue")
    except PackageNotFoundError:
        return "unknown"
