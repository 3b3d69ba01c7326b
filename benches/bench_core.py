"""Benchmark the Rust core (``trioqueue._core``) against its plain-Python twins.

Run: ``python benches/bench_core.py`` (after building the extension, e.g. with
``maturin develop --release``). Prints a table and writes it to
``benches/results/core.md``. Every figure is the median (min–max) of several runs
(``--rounds``), as the machine is noisy; ratio = rust ops/s / python ops/s (of the medians;
> 1 means Rust is faster).

The cases live beside this file, by component, and run here in turn:
bench_core_formats.py (job envelope, state strings, event messages), bench_core_resp.py
(the RESP codec), bench_core_queues.py (the queues, on one thread and on four);
core_timing.py has the timing and the table.
"""

from __future__ import annotations

import _harness as h
from bench_core_formats import PAYLOAD, bench_envelope, bench_events, bench_state
from bench_core_queues import bench_queue_single, bench_queue_threads
from bench_core_resp import bench_resp
from core_timing import Table


def main() -> None:
    ap = h.parser(__doc__, out="core.md", rounds=5)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the item counts")
    args = ap.parse_args()
    n = int(100_000 * args.scale)
    t = Table()
    bench_envelope(t, args.rounds, n)
    bench_state(t, args.rounds, n)
    bench_events(t, args.rounds, n)
    bench_resp(t, args.rounds, n)
    bench_queue_single(t, args.rounds, n)
    bench_queue_threads(t, max(3, args.rounds // 2 + 1), n)
    print()
    header = (
        f"Median (min–max) of {args.rounds} runs. ratio = rust ops/s / python ops/s (of the medians; > 1: Rust "
        f"faster). Envelope payload: {len(PAYLOAD)}-byte JSON."
    )
    h.write(args, "trioqueue core benchmark: Rust (`trioqueue._core`) vs plain Python", [header, "", *t.markdown()])


if __name__ == "__main__":
    main()
