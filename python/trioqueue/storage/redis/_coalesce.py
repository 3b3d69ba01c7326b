"""The enqueue coalescer of RedisStorage: :mod:`trioqueue.storage._coalesce` (shared with
the step saves of Redis and PostgreSQL)."""

from .._coalesce import PIPELINE, Coalescer, Slot

__all__ = ["PIPELINE", "Coalescer", "Slot"]
