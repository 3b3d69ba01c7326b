"""MemoryStorage's trees of jobs (flows): writing a tree in one locked step, and what a
job's end does to its tree (a child counted done, the parent queued once none is left, or
the parent failed and the siblings cancelled under ``cancel``). Dependencies
(``depends_on``) are counted as children are, but a job may have many dependents, and a
dependent's end never cancels its dependencies. A part built by the storage with the
queues it shares; every step runs with the storage's lock held."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ..._model._clock import now as _now
from ..._model._errors import FlowError
from ..._model._types import EnqueueStatus
from .. import _rules as R
from .._base import EnqueueOutcome, FlowJob, JobRecord, StorageEvent, job_record
from .._rules import CANCELLABLE as _CANCELLABLE
from .._rules import COMPLETED, PROCESSING, WAITING_CHILDREN
from .._rules import TERMINAL_KINDS as _TERMINAL
from ._parts import QUEUED_OUTCOME, Flow, MemoryQueues, MemRec, QueueState

__all__ = ["MemoryTrees"]


class MemoryTrees:
    """The trees of :class:`~trioqueue.storage.MemoryStorage`, and the end of every job
    (:meth:`ended`: a job's end may concern its tree)."""

    __slots__ = ("_lock", "_q")

    def __init__(self, queues: MemoryQueues) -> None:
        self._lock = queues.lock
        self._q = queues.q

    # -- writing trees -------------------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            now = _now()
            root = jobs[0]
            q = self._q(root.queue)
            q.expire(now)
            rec = q.jobs.get(root.job.id)
            if rec is not None and not R.replaceable(rec):
                if (result := R.existing_outcome(rec)) is not None:
                    outcome = EnqueueOutcome(EnqueueStatus.COMPLETED, rec.state(), result, rec.token)
                else:
                    outcome = EnqueueOutcome(EnqueueStatus.DUPLICATE, rec.state(), token=rec.token)
            else:
                self.write_tree(jobs, now, {})
                outcome = QUEUED_OUTCOME
        await trio.lowlevel.cancel_shielded_checkpoint()
        return outcome

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            q = self._q(queue)
            rec = q.processing.get(worker_id, {}).get(job_id)
            # A cancel request (its own, or its tree's cascade: done in the step that ended
            # the ancestor) refuses it as a lost claim: no child may start after it.
            ok = rec is not None and rec.claim == token and not rec.cancel_requested
            if rec is not None and ok:
                self.write_tree(children, _now(), {(queue, job_id): rec}, policy)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return ok

    def write_tree(
        self, jobs: Sequence[FlowJob], now: float, recs: dict[tuple[str, str], MemRec], policy: str = "cancel"
    ) -> None:
        """Check every id first (nothing written on a refusal), then write the tree."""
        first = 0 if recs else 1  # the root of a new tree was checked by the caller
        for fj in jobs[first:]:
            q = self._q(fj.queue)
            q.expire(now)
            old = q.jobs.get(fj.job.id)
            if not R.replaceable(old) or (fj.queue, fj.job.id) in recs:
                raise FlowError(f"job {fj.job.id!r} already exists on queue {fj.queue!r}: a tree's jobs must be new")
        mine = {(fj.queue, fj.job.id) for fj in jobs}
        deps: dict[tuple[str, str], MemRec] = {}
        for fj in jobs:
            for dq, did in fj.depends_on:
                d = self._q(dq)
                d.expire(now)
                dep = d.jobs.get(did)
                if dep is None or (dq, did) in mine:
                    raise FlowError(f"job {fj.job.id!r} depends on job {did!r} of queue {dq!r}, which does not exist")
                deps[dq, did] = dep
        parents = {fj.parent for fj in jobs if fj.parent is not None}
        for parent in recs.values():
            if parent.flow is None:
                parent.flow, parent.children, parent.policy = Flow(), [], policy
        now_ms = int(now * 1000)
        touched: dict[str, tuple[QueueState, list[StorageEvent], list[MemRec]]] = {}
        for fj in jobs:
            job = fj.job
            q, events, ready = touched.setdefault(fj.queue, (self._q(fj.queue), [], []))
            old = q.jobs.get(job.id)
            if old is not None:
                q.index.drop(old)
            is_parent = (fj.queue, job.id) in parents or bool(fj.depends_on)
            kind = WAITING_CHILDREN if is_parent else R.enqueue_kind(job.run_at, now)
            rec = q.jobs[job.id] = MemRec(job, now_ms, q.index, kind)
            recs[fj.queue, job.id] = rec
            events.append(StorageEvent("enqueued", job.id, token=job.token))
            if is_parent:
                rec.flow, rec.children, rec.policy = Flow(), [], fj.policy
            elif kind == R.DELAYED:
                assert job.run_at is not None
                q.delay(rec, job.run_at, events)
            else:
                ready.append(rec)
            if fj.parent is not None:
                parent = recs[fj.parent]
                rec.parent, rec.up = fj.parent, parent
                assert parent.flow is not None and parent.children is not None
                parent.flow.children.append((fj.queue, rec))
                parent.children.append((fj.queue, job.id))
                parent.flow.pending += 1
        for fj in jobs:
            if fj.depends_on:
                self.depend(fj, recs[fj.queue, fj.job.id], deps, now)
        for q, events, ready in touched.values():
            q.ready.push(ready)
            q.publish(events)
            q.wake()
        for fj in jobs:  # dependencies that had ended counted at once: it may run (or fail) now
            rec = recs[fj.queue, fj.job.id]
            if fj.depends_on and rec.kind == WAITING_CHILDREN:
                self.parent_check(self._q(fj.queue), rec, now)

    def depend(self, fj: FlowJob, rec: MemRec, deps: dict[tuple[str, str], MemRec], now: float) -> None:
        """``rec`` (just written, waiting) depends on ``fj.depends_on``: each dependency
        lists it, and one that ended already is counted at once (its record kept)."""
        assert rec.flow is not None
        rec.deps = list(fj.depends_on)
        for key in fj.depends_on:
            dep = deps[key]
            rec.flow.deps.append((key[0], dep))
            if dep.waiters is None:
                dep.waiters, dep.dependents = [], []
            assert dep.dependents is not None
            dep.waiters.append((fj.queue, rec))
            dep.dependents.append((fj.queue, rec.id))
            if dep.kind in _TERMINAL:
                dep.exp = None  # kept until its dependents have ended
                if dep.kind != COMPLETED:
                    rec.flow.failures.append((dep.id, dep.error or b""))
            else:
                rec.flow.pending += 1

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        await trio.lowlevel.checkpoint()
        with self._lock:
            q = self._q(queue)
            q.expire(_now())
            rec = q.jobs.get(job_id)
            if rec is None or rec.flow is None:
                return []
            return [(cq, job_record(c)) for cq, c in rec.flow.children + rec.flow.deps if self._q(cq).jobs.get(c.id) is c]

    # -- a job ended -----------------------------------------------------------------------

    def ended(self, q: QueueState, rec: MemRec, old: str, now: float) -> None:
        """A rule just ended ``rec`` (it left kind ``old``): filed under its terminal kind,
        its expiry indexed, and its tree told."""
        q.file_end(rec, old)
        if rec.parent is not None or rec.flow is not None or rec.waiters is not None:
            self.tree_ended(rec, now)

    def _waiting_for(self, w: MemRec, wq: str) -> bool:
        """Whether ``w`` (a parent or a dependent, of queue ``wq``) still counts the jobs
        it waits for: it has not ended and is still the record of its id."""
        return w.kind not in _TERMINAL and w.flow is not None and self._q(wq).jobs.get(w.id) is w

    def _needed(self, rec: MemRec) -> bool:
        """Whether the ended ``rec`` is still needed by a parent or a dependent that has not
        ended (its record is kept meanwhile)."""
        if rec.up is not None and rec.parent is not None and self._waiting_for(rec.up, rec.parent[0]):
            return True
        return any(self._waiting_for(w, wq) for wq, w in rec.waiters or ())

    def tree_ended(self, rec: MemRec, now: float) -> None:
        """``rec`` (a parent, a child, a dependency, a dependent) just became terminal."""
        flow = rec.flow
        if flow is not None:
            if R.ended_cancels_children(rec.kind):
                self.cancel_children(rec, now)  # cancelled or failed: none of them may run on
            self._let_go(flow, now)  # their results are no longer needed by rec
        parent = rec.up
        if parent is not None and rec.parent is not None and self._waiting_for(parent, rec.parent[0]):
            assert parent.flow is not None
            rec.exp = None  # kept while the parent may read it
            parent.flow.pending -= 1
            if rec.kind != COMPLETED:
                parent.flow.failures.append((rec.id, rec.error or b""))
            self.parent_check(self._q(rec.parent[0]), parent, now)
        for wq, w in rec.waiters or ():  # its dependents count it
            if self._waiting_for(w, wq) and rec.kind in _TERMINAL:
                assert w.flow is not None
                rec.exp = None  # kept while a dependent may read it
                w.flow.pending -= 1
                if rec.kind != COMPLETED:
                    w.flow.failures.append((rec.id, rec.error or b""))
                self.parent_check(self._q(wq), w, now)
        # (a parent or a dependent ended first: rec keeps its own TTL)

    def removed(self, rec: MemRec, now: float) -> None:
        """A child or a dependency was removed (``remove_job``): its parent and its
        dependents count it as cancelled, as FileStorage's do (nobody waits for a job
        that is gone). A removed parent or dependent no longer needs the records of its
        ended children and dependencies: they go by their own TTLs."""
        if rec.flow is not None:
            self._let_go(rec.flow, now)
        if rec.kind in _TERMINAL:
            return  # it had ended (and was counted)
        waiting = [(rec.parent[0], rec.up)] if rec.up is not None and rec.parent is not None else []
        for wq, w in waiting + list(rec.waiters or ()):
            if not self._waiting_for(w, wq):
                continue  # it has ended
            assert w.flow is not None
            w.flow.pending -= 1
            w.flow.failures.append((rec.id, b""))
            self.parent_check(self._q(wq), w, now)

    def _let_go(self, flow: Flow, now: float) -> None:
        """The owner of ``flow`` (ended or removed) no longer needs the records of its
        ended children and dependencies: each goes by its own TTL from ``now``, unless
        another job still needs it."""
        for kq, kept in flow.children + flow.deps:
            if kept.kind in _TERMINAL and kept.exp is None and self._q(kq).jobs.get(kept.id) is kept and not self._needed(kept):
                self._q(kq).keep_for(kept, now + kept.result_ttl)

    def parent_check(self, pq: QueueState, parent: MemRec, now: float) -> None:
        """Act on the tree's verdict for ``parent`` (see :func:`~.._rules.parent_verdict`)."""
        flow = parent.flow
        failed, pending = (False, 0) if flow is None else (bool(flow.failures), flow.pending)
        verdict = R.parent_verdict(parent.kind, parent.policy, failed, pending)
        if verdict == R.CANCEL_CHILDREN:
            self.cancel_children(parent, now)  # the parent fails when it waits for them
        elif verdict == R.FAIL:
            old = parent.kind
            R.fail_by_children(parent, [] if flow is None else flow.failures, now)
            self.ended(pq, parent, old, now)  # cancels the siblings
            pq.publish([StorageEvent("failed", parent.id, error=parent.error, token=parent.token)])
        elif verdict == R.RELEASE:  # every child of a waiting parent is terminal: queued in its lane
            R.release_parent(parent, int(now * 1000))
            pq.refile(parent, WAITING_CHILDREN)
            pq.ready.push([parent])
            pq.publish([StorageEvent("promoted", parent.id, token=parent.token)])
            pq.wake()

    def cancel_children(self, parent: MemRec, now: float) -> None:
        """Cancel every child of ``parent`` that has not ended (and, through their own
        ends, their descendants): a waiting, queued, delayed or failing one at once, a
        processing one by a cancel request to its worker."""
        assert parent.flow is not None
        for cq_name, child in list(parent.flow.children):
            cq = self._q(cq_name)
            if cq.jobs.get(child.id) is not child:
                continue
            if child.kind in _CANCELLABLE:
                old = child.kind
                R.cancel(child, now)
                self.ended(cq, child, old, now)
                cq.publish([StorageEvent("cancelled", child.id, token=child.token)])
            elif child.kind == PROCESSING:
                if child.flow is not None:
                    self.cancel_children(child, now)
                if R.request_cancel(child):
                    cq.publish([StorageEvent("cancel_requested", child.id, child.worker, token=child.token)])
