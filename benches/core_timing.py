"""Timing and the results table shared by the parts of benches/bench_core.py."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_ops(run: Callable[[], int], repeat: int) -> float:
    """Best ops/s over ``repeat`` runs; ``run`` returns its operation count."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = run()
        dt = time.perf_counter() - t0
        best = max(best, n / dt)
    return best


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, str, float]] = []

    def add(self, group: str, case: str, rust: float, twin: str, python: float) -> None:
        self.rows.append((group, case, rust, twin, python))
        print(
            f"{group:9} {case:44} rust {fmt(rust):>9}/s  {twin:32} {fmt(python):>9}/s  "
            f"ratio {rust / python:6.2f}x",
            flush=True,
        )

    def markdown(self, header: str) -> str:
        lines = [
            header,
            "",
            "| area | case | rust ops/s | python twin | python ops/s | ratio rust/python |",
            "| --- | --- | ---: | --- | ---: | ---: |",
        ]
        for group, case, rust, twin, python in self.rows:
            lines.append(
                f"| {group} | {case} | {fmt(rust)} | {twin} | {fmt(python)} | "
                f"**{rust / python:.2f}x** |"
            )
        return "\n".join(lines) + "\n"


def fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"
