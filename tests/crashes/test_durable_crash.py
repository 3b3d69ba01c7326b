"""Durable jobs under ``kill -9``: multi-step jobs that sleep and wait for signals, run by
worker processes that are killed at seeded moments (tests/helpers/queue_worker.py, mode
``durable``), on every backend that several processes can share; and on MemoryStorage,
whose workers are stopped by force instead.

The proof, from the log every step's effect appends to (``STEP <job> <step> <worker>
<time>``, one ``O_APPEND`` write each, so the log's order is the order of the effects)
and the jobs' results (the stored value of each step: the id of the worker whose run
stored it):

- every job completes, and its steps ran in order;
- a step whose value was stored never ran again: the value a job returns for a step is
  the one its *last* execution made;
- a step that ran more than once was in flight when its run ended: every execution but
  the last was the last step of its run, a run whose worker was killed or gave up its
  claim (lease lost: under load a heartbeat may come too late, and the worker stops the
  handler before the reaper may hand the job on; ``LOST`` in the log). A run is a
  worker's effects for a job up to its next ``LOST`` for that job (the same worker may
  claim the job again);
- a sleep never wakes early: every run that passed it did so at or after the wake-up
  time the job stored;
- signals are taken once each, in the order they were sent: each job returns the
  payloads sent to it, in order, each once.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from support import Recorder
from test_processes import Fleet, fleet, shared_storage, spec_of  # noqa: F401 - fixtures
from trioqueue import Job, JobState, MemoryStorage, Queue, Storage, Worker
from trioqueue._model import _clock

STEPS = 5


Effect = tuple[str, str, str, int]  # (job, step, worker, run): the worker's run-th run of the job


def step_log(log: Path) -> tuple[list[Effect], set[tuple[str, str, int]]]:
    """The steps' effects in the order they happened, and the runs that ended with their
    lease lost: ``(job, worker, run)``."""
    if not log.exists():
        return [], set()
    effects: list[Effect] = []
    lost: set[tuple[str, str, int]] = set()
    runs: dict[tuple[str, str], int] = defaultdict(int)  # (job, worker) -> its current run
    for line in log.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "STEP":
            effects.append((parts[1], parts[2], parts[3], runs[parts[1], parts[3]]))
        elif parts[0] == "LOST":
            job, worker = parts[1], parts[3]
            lost.add((job, worker, runs[job, worker]))
            runs[job, worker] += 1
    return effects, lost


def woke_log(log: Path) -> list[tuple[str, float]]:
    """When each run passed its job's sleep: ``(job, time)``."""
    if not log.exists():
        return []
    return [(p[1], float(p[4])) for p in (line.split(" ") for line in log.read_text().splitlines()) if p[0] == "WOKE"]


def wake_violations(woke: list[tuple[str, float]], wake_at: dict[str, float]) -> list[str]:
    """The runs that passed a sleep before its stored wake-up time."""
    return [f"{job}: passed its sleep at {t!r}, before {wake_at[job]!r}" for job, t in woke if t < wake_at[job]]


def violations(
    effects: list[Effect], results: dict[str, list[str]], killed: set[str], lost: Collection[tuple[str, str, int]] = ()
) -> list[str]:
    """What the durable-steps promise rules out in this run (empty: nothing); ``lost``:
    the runs ``(job, worker, run)`` that ended with their lease lost."""
    problems: list[str] = []
    by_step: dict[tuple[str, str], list[int]] = defaultdict(list)  # (job, step) -> indexes in the log
    last_of_run: dict[tuple[str, str, int], int] = {}  # (job, worker, run) -> index of that run's last effect
    for i, (job, step, worker, run) in enumerate(effects):
        by_step[(job, step)].append(i)
        last_of_run[(job, worker, run)] = i
    for job, values in results.items():
        if len(values) != STEPS:
            problems.append(f"{job}: {len(values)} step values, expected {STEPS}")
            continue
        previous_end = -1
        for k, stored in enumerate(values):
            runs = by_step.get((job, f"s{k}"), [])
            if not runs:
                problems.append(f"{job}: step s{k} has a value but never ran")
                continue
            last = runs[-1]
            if effects[last][2] != stored:
                problems.append(f"{job}: s{k} stored {stored!r} but its last execution was by {effects[last][2]!r}")
            if runs[0] < previous_end:
                problems.append(f"{job}: s{k} ran before s{k - 1}'s value was stored")
            previous_end = last
            for i in runs[:-1]:
                _, _, worker, run = effects[i]
                if worker not in killed and (job, worker, run) not in lost:
                    problems.append(f"{job}: s{k} ran again after {worker!r}, which was not killed nor lost the job, ran it")
                elif last_of_run[(job, worker, run)] != i:
                    problems.append(f"{job}: s{k} ran again though {worker!r} went on to later steps in that run")
    return problems


