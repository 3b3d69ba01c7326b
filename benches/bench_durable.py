"""Durable jobs: what steps cost, and how fast virtual time runs durable sleeps, on every
storage, measured in one run. Writes ``results/durable.md``.

- **saves**: ``Steps.save_step`` straight on the storage, one after another, ``--steps``
  steps for each of 200 claimed jobs (µs a save, saves a second), and ``get_steps`` once a
  job (µs a read);
- **concurrent saves**: 100 claimed jobs save 40 steps each at once, straight on the
  storage: saves a second and the CPU a save costs the client and the server; on Redis
  and PostgreSQL also with each save a call of its own (the path before the saves of a
  queue were coalesced), in the same run;
- **signals**: ``--signals`` jobs a round, one at a time, each parked in ``waiting_signal``
  (its event seen), then ``queue.signal``: the time until the resumed handler's next line
  runs (p50, p99), and the send alone;
- **jobs**: a Queue (no-op async handler, concurrency 32) runs ``--jobs`` jobs whose handler
  takes ``--steps`` steps (``await job.step(f"s{i}", one, i)``) and the same handler
  calling ``one(i)`` directly: jobs a second each way, their ratio, and the wall time a
  step adds per job at that concurrency;
- **virtual clock** (memory): ``--jobs`` jobs that take a step, sleep a day
  (``job.sleep``), take a step, sleep a day and take a last step, under Trio's
  ``MockClock(autojump_threshold=0)``: simulated job-hours (48 a job) per real second;
- **DBOS** (``--dbos VENV``, PostgreSQL only): ``dbos_peer.py``, run by that virtualenv's
  Python on the same embedded server, runs the same workload as DBOS workflows of
  ``--steps`` steps (and without steps), queued and started directly, and the latency of
  DBOS's ``send`` to a workflow waiting in ``recv`` (``--signals`` a round).

Median (min–max) of ``--rounds`` interleaved rounds. The machine is noisy: compare the
ratios.

    python benches/bench_durable.py [--rounds 3] [--jobs 1000] [--steps 10] [--signals 100] [--dbos /tmp/dbosvenv]
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

import _harness as h
from trioqueue import Job, MemoryStorage, Queue, Storage
from trioqueue.storage import NewJob, Steps

CONCURRENCY = 32
SAVE_JOBS = 200
CONCURRENT_JOBS = 100  # jobs saving their steps at once (concurrent saves)
CONCURRENT_STEPS = 40  # steps each of them saves
SIGNAL_WARMUP = 5
DAY = 86400.0
WORKER = "bench-worker"


def one(i: int) -> int:
    return i


# -- saves -------------------------------------------------------------------------------


async def saves(storage: Storage, steps: int) -> tuple[float, float]:
    """(µs a save_step, µs a get_steps) over SAVE_JOBS claimed jobs of ``steps`` saves."""
    from trioqueue._core import encode_envelope

    assert isinstance(storage, Steps)
    q = f"s-{uuid.uuid4().hex[:8]}"
    await storage.heartbeat(q, WORKER, 60.0, [], 60.0)
    jobs = [NewJob(f"j{i}", encode_envelope(f"j{i}", b"null", 0, 0, 3, 60_000), 3, 60.0, f"t{i}") for i in range(SAVE_JOBS)]
    await storage.enqueue(q, jobs)
    claims = []
    while len(claims) < SAVE_JOBS:
        claims += await storage.dequeue(q, WORKER, SAVE_JOBS - len(claims), 1.0, 60.0)
    value = b'{"receipt":"r-0001","amount":1000}'
    t0 = time.perf_counter()
    for c in claims:
        for i in range(steps):
            assert await storage.save_step(q, WORKER, c.id, c.token, f"s{i}", value)
    save = (time.perf_counter() - t0) / (SAVE_JOBS * steps)
    t0 = time.perf_counter()
    for c in claims:
        assert len(await storage.get_steps(q, c.id)) == steps
    read = (time.perf_counter() - t0) / SAVE_JOBS
    await storage.release(q, WORKER, [c.id for c in claims])
    return save * 1e6, read * 1e6


async def concurrent_saves(storage: Storage, steps: int, single: bool = False,
                           server_pids: Callable[[], list[int]] = list) -> tuple[float, float, float]:
    """(saves a second, this process's CPU µs a save, the server's CPU µs a save) when
    CONCURRENT_JOBS claimed jobs save their ``steps`` steps at once (one task a job, each
    save awaited before the next, as a handler does). ``single`` (Redis, PostgreSQL): each
    save its own call (one script call, one statement and commit), as before the saves of
    a queue were coalesced."""
    from trioqueue._core import encode_envelope

    assert isinstance(storage, Steps)
    q = f"c-{uuid.uuid4().hex[:8]}"
    await storage.heartbeat(q, WORKER, 60.0, [], 60.0)
    n = CONCURRENT_JOBS
    jobs = [NewJob(f"j{i}", encode_envelope(f"j{i}", b"null", 0, 0, 3, 60_000), 3, 60.0, f"t{i}") for i in range(n)]
    await storage.enqueue(q, jobs)
    claims = []
    while len(claims) < n:
        claims += await storage.dequeue(q, WORKER, n - len(claims), 1.0, 60.0)
    value = b'{"receipt":"r-0001","amount":1000}'

    save = single_save(storage) if single else storage.save_step

    async def one_job(c: Any) -> None:
        for i in range(steps):
            assert await save(q, WORKER, c.id, c.token, f"s{i}", value)

    t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu(server_pids)
    async with trio.open_nursery() as nursery:
        for c in claims:
            nursery.start_soon(one_job, c)
    elapsed, client, server = time.perf_counter() - t0, time.process_time() - c0, server_cpu(server_pids) - s0
    await storage.release(q, WORKER, [c.id for c in claims])
    saves = n * steps
    return saves / elapsed, client / saves * 1e6, server / saves * 1e6


def server_cpu(pids: Callable[[], list[int]]) -> float:
    """CPU seconds (user + system) used so far by the processes ``pids()`` (the server's)."""
    return h.cpu_seconds(pids())


def single_save(storage: Storage) -> Callable[..., Any]:
    """A save as one call of its own (the path before coalescing), through the storage's
    internals: Redis, one ``step.lua`` call; PostgreSQL, one ``save_step`` statement."""
    from trioqueue.storage._steps import encode_step

    if hasattr(storage, "_runner"):  # RedisStorage
        runner = storage._runner

        async def redis_save(queue: str, worker: str, job_id: str, token: str, name: str, value: bytes) -> bool:
            [saved] = await runner.run("step", queue, [worker, job_id, token, encode_step(name, value)])
            return bool(saved)

        return redis_save
    db = storage._claims._db  # type: ignore[attr-defined]  # PostgresStorage

    async def pg_save(queue: str, worker: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        async with db.conn() as conn:
            return bool(await conn.fetchval(db.sql["save_step"], queue, token, worker, job_id, encode_step(name, value)))

    return pg_save


# -- signals -----------------------------------------------------------------------------


async def signal_latency(storage: Storage, samples: int) -> tuple[list[float], list[float]]:
    """(ms from ``queue.signal`` called to the resumed handler's next line, ms the
    ``signal`` call took) for ``samples`` jobs, one at a time, each parked first (its
    ``waiting_signal`` event seen)."""
    resumed: dict[str, trio.Event] = {}
    parked: dict[str, trio.Event] = {}
    at: dict[str, float] = {}

    async def handler(job: Job[Any]) -> Any:
        payload = await job.wait_for_signal("go")
        at[job.id] = time.perf_counter()
        resumed[job.id].set()
        return payload

    def on_parked(event: Any) -> None:
        if event.job_id in parked:
            parked[event.job_id].set()

    latency, send = [], []
    name = f"g-{uuid.uuid4().hex[:8]}"
    async with Queue(storage, name=name, handler=handler, concurrency=CONCURRENCY, block_timeout=1.0) as q:
        q.on("waiting_signal", on_parked)
        for i in range(samples + SIGNAL_WARMUP):
            jid = f"w{i}"
            parked[jid], resumed[jid] = trio.Event(), trio.Event()
            await q.enqueue(jid, None)
            with trio.fail_after(60):
                await parked[jid].wait()
            t0 = time.perf_counter()
            assert await q.signal(jid, "go", i) == "delivered"
            t1 = time.perf_counter()
            with trio.fail_after(60):
                await resumed[jid].wait()
            if i >= SIGNAL_WARMUP:
                latency.append((at[jid] - t0) * 1e3)
                send.append((t1 - t0) * 1e3)
    return latency, send


def percentile(values: list[float], p: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


# -- jobs --------------------------------------------------------------------------------


async def jobs_run(storage: Storage, n: int, steps: int, with_steps: bool) -> float:
    """Seconds from the first enqueue to the last completion of ``n`` jobs."""

    async def handler(job: Job[Any]) -> int:
        total = 0
        for i in range(steps):
            total += await job.step(f"s{i}", one, i) if with_steps else one(i)
        return total

    name = f"d-{uuid.uuid4().hex[:8]}"
    async with Queue(storage, name=name, handler=handler, concurrency=CONCURRENCY, block_timeout=1.0) as q:
        done = h.all_completed(n, q)
        t0 = time.perf_counter()
        for start in range(0, n, 500):
            await q.enqueue_many([(f"j{i}", None) for i in range(start, min(n, start + 500))])
        with trio.fail_after(900):
            await done.wait()
        return time.perf_counter() - t0


async def measure(make: Callable[[], Storage], name: str, rounds: int, n: int, steps: int,
                  signals: int, server_pids: Callable[[], list[int]] = list) -> dict[str, h.Spread]:
    runs: dict[str, list[float]] = {"save": [], "read": [], "plain": [], "steps": [], "concurrent": [],
                                    "signal_p50": [], "signal_p99": [], "send_p50": []}
    single = name in ("redis", "postgres")
    if single:
        runs["concurrent_single"] = []
    async with make() as storage:
        await jobs_run(storage, min(n, 200), steps, True)  # warm-up
        for _, side in h.interleaved(rounds, ["plain", "steps", "steps_single"] if single else ["plain", "steps"]):
            if side == "steps_single":  # each save its own call, as before coalescing
                storage.save_step = single_save(storage)  # type: ignore[method-assign]
            try:
                runs.setdefault(side, []).append(await jobs_run(storage, n, steps, side != "plain"))
            finally:
                vars(storage).pop("save_step", None)
        for _ in range(rounds):
            save, read = await saves(storage, steps)
            runs["save"].append(save)
            runs["read"].append(read)
        await concurrent_saves(storage, CONCURRENT_STEPS)  # warm-up
        for _, side in h.interleaved(rounds, ["concurrent", "concurrent_single"] if single else ["concurrent"]):
            rate, client, server = await concurrent_saves(storage, CONCURRENT_STEPS, side == "concurrent_single", server_pids)
            runs[side].append(rate)
            runs.setdefault(f"{side}_client", []).append(client)
            runs.setdefault(f"{side}_server", []).append(server)
        for _ in range(rounds):
            latency, send = await signal_latency(storage, signals)
            runs["signal_p50"].append(percentile(latency, 50))
            runs["signal_p99"].append(percentile(latency, 99))
            runs["send_p50"].append(percentile(send, 50))
    return h.spreads(runs)


# -- the virtual clock -------------------------------------------------------------------


async def virtual(n: int) -> tuple[float, float]:
    """(real seconds, virtual seconds) for ``n`` jobs of three steps and two day-long sleeps."""

    async def handler(job: Job[Any]) -> int:
        a = await job.step("a", one, 1)
        await job.sleep("first", DAY)
        b = await job.step("b", one, 2)
        await job.sleep("second", DAY)
        return a + b + await job.step("c", one, 3)

    storage = MemoryStorage()
    async with Queue(storage, name="v", handler=handler, concurrency=100, reaper=False,
                     visibility_timeout=3600.0, block_timeout=3600.0) as q:
        done = h.all_completed(n, q)
        t0, v0 = time.perf_counter(), trio.current_time()
        for start in range(0, n, 500):
            await q.enqueue_many([(f"j{i}", None) for i in range(start, min(n, start + 500))])
        with trio.fail_after(10 * DAY):
            await done.wait()
        return time.perf_counter() - t0, trio.current_time() - v0


# -- DBOS --------------------------------------------------------------------------------


def dbos(venv: Path, url: str, n: int, steps: int, rounds: int, signals: int) -> dict[str, Any] | str:
    """dbos_peer.py's figures (``{"<mode>/<steps|plain>": Spread, "version": ...}``), or
    why there are none."""
    python = venv / "bin" / "python"
    if not python.exists():
        return f"no Python in {venv}"
    with tempfile.TemporaryDirectory(prefix="bench-dbos-") as d:
        out = Path(d) / "dbos.json"
        cmd = [str(python), str(h.HERE / "dbos_peer.py"), url, "--jobs", str(n), "--steps", str(steps),
               "--concurrency", str(CONCURRENCY), "--rounds", str(rounds), "--signals", str(signals), "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return f"dbos_peer.py failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
        doc = json.loads(out.read_text())
    by: dict[str, list[float]] = {}
    for r in doc["results"]:
        by.setdefault(f"{r['mode']}/{'steps' if r['steps'] else 'plain'}", []).append(r["seconds"])
    for lat in doc.get("signals", []):  # a round's latencies (ms), send to recv
        by.setdefault("signal_p50", []).append(percentile(lat, 50))
        by.setdefault("signal_p99", []).append(percentile(lat, 99))
    result: dict[str, Any] = {k: h.Spread.of(v) for k, v in by.items()}
    result["version"] = doc["version"]
    return result


# -- the result --------------------------------------------------------------------------


def main() -> None:
    p = h.parser(__doc__, out="durable.md", rounds=3, jobs=1000, storages=h.STORAGES)
    p.add_argument("--steps", type=int, default=10, help="steps a job (default %(default)s)")
    p.add_argument("--signals", type=int, default=100, help="signals a round, one at a time (default %(default)s)")
    p.add_argument("--dbos", type=Path, default=None, help="a virtualenv with dbos installed: compare on PostgreSQL")
    args = p.parse_args()
    n, steps, signals_n = args.jobs, args.steps, args.signals
    results: dict[str, dict[str, h.Spread]] = {}
    notes: list[str] = []
    peer: dict[str, Any] | str | None = None
    for target in h.each_storage(args.storages):
        results[target.name] = trio.run(measure, target.make, target.name, args.rounds, n, steps, args.signals,
                                        target.server_pids)
        notes.append(target.note)
        if target.name == "postgres" and args.dbos is not None:
            peer = dbos(args.dbos, target.url, n, steps, args.rounds, args.signals)
    virt = [trio.run(virtual, n, clock=trio.testing.MockClock(autojump_threshold=0)) for _ in range(args.rounds)]

    lines = [
        f"Steps of durable jobs (`job.step`) and durable sleeps (`job.sleep`). {n:,} jobs a run, {steps} steps a",
        f"job, a Queue with a no-op async handler at concurrency {CONCURRENCY}; median (min–max) of {args.rounds}",
        "interleaved rounds, in one run.",
        "",
        *(f"- {note}" for note in notes),
        "",
        "## A step saved",
        "",
        f"`Steps.save_step` straight on the storage, one at a time ({SAVE_JOBS} claimed jobs x {steps} steps, a",
        "34-byte value), and `get_steps` once a job (what a run's first step reads).",
        "",
    ]
    rows = []
    for storage, r in results.items():
        rows.append([storage, r["save"].fmt(",.0f", " µs"), f"{1e6 / r['save'].median:,.0f}", r["read"].fmt(",.0f", " µs")])
    lines += h.table(["storage", "a save", "saves/s (one at a time)", "a read of the steps"], rows)
    lines += [
        "",
        "## Step saves of many jobs at once",
        "",
        f"{CONCURRENT_JOBS} claimed jobs save {CONCURRENT_STEPS} steps each at once (a task a job, each save",
        "awaited before the next, as a handler does), straight on the storage: saves a second, and",
        "the CPU time a save costs this process (client) and the server (Redis, PostgreSQL). Coalesced:",
        "the storage's `save_step` (Redis: the concurrent saves of a queue in one `step.lua` call;",
        "PostgreSQL: in one statement and one commit); one call a save: each save its own script",
        "call (pipelined on the connection) or statement and commit, as before. At one core each:",
        "the rate if the client and the server each had a core to themselves (1 / the larger CPU",
        "time a save), what a loaded machine hides.",
        "",
    ]
    rows = []
    for storage, r in results.items():
        for side, label in (("concurrent", "coalesced"), ("concurrent_single", "one call a save")):
            if side not in r:
                continue
            client, server = r[f"{side}_client"].median, r[f"{side}_server"].median
            rows.append([storage, label, r[side].fmt(",.0f"), f"{client:,.1f} µs",
                         f"{server:,.1f} µs" if storage in ("redis", "postgres") else "–",
                         f"{1e6 / max(client, server):,.0f}"])
    lines += h.table(["storage", "saves", "saves/s", "client CPU a save", "server CPU a save", "saves/s at one core each"],
                     rows)
    lines += [
        "",
        "## A signal to a parked job",
        "",
        f"A job waits (`job.wait_for_signal(\"go\")`) and parks in `waiting_signal`; once its event is seen,",
        "`queue.signal(job_id, \"go\", i)` is sent from the same process and the time taken until the",
        f"resumed handler's next line runs (after `wait_for_signal` returns). {signals_n} signals a round, one",
        "at a time; p50 and p99 of each round, median (min–max) over the rounds. The send: the",
        "`signal` call alone.",
        "",
    ]
    rows = []
    for storage, r in results.items():
        rows.append([storage, r["signal_p50"].fmt(",.2f", " ms"), r["signal_p99"].fmt(",.2f", " ms"),
                     r["send_p50"].fmt(",.2f", " ms")])
    if isinstance(peer, dict) and "signal_p50" in peer:
        rows.append([f"DBOS {peer['version']} (`send` → `recv`), same PostgreSQL", peer["signal_p50"].fmt(",.2f", " ms"),
                     peer["signal_p99"].fmt(",.2f", " ms"), "–"])
    lines += h.table(["storage", "signal → next line, p50", "p99", "the send, p50"], rows)
    lines += [
        "",
        "## Jobs with steps against the same jobs without",
        "",
        f"The same handler, taking its {steps} steps with `await job.step(f\"s{{i}}\", one, i)` or calling",
        "`one(i)` directly; from the first enqueue to the last completion. Added a step: the wall",
        "time the steps add, per step, at this concurrency. One call a save (Redis, PostgreSQL): the same",
        "jobs with each step saved by a call of its own, as before the saves were coalesced.",
        "",
    ]
    rows = []
    for storage, r in results.items():
        plain_rate, steps_rate = n / r["plain"].median, n / r["steps"].median
        added = (r["steps"].median - r["plain"].median) / (n * steps) * 1e6
        single = r.get("steps_single")
        rows.append([storage, f"{plain_rate:,.0f}", f"{steps_rate:,.0f}", f"{steps_rate / plain_rate:.2f}",
                     f"{n * steps / r['steps'].median:,.0f}", f"{added:,.1f} µs",
                     f"{n * steps / single.median:,.0f}" if single else "–"])
    lines += h.table(["storage", "jobs/s without steps", f"jobs/s with {steps} steps", "ratio", "steps/s",
                      "added a step", "steps/s, one call a save"], rows)
    real = h.Spread.of(v[0] for v in virt)
    virtual_s = statistics_median([v[1] for v in virt])
    hours = n * 2 * DAY / 3600
    lines += [
        "",
        "## Durable sleeps on the virtual clock",
        "",
        f"MemoryStorage under `trio.testing.MockClock(autojump_threshold=0)`: {n:,} jobs, each a step, a",
        "day's `job.sleep`, a step, another day's sleep and a last step (48 job-hours each; the Queue",
        "with `reaper=False` and hour-long leases and claim waits, concurrency 100).",
        "",
        *h.table(["jobs", "virtual time", "real time", "simulated job-hours per real second"],
                 [[f"{n:,}", f"{virtual_s / 3600:,.1f} h", real.fmt(".2f", " s"), f"{hours / real.median:,.0f}"]]),
    ]
    if args.dbos is not None and "postgres" in results:
        lines += ["", "## DBOS on the same PostgreSQL server", ""]
        if isinstance(peer, str) or peer is None:
            lines.append(f"Not measured: {peer or 'no PostgreSQL run'}.")
        else:
            r = results["postgres"]
            lines += [
                f"DBOS {peer['version']} (`benches/dbos_peer.py`, in a virtualenv of its own) on the embedded server",
                f"above, right after trioqueue's run: {n:,} workflows of {steps} async steps (`@DBOS.step`), and the",
                "same workflows calling the function without steps; `queued`: enqueued on a DBOS queue",
                f"(`worker_concurrency={CONCURRENCY}`, polled every 10 ms) and every result awaited; `direct`:",
                f"`DBOS.start_workflow_async`, {CONCURRENCY} at a time. Ratio: trioqueue's jobs/s over DBOS's.",
                "",
            ]
            rows = [["trioqueue (Queue, PostgresStorage)", f"{n / r['plain'].median:,.0f}", f"{n / r['steps'].median:,.0f}",
                     f"{n * steps / r['steps'].median:,.0f}", "1.00", "–"]]
            single = r["steps_single"]
            rows.append(["trioqueue, one call a save (before coalescing)", "–", f"{n / single.median:,.0f}",
                         f"{n * steps / single.median:,.0f}", f"{single.median / r['steps'].median:.2f}", "1.00"])
            for mode in ("queued", "direct"):
                plain, with_steps = peer[f"{mode}/plain"], peer[f"{mode}/steps"]
                rows.append([f"DBOS, {mode}", f"{n / plain.median:,.0f}", f"{n / with_steps.median:,.0f}",
                             f"{n * steps / with_steps.median:,.0f}", f"{with_steps.median / r['steps'].median:.2f}",
                             f"{with_steps.median / single.median:.2f}"])
            lines += h.table(["", "jobs/s without steps", f"jobs/s with {steps} steps", "steps/s",
                              "trioqueue / this (with steps)", "trioqueue before / this"], rows)
    h.write(args, "Durable jobs: steps and sleeps", lines)


def statistics_median(values: list[float]) -> float:
    return h.Spread.of(values).median


if __name__ == "__main__":
    main()
