"""trioqueue: a reliable, at-least-once job queue for Trio.

Quick start::

    from trioqueue import Queue, MemoryStorage

    async def send_email(job):
        return {"sent": True}

    async with Queue(MemoryStorage(), handler=send_email, concurrency=5) as queue:
        await queue.enqueue("email-1", {"to": "a@example.com"})
        result = await queue.enqueue_and_wait("email-2", {"to": "b@example.com"}, timeout=30)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._model._errors import (
    ChildJobFailedError,
    FlowError,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
    JobTimeoutError,
    QueueStoppedError,
    SignalTimeoutError,
    StorageError,
    TrioQueueError,
    ValidationError,
)
from ._model._flows import Child, JobRef
from ._model._limits import RateLimit
from ._model._options import EnqueueOptions
from ._model._types import (
    DEFAULT_PRIORITY,
    EVENT_NAMES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    CancelResult,
    CancelStatus,
    EnqueueResult,
    EnqueueStatus,
    ExecutionContext,
    Job,
    JobError,
    JobState,
    JobPage,
    JobStatus,
    QueueEvent,
    UpdateTTLStatus,
)
from ._producers import AsyncioProducer, SyncProducer
from ._model._outcomes import BatchOutcome, RateLimited, ResultEncodeError, Retry, UnrecoverableError, WaitForChildren
from ._supervision._queue import Queue
from ._supervision._reaper import LeaderElection, Reaper
from ._supervision._settings import JobDefaults, WorkerSettings
from ._supervision._worker import Worker
from ._model._retry import ExponentialBackoff
from ._model._serde import JsonSerde, Serde, error_data
from .storage import MemoryStorage, Storage

if TYPE_CHECKING:
    from .storage.file import FileStorage
    from .storage.postgres import PostgresStorage
    from .storage.redis import RedisStorage

    __version__: str  # read from the package metadata on first use (__getattr__ below)

__all__ = [
    "DEFAULT_PRIORITY",
    "EVENT_NAMES",
    "AsyncioProducer",
    "BatchOutcome",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "CancelResult",
    "Child",
    "ChildJobFailedError",
    "CancelStatus",
    "EnqueueOptions",
    "EnqueueResult",
    "EnqueueStatus",
    "ExecutionContext",
    "ExponentialBackoff",
    "FlowError",
    "FileStorage",
    "Job",
    "JobCancelledError",
    "JobDefaults",
    "JobError",
    "JobFailedError",
    "JobNotFinishedError",
    "JobState",
    "JobPage",
    "JobRef",
    "JobStatus",
    "JobTimeoutError",
    "JsonSerde",
    "LeaderElection",
    "MemoryStorage",
    "Queue",
    "QueueEvent",
    "QueueStoppedError",
    "RateLimit",
    "RateLimited",
    "ResultEncodeError",
    "Retry",
    "Reaper",
    "PostgresStorage",
    "RedisStorage",
    "Serde",
    "SignalTimeoutError",
    "Storage",
    "StorageError",
    "SyncProducer",
    "TrioQueueError",
    "UpdateTTLStatus",
    "UnrecoverableError",
    "ValidationError",
    "WaitForChildren",
    "Worker",
    "WorkerSettings",
    "error_data",
]


def __getattr__(name: str) -> Any:
    # The version, from the package metadata (Cargo.toml's version), on first use.
    if name == "__version__":
        from ._model._version import package_version

        return package_version()
    # Backends other than memory are imported on first use.
    if name == "FileStorage":
        from .storage.file import FileStorage

        return FileStorage
    if name == "RedisStorage":
        from .storage.redis import RedisStorage

        return RedisStorage
    if name == "PostgresStorage":  # needs the postgres extra (psycopg)
        from .storage.postgres import PostgresStorage

        return PostgresStorage
    raise AttributeError(f"module 'trioqueue' has no attribute {name!r}")
