"""Model-based test: seeded random walks of producers, consumers, cancels and faults.

Each example is one seeded walk on a fresh storage (memory, file, redis): producers
enqueue (fire-and-forget and ``enqueue_and_wait``, every job with a random priority, some
delayed by ``delay=`` or ``at=``), consumers start, stop gracefully, are stopped by force
or crash (their storage becomes unreachable, then they are cancelled), jobs are cancelled
and enqueued again, the producer pauses and resumes the queue, and every consumer's
storage is a :class:`~trioqueue.testing.FaultyStorage` that fails, delays and cancels its
calls (cancellations act as forced stops at that very call). The seed also decides whether
the walk's consumers all share a ``rate_limit`` and/or a ``global_concurrency``, and
whether a periodic schedule is registered, whose ticks the consumers' (leader-elected)
reapers enqueue, whether the consumers run batch handlers (each job of a batch settled
on its own), and whether jobs have groups (fair queuing), at most one of a group
running at a time in some walks. With draws of their own too, some walks' jobs are
durable (not in batch walks: a batch handler cannot take steps, sleep or wait): steps
(each call of a step's function recorded, returning a value no other call returns; the
first attempt may fail after a step, so a retry replays), a durable sleep (``sleep`` or
``sleep_until``, 0.05-0.3 s) between two steps, or one or two waits for a signal with a
timeout, the producer sending their messages as the walk goes (some before the first
wait, some after, fewer than the waits for some: a timeout); and some jobs are enqueued
with ``depends_on`` (1-3 jobs of the walk, under a random ``on_child_failure``). Under
the faulty layers a pass-through (:class:`Recording`) records every storage call that
moves a job, with what it returned. After every step and at the end it checks the
invariants of a reliable queue:

- attempts of an incarnation never decrease, but for a refund: a holder handing back
  claims that never reached a handler (at a stop) takes back the attempts it counted at
  claim time; they never fall below an attempt a handler ran (but for a durable sleep or
  wait for a signal, whose run gives its attempt back);
- every acknowledged enqueue (and every tick a reaper enqueued) ends ``completed``,
  ``failed`` or ``cancelled`` (once healthy consumers run);
- a handler that returned never runs again for the same incarnation unless a storage call
  settling (or starting) that job provably failed or was interrupted;
- every waiter gets exactly the terminal outcome of its incarnation (never a timeout);
- no handler run of a delayed job begins before its due time (a few ms of clock
  granularity aside);
- two handlers of one job id never run at the same time (a worker that lost its lease,
  or could not renew it in time, cancelled its handler first); with
  ``group_concurrency=1``, two handlers of one group neither;
- priorities: the claims of one ``dequeue`` come in priority order, and no ``dequeue``
  claims a job while a job of a lower priority number was surely in the ready list from
  before the call began until after it ended (see :meth:`Walk.check_priorities` for what
  "surely" covers);
- pause: no ``dequeue`` made while paused (it began after ``pause()`` returned and ended
  before the next ``resume()`` began; one waiting across the resume may claim after it)
  claims a job, and no ``start()`` made then counts the attempt of a reserved
  (prefetched) claim, so no prefetched job starts while paused (a job whose attempt was
  counted at its claim, before the pause, is running and may begin its handler after);
- global concurrency N: the storage never counts more than N jobs processing (after each
  step and right after each claim), and no ``dequeue`` claims while N claims are surely
  held; rate limit: at most ``limit`` claims in any ``per`` seconds (over calls that
  surely fall in a shorter span);
- schedules: a tick is enqueued once (one incarnation), its time is on the schedule's
  grid (which registering the schedule again, as workers do at start-up, never moves),
  and its handler returns once (the rerun excuse above applies);
- no task is left running after the queues' nurseries exit;
- trees of jobs: a parent never begins before every child of it ended,
  and no job of a tree is lost (every one ends terminal, as above);
- steps: a step whose value was stored (a ``save_step`` the storage acknowledged, or
  read back in ``JobStatus.steps`` at the end) never runs again for that incarnation (a
  save whose reply was lost was stored all the same: the next run replays it; only a
  step whose save never landed runs again), and a completed job's result is its stored
  values;
- durable sleeps: no run passes a sleep before the wake-up time stored for it (a few ms
  of clock granularity aside);
- signals: the k-th wait of every run takes the k-th message delivered (each message
  once, in send order, the same on a replay); a wait whose message was delivered before
  it began neither parks nor times out (but for a replay of a timeout stored by an
  earlier run); a timeout never comes before ``timeout`` seconds from the first time the
  job waited there; a completed job returns what its waits took;
- dependencies: a dependent's handler never begins before every run of its dependencies
  ended, it sees their outcomes (``children_results``/``children_failures`` against
  their final records), and under ``on_child_failure="cancel"`` it never runs with a
  failed one;
- nothing stays behind once the results expire (registry empty, dead workers gone).

``TRIOQUEUE_FUZZ_EXAMPLES=5000`` runs that many walks per storage instead of the CI's few.
A failing walk prints its seed; rerun it with ``TRIOQUEUE_FUZZ_SEED=<seed>``. A long walk:
``TRIOQUEUE_FUZZ_EXAMPLES=<n>`` seeds from ``TRIOQUEUE_FUZZ_FIRST`` (default 0).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import _make_storage
from trioqueue import (
    BatchOutcome,
    Child,
    Job,
    JobCancelledError,
    JobFailedError,
    Queue,
    QueueStoppedError,
    RateLimit,
    SignalTimeoutError,
    Storage,
    StorageError,
)
from trioqueue.testing import FaultPlan, FaultyStorage

from model_parts import Consumer, Dependent, Effect, Flow, Incarnation, Run, Wait, live_tasks
from model_record import DUE_SLACK, LEASE, SCHEDULE, Call, RecordChecks, Recording

TERMINAL = ("completed", "failed", "cancelled")
CI_EXAMPLES = {"memory": 20, "file": 10, "redis": 10, "postgres": 10}
TTL = 60.0

CONSUMER_FAULTS = FaultPlan(
    delay=0.05,
    max_delay=0.02,
    fail_before=0.04,
    fail_after=0.04,
    cancel_before=0.01,
    cancel_after=0.01,
    drop_events=0.05,
)
PRODUCER_FAULTS = FaultPlan(
    fail_before=0.05,
    fail_after=0.05,
    methods=frozenset({"enqueue", "cancel", "set_paused"}),
    drop_events=0.05,
)


def _examples(backend: str) -> list[int]:
    if "TRIOQUEUE_FUZZ_SEED" in os.environ:
        return [int(os.environ["TRIOQUEUE_FUZZ_SEED"])]
    n = int(os.environ.get("TRIOQUEUE_FUZZ_EXAMPLES", "0")) or CI_EXAMPLES[backend]
    first = int(os.environ.get("TRIOQUEUE_FUZZ_FIRST", "0"))
    return list(range(first, first + n))


class Walk(RecordChecks):
    def __init__(self, storage: Storage, seed: int, name: str) -> None:
        self.inner = storage
        self.redis = type(storage).__name__ == "RedisStorage"  # a claim may act after it raised
        self.rec = Recording(storage)
        self.seed = seed
        self.rng = random.Random(seed)
        self.name = name
        self.incarnations: dict[str, list[Incarnation]] = {}
        self.priorities: dict[str, int] = {}
        self.runs: list[Run] = []
        self.consumers: list[Consumer] = []
        self.faulty_by_worker: dict[str, FaultyStorage] = {}
        self.waiters: list[tuple[str, Incarnation | None, list[Any]]] = []
        self.next_id = 0
        # Paused from pause() returning to the next resume() beginning (record positions).
        self.pauses: list[tuple[int, int]] = []
        self.paused_since: int | None = None
        # What this walk exercises (decided by the seed).
        rate = RateLimit(self.rng.randint(2, 4), per=self.rng.uniform(0.1, 0.3)) if self.rng.random() < 0.3 else None
        concurrency = self.rng.randint(1, 3) if self.rng.random() < 0.3 else None
        # Groups: their own draws (every seed's other choices stay): jobs in a few groups,
        # and in some walks at most one job of a group at a time
        self.grng = random.Random(f"{seed}-groups")
        self.grouped = self.grng.random() < 0.4
        self.job_groups: dict[str, str] = {}
        self.flow = Flow(rate, concurrency, 1 if self.grouped and self.grng.random() < 0.5 else None)
        self.over_cap: list[int] = []
        if concurrency is not None:
            self.rec.after_claim = self.sample_processing
        self.trees: dict[str, list[str]] = {}
        self.every = self.rng.uniform(0.1, 0.3) if self.rng.random() < 0.3 else None
        batches = random.Random(f"{seed}-batch")  # (its own draws: the other choices of a seed stay)
        self.batch_size = batches.randint(2, 4) if batches.random() < 0.25 else 0
        self.schedule_created: float | None = None
        # Durable jobs and dependencies: their own draws too. Batch handlers cannot take
        # steps, sleep or wait for signals: those walks have dependencies only.
        self.drng = random.Random(f"{seed}-durable")
        self.durable = not self.batch_size and self.drng.random() < 0.6
        self.depending = self.drng.random() < 0.5
        self.effects: list[Effect] = []  # every call of a step's function
        self.sent: dict[str, list[tuple[Any, float]]] = {}  # a signal job's delivered messages (payload, when)
        self.to_send: dict[str, int] = {}  # messages a signal job is still to get
        self.unsure_signals: set[str] = set()  # a send raised: its mailbox is unknown
        self.dependents: dict[str, Dependent] = {}
        self.first_n: dict[str, int] = {}  # a job id's first payload "n"
        self.timeouts: dict[str, float] = {}  # a signal job's timeout

    def fail(self, message: str) -> None:
        pytest.fail(f"seed {self.seed} ({self.name}): {message}")

    # -- the handler: behaviour encoded in the payload ---------------------------------

    def _run_of(self, job: Job[Any]) -> Run:
        incs = self.incarnations.get(job.id)
        run = Run(
            job.id,
            job.worker_id,
            job.attempts,
            incarnation=incs[-1] if incs else None,
            group=job.payload.get("g"),
            began=time.time(),
            not_before=job.payload.get("due"),
            n=job.payload.get("n"),
        )
        self.runs.append(run)
        return run

    async def batch_handler(self, jobs: list[Job[Any]]) -> BatchOutcome:
        """The handler's behaviour for a batch: each job settled on its own."""
        runs = [self._run_of(job) for job in jobs]
        outcome = BatchOutcome()
        try:
            if any(job.payload["kind"] == "slow" for job in jobs):
                await trio.sleep(0.15)
            for job, run in zip(jobs, runs, strict=True):
                kind = job.payload["kind"]
                if kind == "fail" or (kind == "flaky" and job.attempts == 1):
                    outcome.fail(job, ValueError(f"{kind} job {job.id}"))
                else:
                    run.returned = True
                    outcome.complete(job, int(job.payload["n"]))
            return outcome
        finally:
            ended = time.time()
            for run in runs:
                run.ended = ended

    async def handler(self, job: Job[Any]) -> Any:
        run = self._run_of(job)
        try:
            kind, payload = job.payload["kind"], job.payload
            if "deps" in payload:
                results = await job.children_results()
                failures = await job.children_failures()
                run.seen_deps = (results, {j: e.type for j, e in failures.items()})
            if kind == "steps":
                result: Any = await self._steps(job)
            elif kind == "sleep":
                result = await self._sleep(job, run)
            elif kind == "signal":
                result = await self._waits(job, run)
            else:
                if kind == "slow":
                    await trio.sleep(0.15)
                if kind == "fail" or (kind == "flaky" and job.attempts == 1):
                    raise ValueError(f"{kind} job {job.id}")
                result = int(payload["n"])
            run.returned = True
            return result
        finally:
            run.ended = time.time()

    def _effect(self, job: Job[Any], name: str) -> str:
        """A step's function: records the call, returns a value no other call returns."""
        value = f"{name}#{len(self.effects)}"
        self.effects.append(Effect(job.id, job.payload["n"], name, value, time.time()))
        return value

    async def _steps(self, job: Job[Any]) -> list[str]:
        """Steps ``s0``..: the first attempt fails after step ``fail`` (a retry replays the
        stored ones), ``slow`` ones take time between steps (for faults to land there)."""
        values = []
        for i in range(job.payload["steps"]):
            values.append(await job.step(f"s{i}", self._effect, job, f"s{i}"))
            if i == job.payload["fail"] and job.attempts == 1:
                raise ValueError(f"steps job {job.id} fails after step {i}")
            if job.payload["slow"]:
                await trio.sleep(0.05)
        return values

    async def _sleep(self, job: Job[Any], run: Run) -> list[str]:
        """A step, a durable sleep (``sleep`` or ``sleep_until``), a step."""
        before = await job.step("pre", self._effect, job, "pre")
        nap = job.payload["nap"]
        if job.payload["until"]:
            await job.sleep_until("nap", time.time() + nap)  # (only the first run's time is stored)
        else:
            await job.sleep("nap", nap)
        run.passed_sleep = time.time()
        return [before, await job.step("post", self._effect, job, "post")]

    async def _waits(self, job: Job[Any], run: Run) -> list[Any]:
        """``waits`` waits for signal ``go``, each with the job's timeout (a timeout is
        the outcome ``"timeout"``)."""
        got = []
        for k in range(job.payload["waits"]):
            wait = Wait(k, time.time())
            run.waits.append(wait)
            try:
                wait.value = await job.wait_for_signal("go", timeout=job.payload["timeout"])
                wait.outcome = "msg"
            except SignalTimeoutError:
                wait.at, wait.outcome, wait.value = time.time(), "timeout", "timeout"
            except BaseException as exc:  # parked (the run ends), or cancelled
                wait.outcome = type(exc).__name__
                raise
            got.append(wait.value)
        return got

    # -- operations --------------------------------------------------------------------

    def _consumer_queue(self, storage: Storage, concurrency: int) -> Queue[Any, Any]:
        handlers: dict[str, Any] = {"handler": self.handler}
        if self.batch_size:  # batch handlers (the walk's consumers all have them)
            handlers = {"batch_handler": self.batch_handler, "batch_size": self.batch_size, "batch_wait": 0.02}
        return Queue(
            storage,
            name=self.name,
            **handlers,
            concurrency=concurrency,
            max_attempts=3,
            retry_delay=0,
            block_timeout=0.2,
            visibility_timeout=LEASE,
            result_ttl=TTL,
            **self.flow.settings(),
        )

    async def start_consumer(self, nursery: trio.Nursery) -> None:
        faulty = FaultyStorage(self.rec, CONSUMER_FAULTS, seed=self.rng.randrange(1 << 30))
        queue = self._consumer_queue(faulty, 2)
        consumer = Consumer(queue, faulty, trio.CancelScope())
        faulty.cancel_scope = consumer.scope
        self.faulty_by_worker[queue.worker_id] = faulty

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            started = False
            try:
                with consumer.scope:  # an injected cancellation stops it, as a forced stop
                    async with trio.open_nursery() as inner:
                        await inner.start(queue.run)
                        started = True
                        task_status.started()
            finally:
                consumer.done.set()
                if not started:
                    task_status.started()  # stopped (by a fault) before it ran

        self.consumers.append(consumer)
        with trio.move_on_after(5):
            await nursery.start(run)

    async def stop_consumer(self, how: str) -> None:
        if not self.consumers:
            return
        consumer = self.consumers.pop(self.rng.randrange(len(self.consumers)))
        if how == "graceful":
            consumer.queue.stop()
        elif how == "crash":
            consumer.faulty.dead = True  # its storage is gone: cleanup cannot reach it
            consumer.scope.cancel()
        else:
            consumer.scope.cancel()
        with trio.fail_after(30):
            await consumer.done.wait()

    async def enqueue(self, producer: Queue[Any, Any], nursery: trio.Nursery, wait: bool) -> None:
        job_id = f"j{self.next_id}"
        self.next_id += 1
        kind = self.rng.choice(["ok", "ok", "slow", "flaky", "fail"])
        self.priorities[job_id] = self.rng.randint(0, 9)
        when: dict[str, Any] = {}
        if self.rng.random() < 0.25:
            delay = self.rng.uniform(0.05, 0.4)
            due = time.time() + delay
            how = self.rng.choice(["delay", "at", "datetime"])
            if how == "delay":
                when["delay"] = delay  # the producer takes its time later: due no earlier
            else:
                when["at"] = due if how == "at" else datetime.fromtimestamp(due, UTC)
            when["due"] = due
        extra: dict[str, Any] = {}
        if self.durable and self.drng.random() < 0.4:
            kind = self.drng.choice(["steps", "sleep", "signal"])
            if kind == "steps":
                steps = self.drng.randint(2, 4)
                extra = {"steps": steps, "fail": self.drng.randrange(-1, steps), "slow": self.drng.random() < 0.3}
            elif kind == "sleep":
                extra = {"nap": self.drng.uniform(0.05, 0.3), "until": self.drng.random() < 0.5}
            else:
                waits = self.drng.randint(1, 2)
                extra = {"waits": waits, "timeout": self.drng.uniform(0.1, 1.0)}
                self.to_send[job_id] = self.drng.randint(0, waits)  # fewer than waits: a timeout
                self.timeouts[job_id] = extra["timeout"]
        deps: list[str] = []
        if not wait and self.depending and self.drng.random() < 0.3:
            # jobs of the walk with one incarnation (their record is the one named)
            known = sorted(j for j, incs in self.incarnations.items() if len(incs) == 1)
            if known:
                deps = self.drng.sample(known, min(len(known), self.drng.randint(1, 3)))
                when = {}  # (a dependent's delay is not used: it runs once released)
        await self._enqueue(producer, nursery, job_id, kind, wait, extra=extra, deps=deps, **when)
        if kind == "signal" and self.drng.random() < 0.5:
            await self.send_signal(producer, job_id)  # (maybe before its first wait)

    async def _enqueue(
        self,
        producer: Queue[Any, Any],
        nursery: trio.Nursery,
        job_id: str,
        kind: str,
        wait: bool,
        due: float | None = None,
        extra: dict[str, Any] | None = None,
        deps: list[str] | None = None,
        **when: Any,
    ) -> None:
        since = time.time()  # (before the call: a new incarnation's runs begin after it)
        payload: dict[str, Any] = {"kind": kind, "n": self.next_id, **(extra or {})}
        self.first_n.setdefault(job_id, self.next_id)
        if due is not None:
            payload["due"] = due
        options = {"priority": self.priorities[job_id], **when}
        policy = self.drng.choice(["continue", "ignore", "cancel"]) if deps else None
        if deps:
            payload["deps"] = deps
            options |= {"depends_on": deps, "on_child_failure": policy}
        if self.grouped and (group := self.grng.choice(["g1", "g2", "g3", None])) is not None:
            payload["g"] = options["group"] = self.job_groups[job_id] = group
        if wait:
            outcome: list[Any] = []
            self.waiters.append((job_id, None, outcome))
            index = len(self.waiters) - 1

            async def waiter() -> None:
                try:
                    result = await producer.enqueue_and_wait(job_id, payload, timeout=60, **options)
                    outcome.append(("result", result))
                except (JobFailedError, JobCancelledError, StorageError, QueueStoppedError) as exc:
                    outcome.append((type(exc).__name__, None))
                except TimeoutError as exc:
                    outcome.append(("timeout", str(exc)))

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked(0.01)
            inc = await self._learn(job_id, kind, since)
            self.waiters[index] = (job_id, inc, outcome)
            return
        try:
            result = await producer.enqueue(job_id, payload, **options)
        except StorageError:
            inc = await self._learn(job_id, kind, since)  # landed or not: the registry says
        else:
            inc = await self._learn(job_id, kind, since) if result.status.value == "queued" else None
        if inc is not None and deps:
            assert policy is not None
            self.dependents[job_id] = Dependent(inc, payload["n"], [(d, self.incarnations[d][-1]) for d in deps], policy)

    async def tree(self, producer: Queue[Any, Any]) -> None:
        """A parent with 1 to 3 children (of any kind), under a random on_child_failure."""
        parent, kids = f"j{self.next_id}", []
        self.next_id += 1
        for _ in range(self.rng.randint(1, 3)):
            kid, kind = f"j{self.next_id}", self.rng.choice(["ok", "ok", "slow", "flaky", "fail"])
            self.next_id += 1
            self.priorities[kid] = self.rng.randint(0, 9)
            kids.append(Child(kid, {"kind": kind, "n": self.next_id}, options={"priority": self.priorities[kid]}))
        self.priorities[parent] = self.rng.randint(0, 9)
        policy = self.rng.choice(["cancel", "continue", "ignore"])
        since = time.time()
        try:
            await producer.enqueue(
                parent, {"kind": "ok", "n": 0}, children=kids, on_child_failure=policy, priority=self.priorities[parent]  # type: ignore[arg-type]
            )
        except StorageError:
            pass  # landed or not: the registry says
        if await self._learn(parent, "ok", since) is not None:
            self.trees[parent] = [k.id for k in kids]
            for k in kids:
                await self._learn(k.id, k.payload["kind"], since)

    async def _learn(self, job_id: str, kind: str, since: float) -> Incarnation | None:
        rec = await self.inner.get_job(self.name, job_id)
        if rec is None:
            return None
        incs = self.incarnations.setdefault(job_id, [])
        if incs and incs[-1].token == rec.token:
            return incs[-1]
        inc = Incarnation(job_id, rec.token, kind, rec.attempts, since=since)
        incs.append(inc)
        return inc

    async def cancel(self, producer: Queue[Any, Any]) -> None:
        if not self.incarnations:
            return
        job_id = self.rng.choice(sorted(self.incarnations))
        try:
            result = await producer.cancel(job_id)
        except StorageError:  # it may have landed (its reply was lost): maybe cancelled
            self.incarnations[job_id][-1].cancel_requested = True
            return
        if result.status.value == "cancelled":
            self.incarnations[job_id][-1].cancel_requested = True

    async def send_signal(self, producer: Queue[Any, Any], job_id: str) -> None:
        """The next message to signal job ``job_id`` (while its first incarnation is the
        one its id names: a new one, enqueued again, waits for nothing)."""
        if self.to_send.get(job_id, 0) <= 0 or len(self.incarnations.get(job_id, ())) != 1:
            return
        self.to_send[job_id] -= 1
        sent = self.sent.setdefault(job_id, [])
        payload = {"job": job_id, "i": len(sent)}
        try:
            answer = await producer.signal(job_id, "go", payload)
        except StorageError:
            self.unsure_signals.add(job_id)
            self.to_send[job_id] = 0
            return
        if answer == "delivered":
            sent.append((payload, time.time()))
        else:
            self.to_send[job_id] = 0  # ended (cancelled): no more

    async def send_signals(self, producer: Queue[Any, Any]) -> None:
        """After each step of the walk, some signal jobs get their next message."""
        for job_id in sorted(self.to_send):
            if self.to_send[job_id] > 0 and self.drng.random() < 0.3:
                await self.send_signal(producer, job_id)

    async def reenqueue(self, producer: Queue[Any, Any], nursery: trio.Nursery) -> None:
        for job_id in sorted(self.incarnations):
            rec = await self.inner.get_job(self.name, job_id)
            if rec is not None and rec.state.startswith("cancelled"):
                await self._enqueue(producer, nursery, job_id, "ok", self.rng.random() < 0.5)
                return

    async def pause(self, producer: Queue[Any, Any]) -> None:
        try:
            await producer.pause()
        except StorageError:
            return  # paused or not: no window to check (resume() comes before the quiesce)
        if self.paused_since is None:
            self.paused_since = self.rec.mark()

    async def resume(self, producer: Queue[Any, Any]) -> None:
        if self.paused_since is not None:
            self.pauses.append((self.paused_since, self.rec.mark()))
            self.paused_since = None
        try:
            await producer.resume()
        except StorageError:
            pass  # still paused, maybe: checked no further (its window is closed)

    # -- invariants --------------------------------------------------------------------

    async def check_attempts(self) -> None:
        for job_id, incs in self.incarnations.items():
            rec = await self.inner.get_job(self.name, job_id)
            if rec is None:
                continue
            inc = incs[-1]
            if rec.token != inc.token:
                continue
            if rec.attempts < inc.attempts_seen:
                # a refund (a claim handed back unstarted: pause, stop), never below an
                # attempt that ran; the job may have moved on since (cancelled while queued)
                ran = max((r.attempt for r in self.runs if r.incarnation is inc), default=0)
                # (a durable sleep or wait gives its attempt back: attempts <= ran there)
                if rec.attempts < ran and inc.kind not in ("sleep", "signal"):
                    self.fail(
                        f"attempts of {job_id} went down: {inc.attempts_seen} -> {rec.attempts} ({rec.state}), "
                        f"an attempt {ran} ran"
                    )
            inc.attempts_seen = rec.attempts

    async def sample_processing(self) -> None:
        """The storage is the authority on the jobs claimed now: never above the cap
        (sampled after each step, and by the recorder right after each claim)."""
        cap = self.flow.concurrency
        if cap is not None:
            processing = (await self.inner.counts(self.name))["processing"]
            if processing > cap:
                self.over_cap.append(processing)

    async def check_processing_cap(self) -> None:
        await self.sample_processing()
        if self.over_cap:
            self.fail(f"{max(self.over_cap)} jobs processing with global_concurrency={self.flow.concurrency}")

    @staticmethod
    def ticks_of(c: Call) -> list[str]:
        """The ticks an enqueue or ``tick_schedule`` call is about (a skipped tick has no job)."""
        if c.method == "tick_schedule":
            return [] if c.args[3] is None else [c.args[3].id]
        return [job.id for job in c.args[1] if job.id.startswith(f"{SCHEDULE}@")]

    def tick_calls(self) -> list[Call]:
        return [c for c in self.rec.record if c.method in ("enqueue", "tick_schedule")]

    def ticks(self, *, tried: bool = False) -> list[str]:
        """The tick jobs the reapers enqueued, in order (``tried``: those they tried to; a
        call that raised may not have landed; a tick not later than the last one is not
        enqueued)."""
        calls = [c for c in self.tick_calls() if (c.ok and c.result is not False) or tried]
        return list(dict.fromkeys(job_id for c in calls for job_id in self.ticks_of(c)))

    async def check_final(self, ticks: list[str]) -> None:
        for job_id in [*self.incarnations, *ticks]:
            rec = await self.inner.get_job(self.name, job_id)
            if rec is None:
                self.fail(f"acknowledged job {job_id} disappeared before its result expired")
            assert rec is not None
            kind = rec.state.split(":")[0]
            if kind not in ("completed", "failed", "cancelled"):
                self.fail(f"job {job_id} ended {rec.state}, not terminal")
        # A job of a tree may be cancelled by the tree itself (a sibling failed under
        # "cancel", or its parent was cancelled), and then enqueued again by the walk.
        in_trees = {*self.trees, *(k for kids in self.trees.values() for k in kids)}
        for job_id, incs in self.incarnations.items():
            for inc in incs[:-1]:  # replaced incarnations were cancelled
                if not inc.cancel_requested and job_id not in in_trees:
                    self.fail(f"job {job_id}: incarnation {inc.token} was replaced without a cancel")
        self.check_reruns()
        for job_id, inc, outcome in self.waiters:
            if not outcome:
                self.fail(f"waiter of {job_id} never returned")
            what, value = outcome[0]
            if what == "timeout":
                self.fail(f"waiter of {job_id} timed out: a lost wake-up ({value})")
            if inc is None or what in ("StorageError", "QueueStoppedError"):
                continue
            incs = self.incarnations[job_id]
            rec = await self.inner.get_job(self.name, job_id)
            assert rec is not None
            final = rec.state.split(":")[0] if incs[-1] is inc else "cancelled"
            expected = {"completed": "result", "failed": "JobFailedError", "cancelled": "JobCancelledError"}[final]
            if what != expected:
                self.fail(f"waiter of {job_id} ({inc.token}) got {what}, its incarnation ended {final}")


    # -- durable jobs and dependencies ---------------------------------------------------

    async def check_durable(self, producer: Queue[Any, Any]) -> None:
        """The steps, sleeps, signals and dependencies of the walk's jobs (their final
        records read back: terminal now)."""
        effects: dict[str, Effect] = {e.value: e for e in self.effects}
        for c in self.calls("save_step"):
            # a save the storage surely stored: no call of that step afterwards
            if not (c.ok and c.result):
                continue
            job_id, name, data = c.args[2], c.args[4], c.args[5]
            value = json.loads(data) if not name.startswith("\x00") else None
            stored = effects.get(value) if isinstance(value, str) else None
            if stored is None:
                continue  # a sleep's wake-up time, a signal's outcome
            again = [e for e in self.effects if (e.job_id, e.n, e.name) == (job_id, stored.n, name) and e.t > c.t1]
            if again:
                self.fail(f"job {job_id}: step {name} stored ({stored.value}, save ended at {c.t1:.3f}) ran again: {again}")
        for job_id, incs in self.incarnations.items():
            kind = incs[0].kind
            if kind not in ("steps", "sleep", "signal"):
                continue
            status = await producer.get_status(job_id)
            assert status is not None
            n = self.first_n[job_id]  # its payload's n: the durable incarnation's runs
            runs = [r for r in self.runs if r.job_id == job_id and r.n == n]
            # (enqueued again after a cancel: the record is another incarnation's)
            steps = (status.steps or {}) if len(incs) == 1 else {}
            self.check_steps(job_id, n, steps, status)
            if kind == "sleep" and len(incs) == 1:
                wake = steps.get("nap")
                for run in runs:
                    if run.passed_sleep is not None and (wake is None or run.passed_sleep < wake - DUE_SLACK):
                        self.fail(
                            f"job {job_id} (attempt {run.attempt}) passed its sleep at {run.passed_sleep:.3f}, "
                            f"stored wake-up {wake}"
                        )
            elif kind == "signal":
                self.check_waits(job_id, runs, status if len(incs) == 1 else None)
        await self.check_dependents()

    def check_steps(self, job_id: str, n: int | None, steps: dict[str, Any], status: Any) -> None:
        """Each stored step's value came from the last call of its function (a call after
        the one stored would have run a stored step again), and a completed steps job's
        result is its stored values."""
        calls = [e for e in self.effects if e.job_id == job_id and e.n == n]
        for name, value in steps.items():
            of_step = [e for e in calls if e.name == name]
            if not of_step:
                continue  # a sleep's wake-up time
            if of_step[-1].value != value:
                later = of_step[[e.value for e in of_step].index(value) + 1 :] if value in [e.value for e in of_step] else of_step
                self.fail(f"job {job_id}: step {name} stored {value!r}, then its function ran again: {later}")
        if status.state.value == "completed" and len(self.incarnations[job_id]) == 1:
            kind = self.incarnations[job_id][0].kind
            if kind == "steps":
                expected = [steps[f"s{i}"] for i in range(len(status.result))]
                if status.result != expected or len(steps) != len(expected):
                    self.fail(f"steps job {job_id} returned {status.result}, its stored steps are {steps}")
            elif kind == "sleep" and status.result != [steps.get("pre"), steps.get("post")]:
                self.fail(f"sleep job {job_id} returned {status.result}, its stored steps are {steps}")

    def check_waits(self, job_id: str, runs: list[Run], status: Any) -> None:
        """The k-th wait of a run takes the k-th message delivered (so each once, in send
        order); a wait never parks nor (first) times out when its message had been
        delivered before it began; a timeout never comes before ``timeout`` seconds from
        the first time the job waited there; a completed job returns what its waits took."""
        if job_id in self.unsure_signals:
            return
        sent = self.sent.get(job_id, [])
        first: dict[int, float] = {}
        timed_out: dict[int, float] = {}  # k -> when a run first timed out there
        stored: set[int] = set()  # waits whose timeout an earlier run may have stored
        for run in sorted(runs, key=lambda r: r.began):
            for w in run.waits:
                first.setdefault(w.k, w.began)
                there = w.k < len(sent) and sent[w.k][1] < w.began
                if w.outcome == "msg":
                    if w.k >= len(sent) or w.value != sent[w.k][0]:
                        self.fail(f"job {job_id}: wait {w.k} took {w.value}, the messages delivered are {[p for p, _ in sent]}")
                elif w.outcome == "Parked" and there:
                    self.fail(
                        f"job {job_id}: wait {w.k} parked (attempt {run.attempt}), "
                        f"its message {sent[w.k][0]} was delivered before"
                    )
                elif w.outcome == "timeout":
                    if there and w.k not in stored:  # (not a replay of a stored timeout)
                        self.fail(
                            f"job {job_id}: wait {w.k} timed out (attempt {run.attempt}), "
                            f"its message {sent[w.k][0]} was delivered before"
                        )
                    timed_out.setdefault(w.k, w.at)
                if w.outcome not in ("msg", "Parked"):  # timed out, or a save that raised: maybe stored
                    stored.add(w.k)
        timeout = self.timeouts[job_id]
        for k, at in timed_out.items():
            if at < first[k] + timeout - DUE_SLACK:
                self.fail(
                    f"job {job_id}: wait {k} timed out {first[k] + timeout - at:.3f} s before its timeout ({timeout:.3f} s)"
                )
        if status is not None and status.state.value == "completed":
            for k, got in enumerate(status.result):
                if got != "timeout" and (k >= len(sent) or got != sent[k][0]):
                    self.fail(f"signal job {job_id} returned {status.result}, the messages delivered are {[p for p, _ in sent]}")

    async def check_dependents(self) -> None:
        """A dependent's handler never begins before every dependency (its incarnation
        when the dependent was enqueued) ended, and it sees their outcomes; under
        ``on_child_failure="cancel"`` it never runs with a failed one."""
        for job_id, dep in self.dependents.items():
            runs = [r for r in self.runs if r.job_id == job_id and r.n == dep.n and r.seen_deps is not None]
            if not runs:
                continue
            began = min(r.began for r in runs)
            for d, inc in dep.deps:
                incs = self.incarnations[d]
                again = incs[incs.index(inc) + 1].since if incs[-1] is not inc else math.inf
                for run in self.runs:
                    if run.job_id == d and run.incarnation is inc and run.began < again and run.ended > began + DUE_SLACK:
                        self.fail(
                            f"dependent {job_id} began {run.ended - began:.3f} s before its dependency {d} "
                            f"(attempt {run.attempt} on {run.worker}) ended"
                        )
            for run in runs:
                assert run.seen_deps is not None
                results, failures = run.seen_deps
                if dep.policy == "cancel" and failures:
                    self.fail(f"dependent {job_id} (on_child_failure='cancel') ran with failed dependencies {failures}")
                for d, inc in dep.deps:
                    if self.incarnations[d][-1] is not inc:
                        continue  # enqueued again since: its record is another's
                    rec = await self.inner.get_job(self.name, d)
                    assert rec is not None
                    final = rec.state.split(":")[0]
                    if final == "completed":
                        ok = d in results and d not in failures
                        ok = ok and (rec.result is None or results[d] == json.loads(rec.result))
                    elif final == "cancelled":
                        ok = d not in results and failures.get(d) == "JobCancelledError"
                    else:
                        ok = d not in results and d in failures
                    if not ok:
                        self.fail(
                            f"dependent {job_id} saw results {results}, failures {failures}; dependency {d} ended {rec.state}"
                        )


