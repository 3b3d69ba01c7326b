"""Timing and the results table shared by the parts of benches/bench_core.py."""

from __future__ import annotations

import time
from collections.abc import Callable

from _harness import Spread


def ops_per_s(run: Callable[[], int], rounds: int) -> Spread:
    """Ops/s over ``rounds`` runs (median, min–max); ``run`` returns its operation count."""
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = run()
        rates.append(n / (time.perf_counter() - t0))
    return Spread.of(rates)


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, Spread, str, Spread]] = []

    def add(self, group: str, case: str, rust: Spread, twin: str, python: Spread) -> None:
        self.rows.append((group, case, rust, twin, python))
        print(
            f"{group:9} {case:44} rust {fmt(rust.median):>9}/s  {twin:32} {fmt(python.median):>9}/s  "
            f"ratio {rust / python:6.2f}x",
            flush=True,
        )

    def markdown(self) -> list[str]:
        lines = [
            "| area | case | rust ops/s | python twin | python ops/s | ratio rust/python |",
            "| --- | --- | ---: | --- | ---: | ---: |",
        ]
        for group, case, rust, twin, python in self.rows:
            lines.append(
                f"| {group} | {case} | {spread(rust)} | {twin} | {spread(python)} | **{rust / python:.2f}x** |"
            )
        return lines


def spread(s: Spread) -> str:
    """``1.20M (1.10M–1.30M)``."""
    if len(s.values) < 2:
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.lo)}–{fmt(s.hi)})"


def fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"
