"""MemoryStorage: the in-process backend, on the Rust lock-free queue.

The parts: :mod:`._storage` (the storage, one class: enqueue, claims, settlements,
recovery, events, debounce, schedules, pause, groups, locks), :mod:`._flows` (trees of
jobs, and what a job's end does to its tree), :mod:`._admin` (listing, counts, purge,
clear), :mod:`._parts` (job records, queues and the steps on one queue, ready lanes,
waiters and subscribers) and :mod:`._index` (the per-state index).
"""

from ._storage import MemoryStorage

__all__ = ["MemoryStorage"]
