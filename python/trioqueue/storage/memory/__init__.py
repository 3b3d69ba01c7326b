"""MemoryStorage: the in-process backend, on the Rust lock-free queue.

The parts: :mod:`._storage` (the storage: enqueue, claims, settlements, recovery,
events), :mod:`._control` (schedules, pause, locks, the worker registry, progress),
:mod:`._admin` (listing, counts, purge), :mod:`._parts` (job records, ready lanes,
waiters and subscribers) and :mod:`._index` (the per-state index).
"""

from ._storage import MemoryStorage

__all__ = ["MemoryStorage"]
