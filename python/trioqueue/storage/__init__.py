"""Storage backends and the interface they implement."""

from ._base import Claim, EnqueueOutcome, JobRecord, NewJob, Settlement, SettleKind, Storage, StorageEvent
from .memory import MemoryStorage

__all__ = [
    "Claim",
    "EnqueueOutcome",
    "JobRecord",
    "MemoryStorage",
    "NewJob",
    "Settlement",
    "SettleKind",
    "Storage",
    "StorageEvent",
]
