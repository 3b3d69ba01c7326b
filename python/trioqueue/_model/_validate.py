"""Input checks shared by the public API. Each raises :class:`ValidationError` naming the problem."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ._clock import now as _now
from ._errors import ValidationError
from ._types import MAX_PRIORITY, MIN_PRIORITY

MAX_ID_BYTES = 1024


def job_id(value: Any, what: str = "job id") -> str:
    """A non-empty identifier of at most 1 KiB of UTF-8; ``what`` names the field in errors."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a str, got {type(value).__name__}: {value!r:.80}")
    if not value:
        raise ValidationError(f"{what} must not be empty")
    if len(value) > MAX_ID_BYTES // 4 and len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValidationError(f"{what} is over {MAX_ID_BYTES} bytes (UTF-8): {value[:40]!r}...")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValidationError(f"{what} {value!r:.80} is not valid Unicode (lone surrogate)") from None
    return value


def group(value: Any, *, job: str | None = None) -> str:
    """A job's group: a non-empty str of at most 1 KiB of UTF-8 (the rules of a job id)."""
    if type(value) is str and 0 < len(value) <= MAX_ID_BYTES and value.isascii() and "\0" not in value:
        return value  # the common case, before any message is built
    where = f" (job {job!r})" if job is not None else ""
    if not isinstance(value, str):
        raise ValidationError(f"group must be a str, got {type(value).__name__}: {value!r:.80}{where}")
    if not value:
        raise ValidationError(f"group must not be empty{where}")
    if "\0" in value:
        raise ValidationError(f"group must not contain NUL characters: {value!r:.80}{where}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValidationError(f"group is over {MAX_ID_BYTES} bytes (UTF-8): {value[:40]!r}...{where}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValidationError(f"group {value!r:.80} is not valid Unicode (lone surrogate){where}") from None
    return value


def seconds(name: str, value: Any, *, job: str | None = None) -> float:
    """A duration: a finite number > 0."""
    where = f" (job {job!r})" if job is not None else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{name} must be a number of seconds, got {type(value).__name__}{where}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValidationError(f"{name} must be finite and > 0, got {seconds!r}{where}")
    return seconds


def non_negative_seconds(name: str, value: Any, *, job: str | None = None) -> float:
    """A delay: a finite number >= 0."""
    where = f" (job {job!r})" if job is not None else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{name} must be a number of seconds, got {type(value).__name__}{where}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValidationError(f"{name} must be finite and >= 0, got {seconds!r}{where}")
    return seconds


def positive_int(name: str, value: Any, *, job: str | None = None) -> int:
    where = f" (job {job!r})" if job is not None else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an int, got {type(value).__name__}{where}")
    if value < 1:
        raise ValidationError(f"{name} must be >= 1, got {value}{where}")
    if value > 2**31:
        raise ValidationError(f"{name} is too large: {value}{where}")
    return value


def keep_count(name: str, value: Any) -> int | None:
    """A count-based retention limit (``keep_completed``/``keep_failed``): ``None`` (no
    limit) or an int >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an int >= 0 or None, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValidationError(f"{name} must be >= 0 (the number of jobs kept), got {value}")
    if value > 2**31:
        raise ValidationError(f"{name} is too large: {value}")
    return value


def priority(value: Any, *, job: str | None = None) -> int:
    """A job priority: an int in ``MIN_PRIORITY..MAX_PRIORITY`` (0..9)."""
    if type(value) is int and MIN_PRIORITY <= value <= MAX_PRIORITY:
        return value  # the common case, before any message is built
    where = f" (job {job!r})" if job is not None else ""
    span = f"from {MIN_PRIORITY} to {MAX_PRIORITY}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"priority must be an int {span}, got {type(value).__name__}{where}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValidationError(f"priority must be {span}, got {value}{where}")
    return value


def run_at(delay: Any, at: Any, *, job: str | None = None) -> float | None:
    """When a job is due (seconds since the epoch) from ``delay`` (seconds from now) or
    ``at`` (a timezone-aware ``datetime`` or a UNIX timestamp); ``None``: now."""
    if delay is None and at is None:
        return None  # the common case, before any message is built
    where = f" (job {job!r})" if job is not None else ""
    if delay is not None and at is not None:
        raise ValidationError(f"give delay or at, not both{where}")
    if delay is not None:
        return _now() + non_negative_seconds("delay", delay, job=job)
    if at is None:
        return None
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValidationError(f"at must be a timezone-aware datetime, got naive {at.isoformat()}{where}")
        return at.timestamp()
    return non_negative_seconds("at", at, job=job)
