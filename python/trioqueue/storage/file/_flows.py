"""FileStorage's trees of jobs (flows).

A tree is written under the locks of every queue it touches, taken in name order (every
other step takes one queue lock at a time, so no two steps wait for each other), children
before their parents and the root last: a crash part-way leaves jobs whose parent does
not exist (they run as plain jobs), never a parent waiting for a child that does not; the
producer's retry of the enqueue (it was not acknowledged) replaces them (:func:`_leftover`).

What a child's end does to its parent, and what a parent's end does to its children, is
carried by **notes**: empty files in the queue directory's ``tree/`` folder, created
*before* the step that ends a job writes its record, and removed once acted on:

- ``f-<parent>``: re-evaluate the parent from its children's records (all terminal: it
  is queued, unless an ancestor failed or was cancelled: then it is cancelled, as the
  cascade on its way would (the cascade goes level by level, a step each, and the
  release must not fall in between); one failed under ``cancel``: it fails with
  ``ChildJobFailedError``, waiting
  or back in the queue for a run of its own (one running fails when it settles); a
  parent that ended other than completed cancels its children; one that ended releases
  its children's kept records); ``p-<parent>``, left by a child that completed, does
  the same once no child is pending (a quick look until then);
- ``c-<job>``: cancel the job (a cascade): at once if it waits, a cancel request if it
  runs;
- ``r-<job>``: the job's record, kept while its parent might read it, gets its TTL
  (unless a parent or dependent of it still waits: made when either ends or is removed);
- ``u-<job>``: the job ended and its parent is on another queue: the note for the parent
  (its kind, queue and id are the note's content) is made there.

A note is made under the lock of the queue it is in, so nobody acts on it before the
step's records are written (acting on a note takes that lock). A child whose parent is
on another queue therefore leaves a ``u-`` note in its *own* queue, which is carried to
the parent's queue once acted on (after the child's record is written): a ``p-`` or
``f-`` note made there directly would be visible, to a process holding only the parent's
queue lock, before the child's record is, and acting on it then (the child still
pending) would take it for nothing: the parent would wait for ever.

Dependencies (``depends_on``) ride on the same notes: a dependent lists its dependencies
(``Rec.deps``) and is re-evaluated as a parent is, counting them with its children; a
dependency lists its dependents (``Rec.dependents``), and its end leaves for each the note
a child leaves for its parent (a ``u-`` note per dependent on another queue). Its record
is kept until no parent or dependent of it is waiting (an ``r-`` note checks that). A
dependent's end never cancels its dependencies.

Acting on a note is idempotent (it reads the records afresh), so a note left by a crash
(or acted on twice) costs nothing: the step that made it acts on it right after (taking
one queue lock at a time), and every reaper pass (``recover_stalled``) acts on the notes
of its queue."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack

import trio

from ..._model._errors import FlowError
from .. import _rules as R
from .._base import EnqueueOutcome, FlowJob, JobRecord, StorageEvent
from .._rules import CANCELLABLE as _CANCELLABLE
from .._rules import CANCELLED, COMPLETED, DELAYED, FAILED, FAILING, PROCESSING, QUEUED, WAITING_CHILDREN, WAITING_SIGNAL
from .._rules import TERMINAL_KINDS as _TERMINAL
from ._base import FileCore
from ._fsutil import CorruptRecord, Rec, encode_name, read_rec, write_atomic
from ._layout import FileQueue, QUEUED_OUTCOME, enqueue_outcome, close_on_error, to_job_record, ready_name, seq_name, unlink_quiet, due_event

__all__ = ["FileTrees"]



class FileTrees:
    """The trees of jobs of :class:`~trioqueue.storage.FileStorage`: writing them, and
    the notes by which a job's end reaches its parent and its children (see the module
    docstring). A part built by the storage with the core it shares."""

    def __init__(self, core: FileCore) -> None:
        self._core = core
        self._dirs: set[str] = set()  # tree/ folders known to exist
        self.dirty: set[str] = set()  # queues given notes to act on

    # -- notes ---------------------------------------------------------------------------

    def _tree_dir(self, q: FileQueue) -> str:
        d = os.path.join(q.path, "tree")
        if d not in self._dirs:
            os.makedirs(d, exist_ok=True)
            self._dirs.add(d)
        return d

    def _note(self, queue: str, kind: str, job_id: str) -> None:
        """Leave the note ``kind-<job>`` in ``queue``'s ``tree/`` (see the module docstring)."""
        path = os.path.join(self._tree_dir(self._core.q(queue)), f"{kind}-{encode_name(job_id)}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        self.dirty.add(queue)

    def tree_ended(self, q: FileQueue, r: Rec) -> None:
        """``r`` is about to be written terminal, waiting for its children, or with a
        cancel request (lock of ``q`` held): its parent and its dependents are to be
        re-evaluated (and ``r`` kept meanwhile), and so is ``r`` as a parent."""
        if r.kind in _TERMINAL:
            kind = "p" if r.kind == COMPLETED else "f"
            waiting = ([r.parent] if r.parent is not None else []) + list(r.dependents or ())
            for i, (pq, pid) in enumerate(waiting):
                if i > 0 or r.parent is None:  # a dependent: told (and r kept) only while it waits
                    w = self._peek(q, pq, pid)
                    if w is None or w.kind in _TERMINAL:
                        continue
                r.exp = None  # kept until they have ended (an r- note then gives its TTL)
                if pq == q.name:
                    self._note(pq, kind, pid)
                else:  # carried to the parent's queue once r is written (module docstring)
                    data = json.dumps([kind, pq, pid]).encode()
                    suffix = "" if i == 0 and r.parent is not None else f".{i}"
                    write_atomic(self._tree_dir(q), f"u-{encode_name(r.id)}{suffix}", data, False)
                    self.dirty.add(q.name)
        if r.children is not None or r.deps is not None:
            self._note(q.name, "f", r.id)

    def let_go(self, r: Rec) -> None:
        """``r`` (a parent or a dependent) is being removed: its children and its
        dependencies, kept for it once ended, are looked at again (``r-`` notes: kept only
        if another job still waits for them; else they go by their own TTLs)."""
        for kq, kid in [*(r.children or ()), *(r.deps or ())]:
            self._note(kq, "r", kid)

    @staticmethod
    def outcome_known(r: Rec) -> bool:
        """Whether ``r`` completed and a parent or dependent may list it
        (:meth:`forget_completed` is for it before it is removed)."""
        return r.kind == COMPLETED and (r.parent is not None or bool(r.dependents))

    def removing(self, q: FileQueue, r: Rec) -> None:
        """``r`` is being removed, alone or by a clear of its queue (lock of ``q`` held):
        its ended children and dependencies are no longer kept for it (``r-`` notes), and
        if it had not ended, its parent and its dependents count it as cancelled (notes,
        made before its record goes)."""
        if r.deps or r.children:
            self.let_go(r)
        if r.kind not in _TERMINAL and (r.parent is not None or r.dependents):
            r.kind = CANCELLED
            self.tree_ended(q, r)

    async def forget_completed(self, queue: str, job_id: str) -> None:
        """Job ``job_id`` of ``queue`` is about to be removed: if it completed, its parent
        and its dependents that still wait stop listing it (each under its own queue's
        lock, one at a time, before it goes). A job they list that is gone counts as
        cancelled, which only one removed before it ended is (as MemoryStorage and
        PostgreSQL count it); a completed one's outcome was counted when it ended. (A
        failed or cancelled one counts as cancelled either way: a failure.)"""
        r = self._peek(self._core.q(queue), queue, job_id)
        if r is None or not self.outcome_known(r):
            return
        me = (queue, job_id)
        waiting = ([r.parent] if r.parent is not None else []) + list(r.dependents or ())
        for wq, wid in waiting:
            wqs = self._core.q(wq)
            enc = encode_name(wid)
            fds: list[int] = []
            wrote = False
            async with self._core.alock(wqs):
                with close_on_error(fds):
                    w = self._core.load(wqs, enc, time.time())
                    if w is not None and w.kind not in _TERMINAL:
                        listed = [tuple(x) for x in [*(w.children or ()), *(w.deps or ())]]
                        if me in listed:
                            w.children = None if w.children is None else [c for c in w.children if tuple(c) != me]
                            w.deps = None if w.deps is None else [d for d in w.deps if tuple(d) != me]
                            self._core.commit(wqs, {enc: w}, fds)
                            wrote = True
            await self._core.finish(fds, {wqs.jobs_fd}, wrote)

    def cancel_claimed(self, q: FileQueue, r: Rec, worker_id: str, events: list[StorageEvent]) -> None:
        """A rule ended a claimed job cancelled (its proc entry is the caller's to remove)."""
        r.mk = None
        if R.in_tree(r):
            self.tree_ended(q, r)
        events.append(StorageEvent("cancelled", r.id, worker_id, token=r.token))

    async def act_on_notes(self, queue: str | None = None) -> None:
        """Act on the notes of ``queue`` and of every queue a step left notes in, until
        none is left; one queue lock at a time."""
        if queue is not None:
            self.dirty.add(queue)
        while self.dirty:
            name = self.dirty.pop()
            try:
                await self.act_on_queue(name)
            except BaseException:  # cancelled or failed (waiting for the lock, or the flush):
                self.dirty.add(name)  # its notes are the next call's, not the reaper's
                raise

    async def act_on_queue(self, queue: str) -> None:
        q = self._core.q(queue)
        folder = self._tree_dir(q)
        if not os.listdir(folder):
            return
        fds: list[int] = []
        wrote = False
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                kept: dict[str, Rec] = {}  # kept records given their TTL: one segment
                for name in sorted(os.listdir(folder)):
                    # A note is taken (renamed) before it is acted on: one made meanwhile
                    # (by this step, or by another queue's step) is a new note. A taken
                    # one seen here was left by a crash (notes are acted on under the lock).
                    if name.startswith(".w-"):
                        work, name = name, name[3:]
                    elif name.startswith("."):
                        continue
                    else:
                        work = ".w-" + name
                        os.rename(os.path.join(folder, name), os.path.join(folder, work))
                    kind, _, enc = name.partition("-")
                    if kind == "u":
                        self._carry(os.path.join(folder, work))
                    elif enc:
                        wrote |= self._act(q, kind, enc, now, fds, kept)
                    unlink_quiet(os.path.join(folder, work))
                if kept:
                    self._core.commit(q, kept, fds)
                    wrote = True
        await self._core.finish(fds, {q.jobs_fd, *q.lane_fds, q.delayed_fd, q.expiry_fd}, wrote)

    def _carry(self, path: str) -> None:
        """A ``u-`` note (lock of its queue held: the child's record is written): the note
        it names, made in the parent's queue."""
        try:
            with open(path, "rb") as f:
                kind, queue, parent = json.loads(f.read())
        except (OSError, ValueError, TypeError):
            return  # (written atomically: never partial)
        self._note(queue, kind, parent)

    def _peek(self, q: FileQueue, queue: str, job_id: str) -> Rec | None:
        """A record of any queue (lock of ``q`` held): a record file is replaced
        atomically, so another queue's is read without its lock."""
        enc = encode_name(job_id)
        if queue == q.name:
            return self._core.read(q, enc)
        try:
            return read_rec(os.path.join(self._core.q(queue).jobs, enc), enc)
        except CorruptRecord:
            return None

    def _child(self, q: FileQueue, queue: str, job_id: str, parent: str) -> Rec | None:
        """The record of a child of ``(q, parent)``; ``None`` (counted as cancelled) if it
        is gone, or is another incarnation of the id (the child was cancelled, and the id
        enqueued again on its own)."""
        c = self._peek(q, queue, job_id)
        if c is None or c.parent is None or tuple(c.parent) != (q.name, parent):
            return None
        return c

    def _dep(self, q: FileQueue, queue: str, job_id: str, dependent: str) -> Rec | None:
        """The record of a dependency of ``(q, dependent)``; ``None`` (counted as
        cancelled) if it is gone, or is another incarnation of the id."""
        d = self._peek(q, queue, job_id)
        if d is None or d.dependents is None or (q.name, dependent) not in [tuple(x) for x in d.dependents]:
            return None
        return d

    def _waited(self, q: FileQueue, r: Rec) -> list[tuple[str, str, Rec | None, bool]]:
        """What ``r`` waits for (lock of ``q`` held): ``(queue, id, record, is a child)``
        of its children, then of its dependencies."""
        out = [(cq, cid, self._child(q, cq, cid, r.id), True) for cq, cid in r.children or ()]
        out += [(dq, did, self._dep(q, dq, did, r.id), False) for dq, did in r.deps or ()]
        return out

    def _needed(self, q: FileQueue, r: Rec) -> bool:
        """Whether the ended ``r`` is still needed by its parent or a dependent that has
        not ended (its record stays kept)."""
        me = (q.name, r.id)
        if r.parent is not None:
            w = self._peek(q, r.parent[0], r.parent[1])
            if w is not None and w.kind not in _TERMINAL and me in [tuple(c) for c in w.children or ()]:
                return True
        for wq, wid in r.dependents or ():
            w = self._peek(q, wq, wid)
            if w is not None and w.kind not in _TERMINAL and me in [tuple(d) for d in w.deps or ()]:
                return True
        return False

    def failed_by_children(self, q: FileQueue, r: Rec) -> bool:
        """Whether a child of the held job ``r`` failed (or was cancelled) under ``cancel`` (lock of ``q`` held): then whatever its run ends with (but a
        failure of its own, or a cancel) fails it with ``ChildJobFailedError``, as waiting
        for them would. A run cut short after ``add_children`` (a crash, a forced stop)
        runs again once its children ended: it must not complete."""
        if r.policy != "cancel" or not r.children:
            return False
        for cq, cid in r.children:
            c = self._child(q, cq, cid, r.id)
            if c is not None and c.kind in (FAILED, CANCELLED):
                return True
        return False

    def _act(self, q: FileQueue, kind: str, enc: str, now: float, fds: list[int], kept: dict[str, Rec]) -> bool:
        """Act on one note (lock of ``q`` held); whether a record was written. Kept
        records that get their TTL go to ``kept`` (the caller writes them)."""
        r = kept.get(enc) or self._core.read(q, enc)
        if r is None:
            return False
        if kind == "r":
            if r.kind in _TERMINAL and r.exp is None and not self._needed(q, r):
                r.exp = now + r.result_ttl
                kept[enc] = r
            return False
        if kind == "c":
            return self._cascade_cancel(q, enc, r, now, fds)
        if kind not in ("p", "f") or (r.children is None and r.deps is None):
            return False
        if kind == "p" and r.kind in (WAITING_CHILDREN, PROCESSING):
            # A child completed: nothing to do while another is pending (looked for from
            # the last child: children end about in order). A failure comes with an f- note.
            for cq, cid in reversed(r.children or ()):
                c = self._child(q, cq, cid, r.id)
                if c is not None and c.kind not in _TERMINAL:
                    return False
            for dq, did in r.deps or ():
                d = self._dep(q, dq, did, r.id)
                if d is not None and d.kind not in _TERMINAL:
                    return False
        waited = self._waited(q, r)
        children = [(cq, cid, c) for cq, cid, c, _ in waited]
        if r.kind in _TERMINAL:
            for cq, cid, c, is_child in waited:
                if c is None:
                    continue
                if c.kind not in _TERMINAL and is_child and R.ended_cancels_children(r.kind):
                    self._note(cq, "c", cid)  # (its dependencies are not its own: they run on)
                elif c.kind in _TERMINAL and c.exp is None and cq == q.name:
                    if not self._needed(q, c):  # (this queue's lock is held: no note needed)
                        c.exp = now + c.result_ttl
                        kept[encode_name(cid)] = c
                elif c.kind in _TERMINAL and c.exp is None:
                    self._note(cq, "r", cid)
            return False
        # A missing child (removed by hand) counts as cancelled.
        failures = [(cid, (c.error or b"") if c else b"") for _, cid, c in children if c is None or c.kind in (FAILED, CANCELLED)]
        pending = [(cq, cid) for cq, cid, c in children if c is not None and c.kind not in _TERMINAL]
        marker = None
        failed = bool(failures)
        if r.kind in (QUEUED, FAILING, DELAYED, WAITING_SIGNAL):
            # Back for another run of its own (the run that added the children was cut
            # short), or waiting for a signal: a child that failed (not one that is gone:
            # removed after the run that found them ended) fails it at once, as it would
            # one that waits for its children.
            failed = any(c is not None and c.kind in (FAILED, CANCELLED) for _, _, c in children)
            marker = os.path.join(q.ready if r.kind == QUEUED else q.delayed, r.mk) if r.mk else None
        verdict = R.parent_verdict(r.kind, r.policy, failed, len(pending), r.cancel_requested)
        if verdict == R.CANCEL_CHILDREN:  # (its dependencies are not its own: they run on)
            mine = {(cq, cid) for cq, cid in r.children or ()}
            pending = [p for p in pending if p in mine]
        if verdict in (R.RELEASE, R.FAIL) and self.ancestor_ended(q, r):
            # An ancestor failed or was cancelled: its cascade (c- notes, level by level,
            # each a step of its own) is on its way to r. Released now, r could be claimed
            # and complete after its root's cancel: it is cancelled now instead, in this
            # step (the one that would release or fail it), as the cascade would.
            verdict = R.parent_verdict(r.kind, r.policy, failed, len(pending), r.cancel_requested, True)
        if verdict == R.CANCEL_CHILDREN:  # it runs: it fails (or ends cancelled) when its run ends
            for cq, cid in pending:
                self._note(cq, "c", cid)
            return False
        if verdict == R.FAIL:
            R.fail_by_children(r, failures, now)
            r.mk = None
            self.tree_ended(q, r)  # its children are cancelled, its parent re-evaluated
            self._core.commit(q, {enc: r}, fds)
            if marker:
                unlink_quiet(marker)
            self._core.publish(q, [StorageEvent("failed", r.id, error=r.error, token=r.token)])
            return True
        if verdict == CANCELLED:
            R.cancel_by_ancestor(r, now)
            r.mk = None
            self.tree_ended(q, r)
            self._core.commit(q, {enc: r}, fds)
            if marker:
                unlink_quiet(marker)
            self._core.publish(q, [StorageEvent("cancelled", r.id, token=r.token)])
            return True
        if verdict != R.RELEASE:
            return False
        nxt, front = q.counters()
        R.release_parent(r, int(now * 1000))
        r.mk = ready_name(nxt, enc, r.priority, r.group)
        q.set_counters(nxt + 1, front)
        self._core.commit(q, {enc: r}, fds)
        self._core.link_marker(q, enc, q.ready, r.mk)
        self._core.publish(q, [StorageEvent("promoted", r.id, token=r.token)])
        return True

    def ancestor_ended(self, q: FileQueue, r: Rec) -> bool:
        """Whether an ancestor of ``r`` failed or was cancelled (lock of ``q`` held; the
        others' records are read as they are written: a record file is replaced
        atomically, and an ancestor's end is written before the notes that cascade it)."""
        seen = {(q.name, r.id)}
        parent = r.parent
        while parent is not None and (parent[0], parent[1]) not in seen:  # (a list, as read)
            seen.add((parent[0], parent[1]))
            p = self._peek(q, parent[0], parent[1])
            if p is None or p.kind == COMPLETED:  # (a completed one cancels nothing below it)
                return False
            if p.kind in (FAILED, CANCELLED):
                return True
            parent = p.parent
        return False

    def _cascade_cancel(self, q: FileQueue, enc: str, r: Rec, now: float, fds: list[int]) -> bool:
        """A ``c-`` note: cancel ``r`` because an ancestor ended (lock of ``q`` held)."""
        if r.kind in _CANCELLABLE:
            marker, folder = r.mk, (q.ready if r.kind == QUEUED else q.delayed)
            R.cancel(r, now)
            r.mk = None
            self.tree_ended(q, r)
            self._core.commit(q, {enc: r}, fds)
            if marker:
                unlink_quiet(os.path.join(folder, marker))
            self._core.publish(q, [StorageEvent("cancelled", r.id, token=r.token)])
            return True
        if r.kind == PROCESSING:
            if r.children is not None:
                self._note(q.name, "f", r.id)
            if R.request_cancel(r):
                self._core.commit(q, {enc: r}, fds)
                self._core.publish(q, [StorageEvent("cancel_requested", r.id, r.worker, token=r.token)])
                return True
        return False

    # -- writing trees ---------------------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        await trio.lowlevel.checkpoint_if_cancelled()
        outcome, wrote = await self._write_tree(jobs, None)
        if wrote:
            await self.act_on_notes()
        return outcome if outcome is not None else QUEUED_OUTCOME

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        _, wrote = await self._write_tree(children, (queue, job_id, worker_id, token, policy))
        return wrote

    async def _write_tree(
        self, jobs: Sequence[FlowJob], held: tuple[str, str, str, str, str] | None
    ) -> tuple[EnqueueOutcome | None, bool]:
        """Write ``jobs`` (a new tree, or with ``held``: children of a held job) under the
        locks of their queues. Returns (the root's outcome if it exists: nothing written;
        ``None`` otherwise, or with ``held`` when it is no longer held; whether written)."""
        dep_queues = {dq for fj in jobs for dq, _ in fj.depends_on}
        names = sorted({fj.queue for fj in jobs} | ({held[0]} if held else set()) | dep_queues)
        qs = {n: self._core.q(n) for n in names}
        fds: dict[str, list[int]] = {n: [] for n in names}
        async with AsyncExitStack() as stack:
            for n in names:
                await stack.enter_async_context(self._core.alock(qs[n]))
            now = time.time()
            now_ms = int(now * 1000)
            recs: dict[tuple[str, str], Rec] = {}
            if held is None:
                first = jobs[0]
                old = self._core.load(qs[first.queue], encode_name(first.job.id), now)
                if old is not None and not R.replaceable(old):
                    return enqueue_outcome(old), False
            else:
                hq, hid, worker, token, policy = held
                parent = self._core.read(qs[hq], encode_name(hid))
                if parent is None or parent.kind != PROCESSING or parent.worker != worker or parent.claim != token:
                    return EnqueueOutcome(QUEUED_OUTCOME.status), False
                if parent.cancel_requested or self.ancestor_ended(qs[hq], parent):
                    # Being cancelled (its own cancel request, or an ancestor's cascade on
                    # its way, level by level): refused as a lost claim, nothing written.
                    return EnqueueOutcome(QUEUED_OUTCOME.status), False
                if parent.children is None:
                    parent.children, parent.policy = [], policy
                recs[hq, hid] = parent
            for fj in jobs[0 if held else 1 :]:
                old = self._core.load(qs[fj.queue], encode_name(fj.job.id), now)
                if old is not None and not R.replaceable(old) and not _leftover(old, fj, recs) or (fj.queue, fj.job.id) in recs:
                    raise FlowError(f"job {fj.job.id!r} already exists on queue {fj.queue!r}: a tree's jobs must be new")
            mine = {(fj.queue, fj.job.id) for fj in jobs}
            deps: dict[tuple[str, str], Rec] = {}
            for fj in jobs:
                for dq, did in fj.depends_on:
                    dep = deps.get((dq, did)) or self._core.load(qs[dq], encode_name(did), now)
                    if dep is None or (dq, did) in mine:
                        raise FlowError(f"job {fj.job.id!r} depends on job {did!r} of queue {dq!r}, which does not exist")
                    deps[dq, did] = dep
            parents = {fj.parent for fj in jobs if fj.parent is not None}
            counters = {n: qs[n].counters() for n in names}
            items: dict[str, dict[str, Rec]] = {n: {} for n in names}
            events: dict[str, list[StorageEvent]] = {n: [] for n in names}
            for fj in jobs:
                job, q = fj.job, qs[fj.queue]
                enc = encode_name(job.id)
                if (fj.queue, job.id) in parents or fj.depends_on:
                    kind, mk = WAITING_CHILDREN, None
                elif R.enqueue_kind(job.run_at, now) == DELAYED:
                    assert job.run_at is not None
                    kind, mk = DELAYED, seq_name(int(job.run_at * 1000), enc)
                else:
                    nxt, front = counters[fj.queue]
                    kind, mk = QUEUED, ready_name(nxt, enc, job.priority, job.group)
                    counters[fj.queue] = (nxt + 1, front)
                r = Rec(job.id, kind, now_ms, 0, job.max_attempts, job.result_ttl, now_ms, job.envelope, mk)
                r.token, r.priority, r.group = job.token, job.priority, job.group
                if kind == WAITING_CHILDREN:
                    r.policy = fj.policy
                    if (fj.queue, job.id) in parents:
                        r.children = []
                if fj.depends_on:
                    # Each dependency lists it (one that ended already is kept for it), and
                    # an f- note has it evaluated: at once if nothing it waits for is pending.
                    r.deps = list(fj.depends_on)
                    for dq, did in fj.depends_on:
                        dep = deps[dq, did]
                        dep.dependents = [*(dep.dependents or ()), (fj.queue, job.id)]
                        if dep.kind in _TERMINAL:
                            dep.exp = None
                        items[dq][encode_name(did)] = dep  # written before their dependents
                    self._note(fj.queue, "f", job.id)
                if fj.parent is not None:
                    r.parent = fj.parent
                    p = recs[fj.parent]
                    assert p.children is not None
                    p.children.append((fj.queue, job.id))
                recs[fj.queue, job.id] = r
                events[fj.queue].append(StorageEvent("enqueued", job.id, token=job.token))
            if held is not None:
                items[held[0]][encode_name(held[1])] = recs[held[0], held[1]]  # written last
            # Children before parents, the root's queue last: see the module docstring.
            order = sorted(names, key=lambda n: (n == jobs[0].queue and held is None, n not in dep_queues))
            for fj in reversed(jobs):
                items[fj.queue].setdefault(encode_name(fj.job.id), recs[fj.queue, fj.job.id])
            if held is not None:  # the held job after its children
                enc = encode_name(held[1])
                items[held[0]][enc] = items[held[0]].pop(enc)
            for n in order:
                q = qs[n]
                with close_on_error(fds[n]):
                    self._core.commit(q, items[n], fds[n])
                    delayed = []
                    for enc, r in items[n].items():
                        if r.mk and r.kind in (QUEUED, DELAYED):
                            self._core.link_marker(q, enc, q.ready if r.kind == QUEUED else q.delayed, r.mk)
                            if r.kind == DELAYED:
                                delayed.append((enc, r.mk))
                    if delayed:
                        events[n].append(due_event(delayed))
                    q.set_counters(*counters[n])
                    self._core.publish(q, events[n])
        for n in names:
            q = qs[n]
            await self._core.durable(fds[n], {q.jobs_fd, *q.lane_fds, q.delayed_fd})
        return None, True

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        now = time.time()
        try:
            r = read_rec(os.path.join(q.jobs, encode_name(job_id)), encode_name(job_id))
        except CorruptRecord:
            return []
        if r is None or (r.children is None and r.deps is None) or (r.exp is not None and r.exp <= now):
            return []
        out = []
        waited = [(cq, cid, True) for cq, cid in r.children or ()] + [(dq, did, False) for dq, did in r.deps or ()]
        for cq, cid, is_child in waited:
            try:
                c = read_rec(os.path.join(self._core.q(cq).jobs, encode_name(cid)), encode_name(cid))
            except CorruptRecord:
                continue
            if c is None:
                continue
            if is_child:
                mine = c.parent is not None and tuple(c.parent) == (queue, job_id)
            else:
                mine = (queue, job_id) in [tuple(d) for d in c.dependents or ()]
            if mine and (c.exp is None or c.exp > now):
                out.append((cq, to_job_record(c)))
        return out


def _leftover(old: Rec, fj: FlowJob, recs: dict[tuple[str, str], Rec]) -> bool:
    """Whether the existing record ``old`` of ``fj``'s id was left by a crash in the middle
    of writing this very tree (its children are written first): it names the same parent,
    which does not exist (a new tree: its root was checked absent) or, for children added
    to a running job, does not list it. Such a record is replaced (a new incarnation), so
    that the producer's retry of the enqueue succeeds."""
    if old.parent is None or tuple(old.parent) != fj.parent:
        return False
    held = recs.get(fj.parent)
    return held is None or (fj.queue, fj.job.id) not in (held.children or [])
