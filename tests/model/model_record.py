"""The model walk's record of storage calls (:class:`Recording`, a pass-through under every
queue of a walk) and the invariants checked over it (:class:`RecordChecks`, a part of
``test_model.Walk``): priorities, pause, flow limits and schedule ticks."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any

import trio

from trioqueue import EnqueueStatus, Storage
from trioqueue.testing import FaultyStorage

LEASE = 0.6  # the walk's visibility timeout
DUE_SLACK = 0.005  # seconds: the storages keep due times in wall-clock milliseconds
# A cancelled blocking claim (Redis: BLMOVE on a connection that is being closed) may
# still take a job for a moment after the call raised.
BLIND_GRACE = 0.1
SCHEDULE = "tick"  # the name of the walk's schedule
# the calls that may end a job (and, through its tree, its tree's other jobs)
_ENDING = frozenset({"cancel", "settle", "release", "start", "recover_stalled"})

@dataclass
class Call:
    """One storage call as the storage saw it: ``begin``/``end`` are positions in the walk's
    sequence (what happened before what), ``t0``/``t1`` wall-clock times."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    begin: int
    t0: float
    end: int = -1
    t1: float = math.inf
    result: Any = None
    raised: bool = False

    @property
    def ok(self) -> bool:
        return self.end >= 0 and not self.raised


class Recording(FaultyStorage):
    """A pass-through (no faults planned) under every queue of the walk, recording the calls
    that move jobs and what they returned (which a faulty layer above may then lose)."""

    RECORDED = frozenset(
        {
            "enqueue", "enqueue_flow", "tick_schedule", "dequeue", "settle", "release", "start", "recover_stalled", "cancel", "set_paused",
            "held_jobs", "heartbeat", "unregister_worker",
            "save_step",
        }
    )  # fmt: skip

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.seq = count()
        self.record: list[Call] = []
        self.after_claim: Callable[[], Awaitable[None]] | None = None  # run after a claim

    def mark(self) -> int:
        return next(self.seq)

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method not in self.RECORDED:
            return await super()._call(method, args, kwargs)
        call = Call(method, args, kwargs, self.mark(), time.time())
        self.record.append(call)
        try:
            call.result = await super()._call(method, args, kwargs)
        except BaseException:
            call.raised = True
            raise
        finally:
            call.t1 = time.time()
            call.end = self.mark()
        if method == "dequeue" and call.result and self.after_claim is not None:
            with trio.CancelScope(shield=True):  # the caller must get its claims
                await self.after_claim()
        return call.result


