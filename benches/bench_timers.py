"""The ceiling of workload B-1ms without any queue: 100 tasks that each sleep 1 ms in a
loop, under Trio (``trio.sleep``) and under Node.js (``setTimeout``, what BullMQ's B-1ms
handler awaits), measured alternately in one run. Writes ``results/timers.md``.

    python benches/bench_timers.py [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = 100

NODE = """
const seconds = Number(process.argv[1]);
let n = 0; const t0 = performance.now(); const stop = t0 + seconds * 1000; const c0 = process.cpuUsage();
await Promise.all(Array.from({length: %d}, async () => {
  while (performance.now() < stop) { await new Promise((r) => setTimeout(r, 1)); n++; }
}));
const el = (performance.now() - t0) / 1000; const c = process.cpuUsage(c0);
console.log(JSON.stringify({rate: n / el, cpu_us: (c.user + c.system) / n}));
""" % TASKS


def trio_round(seconds: float) -> dict[str, float]:
    count = [0]

    async def main() -> float:
        stop = time.perf_counter() + seconds

        async def sleeper() -> None:
            while time.perf_counter() < stop:
                await trio.sleep(0.001)
                count[0] += 1

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(sleeper)
        return time.perf_counter() - t0

    c0 = time.process_time()
    elapsed = trio.run(main)
    return {"rate": count[0] / elapsed, "cpu_us": 1e6 * (time.process_time() - c0) / count[0]}


def node_round(seconds: float) -> dict[str, float]:
    out = subprocess.run(
        ["node", "--input-type=module", "-e", NODE, str(seconds)], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("node") is None:
        sys.exit("node is required")
    trio_runs, node_runs = [], []
    for _ in range(args.rounds):
        trio_runs.append(trio_round(args.seconds))
        node_runs.append(node_round(args.seconds))
    t = {k: statistics.median(r[k] for r in trio_runs) for k in ("rate", "cpu_us")}
    n = {k: statistics.median(r[k] for r in node_runs) for k in ("rate", "cpu_us")}
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# The ceiling of B-1ms: 1 ms timers alone, Trio beside Node.js",
        "",
        f"{time.strftime('%Y-%m-%d')}, {TASKS} tasks each awaiting a 1 ms sleep in a loop for {args.seconds:g} s, "
        f"no queue; medians of {args.rounds} alternating rounds (`python benches/bench_timers.py`). "
        f"Python {sys.version.split()[0]}, trio {trio.__version__}; Node {node_version}.",
        "",
        "| runtime | sleeps/s | CPU per sleep | ratio to Node |",
        "|---|---:|---:|---:|",
        f"| Trio `trio.sleep(0.001)` | {t['rate']:,.0f} | {t['cpu_us']:.1f} µs | {t['rate'] / n['rate']:.2f}× |",
        f"| Node `setTimeout(r, 1)` (BullMQ's B-1ms handler) | {n['rate']:,.0f} | {n['cpu_us']:.1f} µs | 1.00× |",
        "",
        "A B-1ms job under Trio pays at least the Trio row's CPU for its handler's sleep on top "
        "of what a noop job costs (B); no queue can run more 1 ms jobs a second on one core "
        "than the Trio row.",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "timers.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
