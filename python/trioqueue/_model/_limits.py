"""Queue-wide flow control settings: a global rate limit (:class:`RateLimit`). (What a
handler raises when an upstream says "slow down" is :class:`~trioqueue.RateLimited`, in
``_outcomes``; the storage's form of the limits is built by the consumer.)"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as check

__all__ = ["RateLimit"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` job starts per ``per`` seconds across every worker of a queue
    (a sliding window kept in the storage: in any ``per``-second span, at most ``limit``
    claims). ``RateLimit(100, per=1.0)``: 100 jobs a second."""

    limit: int
    per: float = 1.0

    def __post_init__(self) -> None:
        check.positive_int("RateLimit.limit", self.limit)
        check.seconds("RateLimit.per", self.per)