class RecordChecks:
    """The invariants over the record of storage calls, for ``test_model.Walk`` (which
    holds the record, ``rec``, and what the walk knows of its jobs)."""

    rec: Recording
    fail: Callable[[str], None]
    runs: list[Any]  # the handler runs (test_model.Run)
    incarnations: dict[str, list[Any]]
    faulty_by_worker: dict[str, Any]
    trees: dict[str, list[str]]  # a tree's parent id -> its children's ids
    job_groups: dict[str, str]  # a job id -> its group (jobs with one)

    def check_trees(self) -> None:
        """A parent never begins before every child of it has ended: no run of the
        parent's first incarnation begins before a run of a child (of the child's first
        incarnation, the tree's) ends. (That no job of a tree is lost: check_final.)"""
        for parent, kids in self.trees.items():
            first = self.incarnations[parent][0]
            began = [r.began for r in self.runs if r.job_id == parent and r.incarnation is first]
            if not began:
                continue  # failed by a child (cancel), or cancelled: it never ran
            for kid in kids:
                incs = self.incarnations.get(kid)
                if not incs:
                    continue
                # (a run of the id once it was enqueued again is not the tree's: the
                # handler may begin before the walk learned of the new incarnation)
                again = incs[1].since if len(incs) > 1 else math.inf
                for run in self.runs:
                    if run.job_id != kid or run.incarnation is not incs[0] or run.began >= again:
                        continue
                    if run.ended > min(began) + DUE_SLACK:
                        self.fail(
                            f"parent {parent} began {run.ended - min(began):.3f} s before its child {kid} "
                            f"(attempt {run.attempt} on {run.worker}) ended"
                        )

    def check_reruns(self) -> None:
        by_job: dict[str, list[Run]] = {}
        for run in self.runs:
            by_job.setdefault(run.job_id, []).append(run)
        for job_id, runs in by_job.items():
            returned = [r for r in runs if r.returned]
            if len(returned) < 2 and not (returned and runs[-1] is not returned[-1]):
                continue
            if len(self.incarnations.get(job_id, ())) > 1:
                continue  # enqueued again after a cancel: a new incarnation may run again
            first = returned[0]
            excused = self.faulty_by_worker.get(first.worker)
            # (a heartbeat that failed about the job let its lease run out: a settlement
            # that arrives after the reaper recovered it is refused, and it runs again)
            if excused is None or not (
                excused.faults_on(job_id, "settle")
                or excused.faults_on(job_id, "start")
                or excused.faults_on(job_id, "heartbeat")
                or excused.dead
            ):
                self.fail(f"job {job_id} ran again after its handler returned, with no failed settlement: {runs}")

    def check_overlaps(self) -> None:
        """Two handlers of one job id never run at the same time: a worker whose lease is
        lost (recovered, fenced, or about to run out while its heartbeats fail) cancels
        the handler before the job can run elsewhere. (One machine: the clocks agree.)"""
        by_job: dict[str, list[Run]] = {}
        for run in self.runs:
            by_job.setdefault(run.job_id, []).append(run)
        for job_id, runs in by_job.items():
            runs.sort(key=lambda r: r.began)
            for a, b in zip(runs, runs[1:]):
                if b.began < a.ended - DUE_SLACK:
                    self.fail(
                        f"job {job_id}: attempt {b.attempt} on {b.worker} began {a.ended - b.began:.3f} s "
                        f"before attempt {a.attempt} on {a.worker} ended"
                    )

    def check_group_overlaps(self) -> None:
        """``group_concurrency=1``: two handlers of one group never run at the same time
        (a group's slot comes back only when its job is settled, released or recovered,
        and a worker cancels a handler before its lease can be recovered)."""
        if self.flow.group_concurrency != 1:
            return
        by_group: dict[str, list[Run]] = {}
        for run in self.runs:
            if run.group is not None:
                by_group.setdefault(run.group, []).append(run)
        for group, runs in by_group.items():
            runs.sort(key=lambda r: r.began)
            for a, b in zip(runs, runs[1:]):
                if b.began < a.ended - DUE_SLACK:
                    self.fail(
                        f"group {group}: {b.job_id} (attempt {b.attempt} on {b.worker}) began "
                        f"{a.ended - b.began:.3f} s before {a.job_id} (attempt {a.attempt} on {a.worker}) ended"
                    )

    def check_due(self) -> None:
        for run in self.runs:
            if run.not_before is not None and run.began < run.not_before - DUE_SLACK:
                self.fail(
                    f"job {run.job_id} (attempt {run.attempt}) began {run.not_before - run.began:.3f} s "
                    f"before it was due"
                )


    def calls(self, method: str) -> list[Call]:
        return [c for c in self.rec.record if c.method == method]

    def _priority(self) -> dict[str, int]:
        """Each job's priority as enqueued (the walk keeps one per job id; ticks have the
        default)."""
        prio: dict[str, int] = {}
        for c in self.rec.record:
            if c.method == "enqueue":
                jobs = list(c.args[1])
            elif c.method == "enqueue_flow":
                jobs = [fj.job for fj in c.args[0]]  # a tree's jobs
            elif c.method == "tick_schedule" and c.args[3] is not None:
                jobs = [c.args[3]]  # a tick's job, enqueued with its record
            else:
                continue
            for job in jobs:
                if prio.setdefault(job.id, job.priority) != job.priority:
                    self.fail(f"job {job.id} enqueued with priorities {prio[job.id]} and {job.priority}")
        return prio

    def check_priorities(self) -> None:
        """Claims follow the priorities, at the storage where it is exact.

        Within one ``dequeue``'s claims, priorities never go down. Across calls: a job K is
        *surely ready* from the end of a call that put it in the ready list — an
        acknowledged enqueue without a due time, a ``release`` that gave back every job it
        was given, a ``recover_stalled`` that says ``requeued`` — until the beginning of
        the first call that may have taken it out: a ``dequeue`` that returned it, a
        ``cancel`` of it, or a ``dequeue`` that raised and may have claimed it unseen (see
        :meth:`_unseen_claims`). A ``dequeue`` must not claim a job of a higher priority
        number than a job surely ready from before it began until after it ended. This
        holds across workers (the ready list is the queue's), so it covers each worker's
        own claims; prefetch does not matter here, as the order is the storage's, not the
        order in which handlers begin.

        Not covered: a job whose enqueue raised (it may or may not be there), delayed jobs
        and retries (promoted at a time no call reports), jobs a ``start()`` refused and put
        back (while paused), jobs of groups under ``group_concurrency`` (passed over while
        their group's slots are taken), and FIFO order within a priority."""
        prio = self._priority()
        dequeues = self.calls("dequeue")
        for c in dequeues:
            if c.ok and c.result:
                batch = [(claim.id, prio[claim.id]) for claim in c.result]
                if [p for _, p in batch] != sorted(p for _, p in batch):
                    self.fail(f"one claim took jobs out of priority order: {batch} (worker {c.args[1]})")
        ready = self._ready_spans()
        # with group_concurrency, a job of a group whose slots are all taken is passed over
        capped = set(self.job_groups) if self.flow.group_concurrency else set()
        for c in dequeues:
            if not (c.ok and c.result):
                continue
            worst = max(c.result, key=lambda claim: prio[claim.id])
            for job_id, spans in ready.items():
                if prio[job_id] >= prio[worst.id] or job_id in capped:
                    continue
                for since, until, e in spans:
                    if since < c.begin and until > c.end:
                        self.fail(
                            f"worker {c.args[1]} claimed {worst.id} (priority {prio[worst.id]}) while {job_id} "
                            f"(priority {prio[job_id]}) was ready, since the {e.method} that ended at "
                            f"#{since} (claim #{c.begin}-#{c.end})"
                        )

    def _ready_spans(self) -> dict[str, list[tuple[int, float, Call]]]:
        """Each job's spans of being surely ready: ``(since, until, the call it entered by)``
        (record positions; see :meth:`check_priorities`)."""
        entries: list[tuple[str, Call]] = []
        takers: dict[str, list[Call]] = defaultdict(list)
        # A job of a tree leaves the ready list when its tree says so (its parent was
        # cancelled, or a sibling failed under "cancel"): any call that ends a job of the
        # tree may take out every job of it.
        tree_of = {job: [parent, *kids] for parent, kids in self.trees.items() for job in (parent, *kids)}
        for c in self.rec.record:
            if c.method == "cancel":
                takers[c.args[1]].append(c)
            if tree_of and c.method in _ENDING:
                named = repr((c.args, c.result))
                for members in {tuple(tree_of[j]) for j in tree_of if f"'{j}'" in named}:
                    for member in members:
                        takers[member].append(c)
            if not c.ok:
                continue
            if c.method == "enqueue":
                for job, outcome in zip(c.args[1], c.result, strict=True):
                    if outcome.status is EnqueueStatus.QUEUED and job.run_at is None:
                        entries.append((job.id, c))
            elif c.method == "release":
                ids = set(c.args[2])
                if ids and c.result == len(ids):
                    entries += [(job_id, c) for job_id in ids]
            elif c.method == "recover_stalled":
                entries += [(job_id, c) for job_id, outcome in c.result[0] if outcome == "requeued"]
            elif c.method == "dequeue":
                for claim in c.result:
                    takers[claim.id].append(c)
        unseen = self._unseen_claims()
        ready: dict[str, list[tuple[int, float, Call]]] = defaultdict(list)
        for job_id, e in entries:
            until = min((t.begin for t in takers[job_id] if t.end > e.begin), default=math.inf)
            until = min(until, min((b.begin for b, may_take in unseen if may_take(job_id, e)), default=math.inf))
            if e.end < until:
                ready[job_id].append((e.end, until, e))
        return ready

    def _unseen_claims(self) -> list[tuple[Call, Any]]:
        """The ``dequeue`` calls that raised, each with ``may_take(job_id, entry)``: whether
        it may have claimed that job, unseen, after it entered the ready list in ``entry``.

        A claim cancelled mid-flight may leave jobs in its worker's processing list (the
        contract: where ``held_jobs`` finds them), and a cancelled blocking claim (Redis:
        BLMOVE on a connection being closed) may still take one for a moment after the call
        raised (``grace``). Such a job stays in that list until a call moves it: a release
        or a ``settle``/``start`` naming it, another ``dequeue`` of that worker (Redis
        claims or puts back what a blocking move left there), a ``recover_stalled`` that
        returns it, raised, or may have found the worker dead (Redis then puts such jobs
        back without saying so). So the call did not take K if a ``held_jobs`` of the
        worker after it did not list K and no such call came in between."""
        grace = BLIND_GRACE if self.redis else 0.0
        heartbeats: dict[str, list[Call]] = defaultdict(list)
        for c in self.calls("heartbeat"):
            if c.ok:
                heartbeats[c.args[1]].append(c)
        gone: dict[str, int] = {}  # worker -> when its unregister_worker began
        for c in self.calls("unregister_worker"):
            gone.setdefault(c.args[1], c.begin)

        def alive(worker: str, c: Call) -> bool:
            """Surely registered as alive throughout call ``c``."""
            if gone.get(worker, math.inf) < c.end:
                return False
            return any(hb.t1 < c.t0 and hb.t0 + LEASE - DUE_SLACK > c.t1 for hb in heartbeats[worker])

        def moves(c: Call, worker: str, job_id: str) -> bool:
            """Whether ``c`` may have moved ``job_id`` out of ``worker``'s processing list."""
            if c.method == "recover_stalled":
                return not c.ok or not alive(worker, c) or any(j == job_id for j, _ in c.result[0])
            if c.args[1] != worker:
                return False
            if c.method == "dequeue":
                return True
            if c.method == "release":
                return job_id in c.args[2]
            if c.method == "settle":
                return any(x.id == job_id for x in c.args[2])
            if c.method == "start":
                return any(j == job_id for j, _ in c.args[2])
            return False

        movers = ("recover_stalled", "dequeue", "release", "settle", "start")
        out: list[tuple[Call, Any]] = []
        for r in self.calls("dequeue"):
            if not r.raised:
                continue
            worker, after = r.args[1], r.t1 + grace
            looks = [c for c in self.calls("held_jobs") if c.ok and c.args[1] == worker and c.t0 > after]
            horizon = max((c.end for c in looks), default=-1)
            between = [
                c for c in self.rec.record if c.method in movers and c is not r and r.begin < c.end and c.begin < horizon
            ]

            def may_take(
                job_id: str,
                entry: Call,
                worker: str = worker,
                after: float = after,
                looks: list[Call] = looks,
                between: list[Call] = between,
            ) -> bool:
                if entry.t0 >= after:
                    return False  # in the ready list only once the call could take nothing
                look = next((c for c in looks if job_id not in c.result), None)
                if look is None:
                    return True
                return any(c.begin < look.end and moves(c, worker, job_id) for c in between)

            out.append((r, may_take))
        return out

    def check_pause(self) -> None:
        """While paused, nothing is claimed and no reserved claim is started (see the
        module docstring); a ``start()`` that answered True for a claim before the pause,
        or that raised (it may have counted it), excuses a later True for that claim."""
        windows = list(self.pauses)
        if not windows:
            return

        def paused(c: Call) -> tuple[int, int] | None:
            """The pause ``c`` fell in: it began after pause() returned and ended before
            resume() began (a call that spans the resume may claim after it)."""
            return next(((a, b) for a, b in windows if a < c.begin and c.end < b), None)

        reserved: set[str] = set()
        for c in self.calls("dequeue"):
            if not (c.ok and c.result):
                continue
            reserved.update(claim.token for claim in c.result if not claim.started)
            window = paused(c)
            if window is not None:
                self.fail(
                    f"worker {c.args[1]} claimed {[claim.id for claim in c.result]} in a dequeue made "
                    f"(#{c.begin}-#{c.end}) after pause() returned (#{window[0]}), before resume() (#{window[1]})"
                )
        starts = self.calls("start")
        for c in starts:
            window = paused(c)
            if window is None or not c.ok:
                continue
            for (job_id, token), ok in zip(c.args[2], c.result, strict=True):
                if not ok or token not in reserved:
                    continue
                excused = any(
                    token in (t for _, t in s.args[2])
                    and s.begin < c.begin
                    and (s.raised or (s.begin < window[0] and s.ok and dict(zip(s.args[2], s.result))[job_id, token]))
                    for s in starts
                )
                if not excused:
                    self.fail(
                        f"worker {c.args[1]} started reserved claim {token} of {job_id} in a start() made "
                        f"(#{c.begin}-#{c.end}) after pause() returned (#{window[0]}), before resume() (#{window[1]})"
                    )

    def check_flow(self) -> None:
        """Global concurrency and the rate limit, from the claims as the storage made them.
        A ``dequeue`` that raised may have claimed unseen: not counted, so this view can
        only miss a violation, never report one that did not happen."""
        claiming = [c for c in self.calls("dequeue") if c.ok and c.result]
        cap = self.flow.concurrency
        if cap is not None:
            # A claim is surely held from the end of the dequeue that made it until the
            # beginning of the first call that may free it: a settle, start or release
            # naming its job, a recover_stalled that returned it or raised.
            freers: dict[str, list[Call]] = defaultdict(list)
            anything: list[Call] = []
            for c in self.rec.record:
                if c.method == "settle":
                    for s in c.args[2]:
                        freers[s.id].append(c)
                elif c.method == "start":
                    for job_id, _ in c.args[2]:
                        freers[job_id].append(c)
                elif c.method == "release":
                    for job_id in c.args[2]:
                        freers[job_id].append(c)
                elif c.method == "recover_stalled":
                    if c.ok:
                        for job_id, _ in c.result[0]:
                            freers[job_id].append(c)
                    else:
                        anything.append(c)
            held: list[tuple[int, float, str]] = []  # (since, until, job id)
            for d in claiming:
                for claim in d.result:
                    may_free = [f.begin for f in (*freers[claim.id], *anything) if f.end > d.begin]
                    held.append((d.end, min(may_free, default=math.inf), claim.id))
            for c in claiming:
                others = [job_id for since, until, job_id in held if since < c.begin and until > c.end]
                if len(others) + len(c.result) > cap:
                    self.fail(
                        f"worker {c.args[1]} claimed {[claim.id for claim in c.result]} (#{c.begin}-#{c.end}) "
                        f"while {others} were held: more than global_concurrency={cap}"
                    )
        rate = self.flow.rate
        if rate is not None:
            # Claims are made inside their calls: count the calls that surely fall within
            # a span shorter than the window (less the storages' ms granularity).
            span = rate.per - DUE_SLACK
            for first in claiming:
                inside = [c for c in claiming if c.t0 >= first.t0 and c.t1 <= first.t0 + span]
                made = sum(len(c.result) for c in inside)
                if made > rate.limit:
                    self.fail(
                        f"{made} claims within {max(c.t1 for c in inside) - first.t0:.3f} s, with "
                        f"RateLimit({rate.limit}, per={rate.per:.3f}): "
                        f"{[(c.args[1], [claim.id for claim in c.result]) for c in inside]}"
                    )

    def check_ticks(self) -> None:
        """One job per tick: each tick id is enqueued (queued) at most once, at a time of
        the schedule's grid. (Its handler returning once is :meth:`check_reruns`.)"""
        if self.every is None or self.schedule_created is None:
            return
        queued: dict[str, int] = defaultdict(int)
        for c in self.calls("enqueue"):
            if not c.ok:
                continue
            for job, outcome in zip(c.args[1], c.result, strict=True):
                if job.id.startswith(f"{SCHEDULE}@") and outcome.status is EnqueueStatus.QUEUED:
                    queued[job.id] += 1
        for c in self.calls("tick_schedule"):  # a tick's job and its record, one step
            if c.ok and c.result and c.args[3] is not None:
                queued[c.args[3].id] += 1
        twice = {job_id: n for job_id, n in queued.items() if n > 1}
        if twice:
            self.fail(f"ticks enqueued more than once (new incarnations of one tick): {twice}")
        for job_id in self.ticks(tried=True):
            at = datetime.fromisoformat(job_id.split("@", 1)[1]).timestamp()
            k = (at - self.schedule_created) / self.every
            if abs(k - round(k)) * self.every > 0.002:  # ids are in whole milliseconds
                self.fail(
                    f"tick {job_id} is off the schedule's grid (every {self.every:.3f} s from "
                    f"{self.schedule_created:.3f}): {k:.3f} periods"
                )
