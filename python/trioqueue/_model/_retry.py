"""Retry-delay policies: how long a failed attempt waits before the job is queued again."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import ValidationError
from ._validate import non_negative_seconds

__all__ = ["ExponentialBackoff", "RetryDelay", "retry_policy"]

RetryDelay = float | Callable[[int], float]
"""A constant delay in seconds, or a function of the attempt number (1-based) that failed."""


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """``base * factor ** (attempt - 1)`` seconds, capped at ``max``, with +/- ``jitter`` (a fraction)."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        non_negative_seconds("ExponentialBackoff.base", self.base)
        non_negative_seconds("ExponentialBackoff.max", self.max)
        if not 1.0 <= self.factor < 1e6:
            raise ValidationError(f"ExponentialBackoff.factor must be >= 1, got {self.factor!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValidationError(f"ExponentialBackoff.jitter must be within [0, 1], got {self.jitter!r}")

    def __call__(self, attempt: int) -> float:
        delay = min(self.max, self.base * self.factor ** min(attempt - 1, 64))
        if self.jitter:
            delay *= 1.0 + random.uniform(-self.jitter, self.jitter)
        return max(0.0, delay)


def retry_policy(value: RetryDelay) -> Callable[[int], float]:
    """Normalise a ``retry_delay`` argument into a function ``attempt -> seconds``."""
    if callable(value):
        return value
    delay = non_negative_seconds("retry_delay", value)
    return lambda _attempt: delay