@pytest.mark.parametrize("seed", [7])
async def test_durable_jobs_under_sigkill_run_no_stored_step_twice_never_wake_early_and_take_each_signal_once(
    shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str, seed: int
) -> None:
    rng = random.Random(seed)
    log = tmp_path / "steps.log"
    total = 40
    jobs = [
        (f"job-{i:03}", {"steps": STEPS, "pause": rng.uniform(0.005, 0.03), "nap": rng.uniform(0.05, 0.4), "signals": 2})
        for i in range(total)
    ]
    generation = 0
    killed: set[str] = set()

    def spec(slot: int) -> dict[str, Any]:
        return spec_of(
            shared_storage, queue=queue_name, worker_id=f"w{slot}-{generation}", log=str(log),
            visibility_timeout=1.0, concurrency=4,
        )  # fmt: skip

    completed = Recorder()
    with trio.fail_after(150):
        # (max_attempts is the job's, set by the Queue that enqueues: kills use attempts)
        async with Queue(shared_storage, name=queue_name, max_attempts=50) as producer:
            producer.on("completed", completed)
            alive: dict[int, str] = {}
            for slot in range(3):
                await fleet.start("durable", spec(slot), "READY")
                alive[slot] = spec(slot)["worker_id"]
            await producer.enqueue_many(jobs)
            for round_ in range(5):
                # a moment in the run: the log is other processes' file, nothing to wait on
                await trio.sleep(rng.uniform(0.1, 0.4))
                if round_ in (0, 2):  # the signals, sent while workers die (kept if early)
                    for job_id, _ in jobs:
                        assert await producer.signal(job_id, "go", {"job": job_id, "n": round_}) == "delivered"
                slot = rng.randrange(3)
                fleet.kill(alive[slot])
                killed.add(alive[slot])
                generation += 1
                await fleet.start("durable", spec(slot), "READY")
                alive[slot] = spec(slot)["worker_id"]
            with trio.move_on_after(90):
                await completed.wait_until(lambda evs: len({e.job_id for e in evs}) >= total)
            late = [s for s in await producer.get_statuses([j for j, _ in jobs]) if s is None or s.state is not JobState.COMPLETED]
            assert not late, f"seed {seed}: not completed: " + "; ".join(
                f"{s.id} {s.state} attempts {s.attempts} error {s.error} steps {list(s.steps)}" for s in late if s
            )
            results: dict[str, list[str]] = {}
            wake_at: dict[str, float] = {}
            for job_id, _ in jobs:
                status = await producer.get_status(job_id)
                assert status is not None and status.state is JobState.COMPLETED, (job_id, status)
                results[job_id] = status.result["steps"]
                assert status.result["signals"] == [{"job": job_id, "n": 0}, {"job": job_id, "n": 2}], job_id
                assert list(status.steps) == ["s0", "s1", "nap", "s2", "s3", "s4"]
                wake_at[job_id] = status.steps["nap"]
    effects, lost = step_log(log)
    problems = violations(effects, results, killed, lost) + wake_violations(woke_log(log), wake_at)
    assert not problems, f"seed {seed}: " + "; ".join(problems[:10])
    print(
        f"seed {seed}: {len(killed)} kill -9, {len(lost)} runs lost their lease, "
        f"{len(effects) - total * STEPS} step effects repeated (in flight when their run ended)"
    )


def test_the_check_catches_a_stored_step_that_ran_again() -> None:
    """The checker itself: a step run twice by a worker that was not killed, or by a
    killed one that had gone on to later steps, or whose stored value is not its last
    execution's, is reported."""
    ok = [("j", f"s{k}", "a", 0) for k in range(STEPS)]
    assert violations(ok, {"j": ["a"] * STEPS}, set()) == []
    # a killed in flight at s2: b runs s2 again and the rest
    crash = ok[:3] + [("j", "s2", "b", 0), ("j", "s3", "b", 0), ("j", "s4", "b", 0)]
    assert violations(crash, {"j": ["a", "a", "b", "b", "b"]}, {"a"}) == []
    assert violations(crash, {"j": ["a", "a", "b", "b", "b"]}, set()) != []  # a was not killed
    assert violations(crash, {"j": ["a", "a", "a", "b", "b"]}, {"a"}) != []  # stored a stale value
    late = ok[:4] + [("j", "s2", "b", 0), ("j", "s3", "b", 0), ("j", "s4", "b", 0)]
    assert violations(late, {"j": ["a", "a", "b", "b", "b"]}, {"a"}) != []  # a had gone on to s3
    # a lost its lease in flight at s2 and claimed the job again later: its next run runs s2
    again = ok[:3] + [("j", "s2", "a", 1), ("j", "s3", "a", 1), ("j", "s4", "a", 1)]
    assert violations(again, {"j": ["a"] * STEPS}, set(), {("j", "a", 0)}) == []
    assert violations(again, {"j": ["a"] * STEPS}, set()) != []  # no lease lost, no kill
    assert violations(late, {"j": ["a", "a", "b", "b", "b"]}, set(), {("j", "a", 0)}) != []  # run 0 went on to s3