async def _walk(storage: Storage, seed: int) -> None:
    name = f"model-{seed}"
    walk = Walk(storage, seed, name)
    baseline = live_tasks()
    async with storage, trio.open_nursery() as nursery:
        producer_storage = FaultyStorage(walk.rec, PRODUCER_FAULTS, seed=seed)
        producer: Queue[Any, Any] = Queue(producer_storage, name=name, result_ttl=TTL)
        await nursery.start(producer.run)
        ops = ["start", "start", "enqueue", "enqueue", "enqueue", "wait", "wait", "cancel", "reenqueue", "stop", "force", "crash", "sleep"]
        ops += ["burst", "pause", "resume"]
        ops += ["tree", "tree"]
        if walk.every is not None:
            tick_payload = {"kind": walk.rng.choice(["ok", "ok", "slow", "flaky"]), "n": 0}
            schedule = await producer.schedule(SCHEDULE, tick_payload, every=walk.every)
            walk.schedule_created = schedule.created_at
            ops += ["reschedule"]  # as a worker declaring its schedules at start-up does
        for _ in range(walk.rng.randint(8, 18)):
            op = walk.rng.choice(ops)
            if op == "start" and len(walk.consumers) < 3:
                await walk.start_consumer(nursery)
            elif op in ("enqueue", "wait"):
                await walk.enqueue(producer, nursery, op == "wait")
            elif op == "burst":  # a backlog: claims choose among priorities
                for _ in range(walk.rng.randint(2, 5)):
                    await walk.enqueue(producer, nursery, False)
            elif op == "tree":
                await walk.tree(producer)
            elif op == "cancel":
                await walk.cancel(producer)
            elif op == "reenqueue":
                await walk.reenqueue(producer, nursery)
            elif op in ("stop", "force", "crash"):
                await walk.stop_consumer({"stop": "graceful", "force": "force", "crash": "crash"}[op])
            elif op == "pause":
                await walk.pause(producer)
            elif op == "resume":
                await walk.resume(producer)
            elif op == "reschedule":  # registering it again changes nothing: not its grid
                again = await producer.schedule(SCHEDULE, tick_payload, every=walk.every)
                if again.created_at != walk.schedule_created:
                    walk.fail(f"re-registering the schedule moved its grid: {walk.schedule_created} -> {again.created_at}")
            else:
                await trio.sleep(walk.rng.uniform(0.01, 0.3))
            await walk.send_signals(producer)
            await walk.check_attempts()
            await walk.check_processing_cap()
        # Quiesce: resumed, no more ticks, a healthy consumer (and reaper) finishes everything.
        producer_storage.enabled = False
        for consumer in walk.consumers:
            consumer.faulty.enabled = False
        await walk.resume(producer)
        healthy = walk._consumer_queue(walk.rec, 4)
        async with healthy, healthy.events("completed", "failed", "cancelled", "resync", "enqueued") as stream:
            if walk.every is not None:
                # The ticks go on under whichever reaper leads now, until one more is
                # enqueued; then no more (a reaper's scan under way may add one).
                mark = walk.rec.mark()
                with trio.fail_after(30):
                    while not any(c.begin > mark and c.ok and c.result for c in walk.tick_calls() if walk.ticks_of(c)):
                        with trio.move_on_after(walk.every):
                            await stream.__anext__()
                await producer.unschedule(SCHEDULE)
            pending: dict[str, str | None] = {}
            with trio.move_on_after(60):
                while True:
                    ticks = walk.ticks()
                    records = {j: await storage.get_job(name, j) for j in [*walk.incarnations, *ticks]}
                    pending = {j: r and r.state for j, r in records.items() if not (r and r.state.split(":")[0] in TERMINAL)}
                    if not pending:
                        break
                    with trio.move_on_after(LEASE):  # a stalled job shows no event until the reaper
                        await stream.__anext__()
            if pending:
                walk.fail(f"jobs not terminal 60 s after the walk: {pending} (trees: {walk.trees})")
            with trio.fail_after(60):
                for _, _, outcome in walk.waiters:
                    while not outcome:
                        await trio.sleep(0.01)
            await walk.check_attempts()
            await walk.check_processing_cap()
            walk.check_ticks()
            await walk.check_final(ticks)
            await walk.check_durable(producer)
        while walk.consumers:
            await walk.stop_consumer("graceful")
        producer.stop()
    if live_tasks() > baseline:
        walk.fail(f"{live_tasks() - baseline} task(s) left running after the queues exited")
    walk.check_due()
    walk.check_priorities()
    walk.check_overlaps()
    walk.check_group_overlaps()
    walk.check_trees()
    walk.check_pause()
    walk.check_flow()
    # Nothing grows once results expire: every entry goes, dead workers too.
    async with storage:
        for job_id in [*walk.incarnations, *ticks]:
            await storage.update_result_ttl(name, job_id, 0.01)
        await trio.sleep(max(LEASE, 0.05) + 0.05)  # TTLs and heartbeats run out: no event says so
        await storage.recover_stalled(name)
        left = [j for j in [*walk.incarnations, *ticks] if await storage.get_job(name, j) is not None]
        if left:
            walk.fail(f"entries left after their TTL: {left[:5]}")
        if await storage.workers(name, include_expired=True):
            walk.fail(f"dead workers left in the registry: {await storage.workers(name, include_expired=True)}")


@pytest.mark.parametrize("backend", ["memory", "file", "redis", "postgres"])
async def test_random_walks_keep_the_invariants(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    for seed in _examples(backend):
        storage = _make_storage(backend, request, tmp_path / f"walk-{seed}")
        await _walk(storage, seed)
