"""Storage backends, the core interface they implement and the capabilities they may have."""

from typing import TYPE_CHECKING

from ._base import (
    NOTICE_KINDS,
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    HeartbeatReply,
    JobRecord,
    LostClaim,
    NewJob,
    Settlement,
    SettleKind,
    Storage,
    StorageEvent,
)
from ._capabilities import (
    Administration,
    Debounce,
    Groups,
    NonBlockingStart,
    Schedules,
    Signals,
    Steps,
    Transactions,
    Trees,
)
from ._url import from_url
from .memory._storage import MemoryStorage

if TYPE_CHECKING:  # imported on first use below; seen by type checkers and the docs
    from .file import FileStorage
    from .postgres import PostgresStorage
    from .redis import RedisStorage

__all__ = [
    "NOTICE_KINDS",
    "Administration",
    "Claim",
    "ClaimLimits",
    "Debounce",
    "EnqueueOutcome",
    "FileStorage",
    "Groups",
    "HeartbeatReply",
    "JobRecord",
    "LostClaim",
    "MemoryStorage",
    "PostgresStorage",
    "RedisStorage",
    "NewJob",
    "NonBlockingStart",
    "Schedules",
    "Settlement",
    "SettleKind",
    "Storage",
    "Signals",
    "Steps",
    "StorageEvent",
    "Transactions",
    "Trees",
    "from_url",
]


def __getattr__(name: str) -> object:
    # FileStorage is imported on first use: it needs Linux (inotify), and the package imports
    # on macOS and Windows too.
    if name == "FileStorage":
        from .file import FileStorage

        return FileStorage
    # RedisStorage is imported on first use (its Cluster transport needs valkey-glide, an extra).
    if name == "RedisStorage":
        from .redis import RedisStorage

        return RedisStorage
    if name == "PostgresStorage":  # psycopg is an extra (trioqueue[postgres])
        from .postgres import PostgresStorage

        return PostgresStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
