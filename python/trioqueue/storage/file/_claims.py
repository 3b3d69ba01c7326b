"""FileStorage, consumer side: claims, settlements, releases, starts, heartbeats, progress."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import trio

from .. import _rules as R
from .._rules import CANCELLED as _CANCELLED
from .._rules import COMPLETED as _COMPLETED
from .._rules import DELAYED as _DELAYED
from .._rules import FAILED as _FAILED
from .._rules import PROCESSING as _PROCESSING
from .._rules import QUEUED as _QUEUED
from ..._model._types import DEFAULT_PRIORITY
from .._base import (
    WAITING_CHILDREN,
    Claim,
    ClaimLimits,
    HeartbeatReply,
    LostClaim,
    Settlement,
    StorageEvent,
    lost_why,
)
from ._fsutil import (
    Rec,
    decode_name,
    encode_name,
    tmp_name,
)
from ._base import FileCore, FileSettings
from ._flows import FileTrees
from ._retention import FileRetention
from ._limits import claim_allowance, count_claims, hold_claims, slot_freed
from ._turns import GroupTurns
from ._layout import (
    due_event,
    FileQueue,
    close_on_error,
    mtime_of,
    ready_name,
    seq_name,
    unlink_quiet,
)

__all__ = ["FileClaims"]



class FileClaims:
    """The consumer side of :class:`~trioqueue.storage.FileStorage`. A part built by the
    storage with the core, the trees and the retention it shares."""

    def __init__(self, core: FileCore, settings: FileSettings, trees: FileTrees, retention: FileRetention) -> None:
        self._core = core
        self._settings = settings
        self._trees = trees
        self._retention = retention

    def _claim_locked(
        self, q: FileQueue, worker_id: str, max_jobs: int, lease: float, start: int, limits: ClaimLimits | None = None
    ) -> tuple[list[Claim], float]:
        claims: list[Claim] = []
        events: list[StorageEvent] = []
        now = time.time()
        next_due = self._core.promote(q, now, events)
        if os.path.exists(q.paused):
            self._core.publish(q, events)
            return claims, next_due
        max_jobs, wake, flow = claim_allowance(q, limits, now, max_jobs)
        if not max_jobs:
            self._core.publish(q, events)
            return claims, min(next_due, wake)
        now_ms = int(now * 1000)
        deadline = now + lease
        enc_w = self._core.worker_enc(q, worker_id)
        pdir = q.proc_dir(enc_w)
        _, front = q.counters()
        if front != q.cache_front:
            for cache in q.cache:
                cache.clear()
            q.grp.forget_lanes()
            q.cache_front = front  # a release put jobs before the cached names
        # Lane by lane (priority 0 first). Each lane's sorted listing is cached: later
        # markers of a lane always sort after it (releases, which go before, reset the
        # caches through the front counter), so a listing serves many claims. A lane
        # with nothing cached is listed again, unless it was found empty since the
        # generation last changed (any process's enqueue, release, promotion... bumps it
        # before adding a marker; this process's own markers forget it directly), and
        # less than LANE_RECHECK ago (writers of the older code bump no generation).
        # A priority whose ring (see _groups) has entries serves its groups in turn.
        lane = 0
        items: dict[str, Rec] = {}
        turns = GroupTurns(q, limits, now, self._core.read)
        while len(claims) < max_jobs and lane < len(q.lanes):
            picked = turns.pick(lane)
            if picked is None:
                picked = self._next_ready(q, lane, now, turns)
            if picked is None:
                lane += 1
                continue
            directory, name, mk = picked
            if not name:
                continue  # a turn used without a job (a stale ring entry, a paused group...)
            parsed = self._core.marker(q, directory, name)
            if parsed is None:
                continue
            enc = parsed[1]
            target = pdir + "/" + enc
            try:
                os.rename(directory + "/" + name, target)
            except FileNotFoundError:
                continue  # claimed by someone else, or cancelled
            r = self._core.read(q, enc)
            if r is None or r.kind != _QUEUED or r.mk != mk:
                unlink_quiet(target)  # stale marker (cancelled job, or an old copy)
                continue
            if r.parent is not None and self._trees.ancestor_ended(q, r):
                # An ancestor failed or was cancelled: its cascade (level by level, a
                # step each) is on its way to r. Cancelled now, as it would be, instead
                # of handed out (a job of a cancelled tree never starts after its end).
                unlink_quiet(target)
                R.cancel_by_ancestor(r, now)
                r.mk = None
                self._trees.tree_ended(q, r)
                items[enc] = r
                events.append(StorageEvent("cancelled", r.id, token=r.token))
                continue
            attempt = R.claim(r, worker_id, now_ms, deadline, len(claims) < start)
            r.mk = None
            items[enc] = r
            if r.group is not None:
                turns.took(r.group, enc)
            assert r.claim is not None
            claims.append(Claim(r.id, r.envelope, attempt, r.claim, r.started))
        # The renames above are the claims; then one segment of processing records
        # (attempts, worker, lease). A crash between leaves proc entries whose record is
        # still queued: recover_stalled puts them back in ready/ (no attempt counted).
        self._core.commit(q, items, None)
        count_claims(q, flow, limits, now, len(claims))
        self._core.publish(q, events)
        self._core.maybe_clean(q, now)
        return claims, min(next_due, turns.wake_at)

    def _next_ready(self, q: FileQueue, lane: int, now: float, turns: GroupTurns) -> tuple[str, str, str] | None:
        """The next marker ``(directory, name, mk)`` of ungrouped lane ``lane`` (taken
        from its cache, listing it if need be), ``(directory, "", "")`` for a cached name
        to skip, or ``None`` when the lane has nothing (for this claim)."""
        cache = q.cache[lane]
        if not cache and not turns.list_lane(lane, now):
            return None
        if not cache:
            return None
        name = cache.popleft()
        return q.lanes[lane], name, (name if lane == DEFAULT_PRIORITY else f"p{lane}/{name}")

    async def _claim(
        self, q: FileQueue, worker_id: str, max_jobs: int, lease: float, start: int, limits: ClaimLimits | None
    ) -> tuple[list[Claim], float]:
        async with self._core.alock(q):
            return self._claim_locked(q, worker_id, max_jobs, lease, start, limits)

    async def dequeue(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        timeout: float,
        lease: float,
        start: int | None = None,
        limits: ClaimLimits | None = None,
    ) -> list[Claim]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        start = max_jobs if start is None else start
        give_up = trio.current_time() + timeout
        watch = q.watch("ready")
        while True:
            gen = watch.gen
            # The lock wait is the only cancellable step: once claimed, the claims are returned.
            claims, next_due = await self._claim(q, worker_id, max_jobs, lease, start, limits)
            if self._trees.dirty:  # a claim cancelled jobs whose ancestor ended: their notes
                with trio.CancelScope(shield=True):
                    await self._trees.act_on_notes()
            if claims:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return claims
            left = give_up - trio.current_time()
            if left <= 0:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return []
            await watch.wait(gen, min(left, self._settings.rescan_interval, max(next_due - time.time(), 0.0) + 0.001))
            if watch.gen != gen:
                q.lane_empty.clear()  # a marker appeared (inotify sees every writer's)
                q.grp.changes += 1

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        out: list[bool] = []
        events: list[StorageEvent] = []
        fds: list[int] = []
        dirs = {q.jobs_fd}
        items: dict[str, Rec] = {}
        retries: list[tuple[str, str]] = []
        queued: list[tuple[str, str]] = []  # (WAIT_SIGNAL of a job whose signal had arrived)
        nxt = front = -1
        hold = 0.0
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                pdir = q.proc + "/" + self._core.worker_enc(q, worker_id)
                for s in settlements:
                    enc = encode_name(s.id)
                    marker = pdir + "/" + enc
                    r = self._core.read(q, enc) if enc not in items else None
                    # A record this process wrote (a cache hit) as processing under this
                    # claim implies the proc entry: it was renamed in before the record
                    # was written, and whatever removes it re-points the record first.
                    held = (
                        r is not None
                        and r.kind == _PROCESSING
                        and r.worker == worker_id
                        and r.claim == s.token
                        and (q.hit or os.path.exists(marker))
                    )
                    if r is None or not held:
                        if R.settled_before(r, s.token):
                            out.append(True)  # settled by this very claim already: a retried call
                            continue
                        out.append(False)
                        events.append(StorageEvent("fenced", s.id, worker_id, token=r.token if r else None))
                        continue
                    out.append(True)
                    # a child failed under cancel: the run's end fails it (see _failed_by_children)
                    by_children = bool(r.children) and s.kind in R.ENDS_BY_CHILDREN and self._trees.failed_by_children(q, r)
                    event = R.settle(r, s.kind, s.data, now, s.ttl, by_children)
                    r.asleep = event == "sleeping"  # (a delayed record: which event to announce again)
                    if r.kind == _CANCELLED:
                        self._trees.cancel_claimed(q, r, worker_id, events)
                    elif r.kind in (_COMPLETED, _FAILED):
                        if R.in_tree(r):
                            self._trees.tree_ended(q, r)
                        result, error = (s.data, None) if r.kind == _COMPLETED else (None, s.data)
                        events.append(StorageEvent(r.kind, s.id, worker_id, result, error, r.token))
                    elif r.kind == WAITING_CHILDREN:
                        r.mk = None
                        r.children = r.children or []
                        self._trees.tree_ended(q, r)  # re-evaluated: queued at once if nothing is pending
                    elif r.kind == R.WAITING_SIGNAL:  # waits for a signal, until its deadline if any
                        events.append(StorageEvent("waiting_signal", s.id, worker_id, token=r.token))
                        deadline = R.WaitSignal.decode(s.data).deadline_ms
                        r.mk = None if deadline is None else seq_name(deadline, enc)
                        if r.mk is not None:
                            retries.append((enc, r.mk))
                    elif r.kind == _QUEUED:  # waited for a signal that had arrived: back at once
                        if nxt < 0:
                            nxt, front = q.counters()
                        r.mk = ready_name(nxt, enc, r.priority, r.group)
                        nxt += 1
                        queued.append((enc, r.mk))
                        events.append(StorageEvent("requeued", s.id, worker_id, token=r.token))
                    else:  # failing (a retry) or delayed (rate limited, or asleep): due after the delay
                        mk = seq_name(int((now + s.delay) * 1000), enc)
                        r.mk = mk
                        retries.append((enc, mk))
                        if event == "rate_limited":
                            hold = max(hold, now + s.delay)
                        assert event is not None
                        error = s.data if r.kind != _DELAYED else None
                        events.append(StorageEvent(event, s.id, worker_id, error=error, token=r.token))
                    items[enc] = r
                # (expiry/ is not flushed: the start-up repair links back an entry a
                # power cut lost, from the records, which are; see _restore_expiry)
                self._core.commit(q, items, fds)
                for enc, mk in retries:
                    self._core.link_marker(q, enc, q.delayed, mk)
                for enc, mk in queued:
                    self._core.link_marker(q, enc, q.ready, mk)
                if nxt >= 0:
                    q.set_counters(nxt, front)
                    dirs.update(q.lane_fds)
                if retries:
                    dirs.add(q.delayed_fd)
                    events.append(due_event(retries))
                # The events before the proc entries go: a crash between the re-points and
                # the events leaves the entries, and the reaper announces the settlement
                # (see Reaper.recover_stalled): a waiter never misses its job's end.
                self._core.publish(q, events)
                for enc in items:
                    unlink_quiet(pdir + "/" + enc)
                q.grp.left_all(items.items(), q.lane_empty)
                if hold:
                    hold_claims(q, hold)
                if items:
                    slot_freed(q)
        await self._core.finish(fds, dirs, bool(items))
        if self._trees.dirty:
            await self._trees.act_on_notes()
        if items and any(s.keep is not None for s in settlements):
            await self._retention.keep_newest(queue, settlements, out)  # (count-based retention: _retention.py)
        return out

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        events: list[StorageEvent] = []
        n = 0
        async with self._core.alock(q):
            now = time.time()
            pdir = os.path.join(q.proc, self._core.worker_enc(q, worker_id))
            nxt, front = q.counters()
            # Released jobs go before everything, in the order given.
            todo = []
            cancelled: dict[str, Rec] = {}  # ended: cancelled, or failed (attempts used up)
            seen: set[str] = set()
            for job_id in job_ids:
                enc = encode_name(job_id)
                marker = os.path.join(pdir, enc)
                if enc in seen or not os.path.exists(marker):
                    continue
                r = self._core.read(q, enc)
                if r is None or r.kind != _PROCESSING or r.worker != worker_id:
                    unlink_quiet(marker)
                    continue
                seen.add(enc)
                verdict = R.release(r, now, refund, worker_id)
                if verdict == "cancelled":  # a cancel request: it ends cancelled
                    self._trees.cancel_claimed(q, r, worker_id, events)
                    cancelled[enc] = r
                    continue
                if verdict == "failed":  # a started claim that used its last attempt
                    r.mk = None
                    if R.in_tree(r):
                        self._trees.tree_ended(q, r)
                    events.append(StorageEvent("failed", r.id, worker_id, error=r.error, token=r.token))
                    cancelled[enc] = r
                    continue
                todo.append((enc, marker, r))
            items: dict[str, Rec] = dict(cancelled)
            front = self._requeue_records(todo, items, front)
            # Records first, then the markers move back (a crash between: the reaper sees a
            # queued record whose marker is still in proc/ and moves it to ready/).
            self._core.commit(q, items, None)
            for enc in cancelled:
                unlink_quiet(os.path.join(pdir, enc))
            n = self._requeue_markers(q, todo, worker_id, events)
            q.grp.left_all(items.items(), q.lane_empty)
            if todo:
                q.set_counters(nxt, front)
            if items:
                slot_freed(q)
            self._core.publish(q, events)
        await trio.lowlevel.cancel_shielded_checkpoint()
        if self._trees.dirty:
            await self._trees.act_on_notes()
        return n

    @staticmethod
    def _requeue_records(todo: list[tuple[str, str, Rec]], items: dict[str, Rec], front: int) -> int:
        """Give the claimed jobs ``(enc, proc entry, record)`` a rule queued again
        (:func:`~.._rules.release`) a ready marker before everything else of its lane, in
        order (into ``items``, to be committed; then :meth:`_requeue_markers`). Returns
        the new front counter."""
        front -= len(todo)
        for i, (enc, _, r) in enumerate(todo):
            r.mk = ready_name(front + 1 + i, enc, r.priority, r.group)
            items[enc] = r
        return front

    @staticmethod
    def _requeue_markers(q: FileQueue, todo: list[tuple[str, str, Rec]], worker_id: str, events: list[StorageEvent]) -> int:
        """Move the proc entries of jobs :meth:`_requeue_records` made queued (their records
        committed) to their ready markers; how many."""
        for _, marker, r in todo:
            assert r.mk is not None
            q.lane_filled(r.mk)
            os.rename(marker, os.path.join(q.ready, r.mk))
            events.append(StorageEvent("requeued", r.id, worker_id, token=r.token))
        return len(todo)

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        pdir = os.path.join(q.proc, encode_name(worker_id))
        try:
            names = os.listdir(pdir)
        except FileNotFoundError:
            return []
        out = []
        for enc in names:
            if enc.startswith("."):
                continue
            job_id = decode_name(enc)
            if job_id is None:
                r = self._core.read(q, enc)
                if r is None:
                    continue
                job_id = r.id
            out.append(job_id)
        return out

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        out: list[bool] = []
        events: list[StorageEvent] = []
        items: dict[str, Rec] = {}
        fds: list[int] = []
        async with self._core.alock(q):
            with close_on_error(fds):
                now = time.time()
                pdir = os.path.join(q.proc, self._core.worker_enc(q, worker_id))
                paused = os.path.exists(q.paused)
                gone: list[str] = []
                back: list[tuple[str, str, Rec]] = []  # paused: prefetched jobs go back
                for job_id, token in claims:
                    found = self._core.held(q, pdir, worker_id, job_id, token)
                    if found is None:
                        out.append(False)
                        continue
                    enc, r = found
                    was_started = r.started
                    verdict = R.start(r, paused, now)
                    if verdict == _CANCELLED:  # a reserved claim of a job with a cancel request
                        self._trees.cancel_claimed(q, r, worker_id, events)
                        items[enc] = r
                        gone.append(enc)
                        out.append(False)
                        continue
                    if verdict == "back":  # paused: a reserved claim goes back, its attempt never counted
                        back.append((enc, pdir + "/" + enc, r))
                        out.append(False)
                        continue
                    if not was_started:
                        items[enc] = r
                    out.append(True)
                if back:
                    nxt, front = q.counters()
                    front = self._requeue_records(back, items, front)
                expiring = self._core.commit(q, items, fds)
                if back:
                    self._requeue_markers(q, back, worker_id, events)
                    q.set_counters(nxt, front)
                self._core.publish(q, events)  # before the proc entries go (see settle)
                for enc in gone:
                    unlink_quiet(os.path.join(pdir, enc))
                q.grp.left_all([(enc, items[enc]) for enc in gone] + [(enc, r) for enc, _, r in back], q.lane_empty)
        await self._core.finish(fds, {q.jobs_fd, q.expiry_fd} if expiring else {q.jobs_fd}, bool(items))
        if self._trees.dirty:
            await self._trees.act_on_notes()
        return out

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        now = time.time()
        enc_w = self._core.worker_enc(q, worker_id)
        wpath = os.path.join(q.workers, enc_w)
        exp = now + ttl
        try:
            os.utime(wpath, (exp, exp))
        except FileNotFoundError:
            # A new entry appears with its expiry already set (made under a temporary name,
            # then renamed): created in place, it would carry the current time as its expiry
            # until its utime, and another process's reaper could remove it in between
            # (dead workers holding nothing leave the registry), failing this heartbeat.
            tmp = os.path.join(q.tmp, tmp_name())
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            os.utime(tmp, (exp, exp))
            os.rename(tmp, wpath)
        reply = HeartbeatReply([], [])
        if claims:
            # The lease lives in the processing record: one new segment for all of them.
            pdir = os.path.join(q.proc, enc_w)
            deadline = now + lease
            items: dict[str, Rec] = {}
            async with self._core.alock(q):
                for job_id, token in claims:
                    found = self._core.held(q, pdir, worker_id, job_id, token)
                    if found is None:
                        known = self._core.read(q, encode_name(job_id))  # (None: forgotten)
                        kind, claim = (None, None) if known is None else (known.kind, known.claim)
                        if (why := lost_why(kind, claim, token)) is not None:
                            reply.lost.append(LostClaim(job_id, token, why))
                        continue
                    if found[0] in items:
                        continue
                    enc, r = found
                    r.lease = deadline
                    items[enc] = r
                    if r.cancel_requested:
                        reply.cancel_requested.append(job_id)
                self._core.commit(q, items, None)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return reply

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        enc_w = encode_name(worker_id)
        async with self._core.alock(q):
            unlink_quiet(os.path.join(q.workers, enc_w))
            try:
                os.rmdir(os.path.join(q.proc, enc_w))
                q.proc_dirs.discard(enc_w)
            except OSError:
                pass
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint()
        q = self._core.q(queue)
        now = time.time()
        out = {}
        for enc in os.listdir(q.workers):
            if enc.startswith("."):
                continue
            t = mtime_of(os.path.join(q.workers, enc))
            if t is None or (t <= now and not include_expired):
                continue
            w = self._core.worker_dec(q, enc)
            if w is not None:
                out[w] = t
        return out

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._core.q(queue)
        async with self._core.alock(q):
            pdir = os.path.join(q.proc, self._core.worker_enc(q, worker_id))
            found = self._core.held(q, pdir, worker_id, job_id, token)
            if found is not None:
                enc, r = found
                r.progress = progress
                self._core.commit(q, {enc: r}, None)
                self._core.publish(q, [StorageEvent("progress", job_id, worker_id, result=progress, token=r.token)])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found is not None
