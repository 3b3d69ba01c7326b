"""The ceiling of workload B-1ms without any queue: 100 tasks that each sleep 1 ms in a
loop, under Trio (``trio.sleep``) and under Node.js (``setTimeout``, what BullMQ's B-1ms
handler awaits), measured alternately in one run. Writes ``results/timers.md``.

    python benches/bench_timers.py [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import trio

import _harness as h

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



ROUNDS = {"trio": trio_round, "node": node_round}


def main() -> None:
    parser = h.parser(__doc__, out="timers.md", rounds=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if shutil.which("node") is None:
        sys.exit("node is required")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in ROUNDS}
    for _, side in h.interleaved(args.rounds, list(ROUNDS)):
        runs[side].append(ROUNDS[side](args.seconds))
    t, n = ({k: h.Spread.of(r[k] for r in runs[side]) for k in ("rate", "cpu_us")} for side in ROUNDS)
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"{TASKS} tasks each awaiting a 1 ms sleep in a loop for {args.seconds:g} s, no queue; medians (min–max) of "
        f"{args.rounds} interleaved rounds. trio {trio.__version__}; Node {node_version}.",
        "",
        *h.table(["runtime", "sleeps/s", "CPU per sleep (µs)", "ratio to Node"], [
            ["Trio `trio.sleep(0.001)`", t["rate"].fmt(), t["cpu_us"].fmt(".1f"), f"{t['rate'] / n['rate']:.2f}×"],
            ["Node `setTimeout(r, 1)` (BullMQ's B-1ms handler)", n["rate"].fmt(), n["cpu_us"].fmt(".1f"), "1.00×"],
        ]),
        "",
        "A B-1ms job under Trio pays at least the Trio row's CPU for its handler's sleep on top "
        "of what a noop job costs (B); no queue can run more 1 ms jobs a second on one core "
        "than the Trio row.",
    ]
    h.write(args, "The ceiling of B-1ms: 1 ms timers alone, Trio beside Node.js", lines)


if __name__ == "__main__":
    main()