@pytest.mark.parametrize("seed", [7, 11])
async def test_durable_jobs_under_forced_stops_on_memory_run_no_stored_step_twice_never_wake_early_and_take_each_signal_once(
    autojump_clock: trio.testing.MockClock, seed: int
) -> None:
    """MemoryStorage cannot span processes: its workers are stopped by force instead (their
    cancel scopes cancelled at seeded virtual moments, running handlers cancelled mid-step)
    and replaced. Under the virtual clock the run is the same on every replay of a seed."""
    rng = random.Random(seed)
    total = 40
    effects: list[Effect] = []
    woke: list[tuple[str, float]] = []
    stopped: set[str] = set()

    def handler_of(worker_id: str) -> Any:
        async def handler(job: Job[Any]) -> dict[str, Any]:
            async def effect(name: str) -> str:
                effects.append((job.id, name, worker_id, 0))  # (a stopped worker never comes back)
                await trio.sleep(job.payload["pause"])  # a stop here: the effect happened, not stored
                return worker_id

            values, signals = [], []
            for i in range(job.payload["steps"]):
                values.append(await job.step(f"s{i}", effect, f"s{i}"))
                await trio.sleep(job.payload["pause"])
                if i == 1:
                    await job.sleep("nap", job.payload["nap"])
                    woke.append((job.id, _clock.now()))
                if i == 2:
                    for _ in range(2):
                        signals.append(await job.wait_for_signal("go"))
            return {"steps": values, "signals": signals}

        return handler

    async def run_worker(queue: Queue[Any, Any], worker_id: str, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with Worker(queue, handler=handler_of(worker_id), worker_id=worker_id, concurrency=4,
                              visibility_timeout=5.0, block_timeout=60.0, retry_delay=0):  # fmt: skip
                task_status.started(scope)
                await trio.sleep_forever()

    completed = Recorder()
    storage = MemoryStorage()
    ids = [f"job-{i:03}" for i in range(total)]
    async with Queue(storage, name="durable", max_attempts=50) as queue, trio.open_nursery() as nursery:
        queue.on("completed", completed)
        alive = {slot: f"w{slot}-0" for slot in range(3)}
        scopes = {slot: await nursery.start(run_worker, queue, alive[slot]) for slot in range(3)}
        await queue.enqueue_many(
            [(i, {"steps": STEPS, "pause": rng.uniform(0.005, 0.03), "nap": rng.uniform(0.05, 0.4)}) for i in ids]
        )
        for generation in range(1, 6):
            await trio.sleep(rng.uniform(0.02, 0.2))
            if generation in (1, 3):
                for job_id in ids:
                    assert await queue.signal(job_id, "go", {"job": job_id, "n": generation}) == "delivered"
            slot = rng.randrange(3)
            scopes[slot].cancel()
            stopped.add(alive[slot])
            alive[slot] = f"w{slot}-{generation}"
            scopes[slot] = await nursery.start(run_worker, queue, alive[slot])
        with trio.fail_after(600):
            await completed.wait_until(lambda evs: len({e.job_id for e in evs}) >= total)
        results, wake_at = {}, {}
        for job_id in ids:
            status = await queue.get_status(job_id)
            assert status is not None and status.state is JobState.COMPLETED, status
            results[job_id] = status.result["steps"]
            assert status.result["signals"] == [{"job": job_id, "n": 1}, {"job": job_id, "n": 3}], job_id
            wake_at[job_id] = status.steps["nap"]
        nursery.cancel_scope.cancel()
    problems = violations(effects, results, stopped) + wake_violations(woke, wake_at)
    assert not problems, f"seed {seed}: " + "; ".join(problems[:10])
    assert len(effects) > total * STEPS, "no stop landed in a step: the test proved nothing"
