"""Queue-wide flow control: a global rate limit (:class:`RateLimit`), and the translation
of a Queue's settings into the storage's :class:`ClaimLimits`. (What a handler raises
when an upstream says "slow down" is :class:`~trioqueue.RateLimited`, in ``_outcomes``.)"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import _validate as check
from ._errors import ValidationError
from .storage._base import ClaimLimits

__all__ = ["RateLimit", "claim_limits"]


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
