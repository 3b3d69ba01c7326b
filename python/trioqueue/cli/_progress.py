"""A one-line progress bar on stderr (plain periodic lines when not a terminal), shared by
``trioqueue demo`` and ``trioqueue bench``."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["Progress", "percentile"]


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank); ``nan`` for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


class Progress:
    """``draw(done, note)`` redraws the bar: ``label [####----] done/total pct rate note``."""

    def __init__(self, total: int, label: str = "", stream: Any = None, unit: str = "jobs/s") -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()

    def draw(self, done: int, note: str = "", final: bool = False) -> None:
        elapsed = time.perf_counter() - self.started
        frac = done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done / elapsed if elapsed > 0 else 0.0
        head = f"{self.label} " if self.label else ""
        line = f"{head}[{bar}] {done:>6}/{self.total} {frac:6.1%}  {rate:8.0f} {self.unit}" + (f"  {note}" if note else "")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
