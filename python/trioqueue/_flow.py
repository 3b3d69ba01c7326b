"""Queue-wide flow control: a global rate limit (:class:`RateLimit`), the exception a
handler raises when an upstream says "slow down" (:class:`RateLimited`), and the
translation of a Queue's settings into the storage's :class:`ClaimLimits`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import _validate as check
from ._errors import ValidationError
from .storage._base import ClaimLimits

__all__ = ["RateLimit", "RateLimited", "claim_limits"]


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


class RateLimited(Exception):
    """Raise it from a handler when an upstream refused for now (an HTTP 429): the job goes
    back, due in ``retry_after`` seconds, *without* consuming an attempt, and every worker
    of the queue stops claiming for that long (stored in the storage)."""

    def __init__(self, message: str = "", *, retry_after: float = 1.0) -> None:
        super().__init__(message or f"rate limited: retry after {retry_after!r} s")
        self.retry_after = check.non_negative_seconds("RateLimited.retry_after", retry_after)


def claim_limits(rate_limit: Any, global_concurrency: Any) -> ClaimLimits | None:
    """The storage's :class:`ClaimLimits` for a Queue's ``rate_limit`` and
    ``global_concurrency`` (``None``: neither is set). Raises :class:`ValidationError`."""
    if rate_limit is None and global_concurrency is None:
        return None
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise ValidationError(f"rate_limit must be a trioqueue.RateLimit, got {type(rate_limit).__name__}")
    concurrency = 0 if global_concurrency is None else check.positive_int("global_concurrency", global_concurrency)
    if rate_limit is None:
        return ClaimLimits(concurrency=concurrency)
    if not math.isfinite(rate_limit.per):  # pragma: no cover - validated by RateLimit
        raise ValidationError("RateLimit.per must be finite")
    return ClaimLimits(rate_limit.limit, rate_limit.per, concurrency)
