"""The storage interface every backend implements.

A backend stores, for each *queue name*, the reliable-queue structures:

- a **ready list** of job envelopes (opaque ``bytes`` made by the Rust codec), in lanes by
  priority (0..9, lower first; :data:`~trioqueue.DEFAULT_PRIORITY` 5): claims take from
  the first non-empty lane, FIFO within a lane, and every way back to the ready list
  (retry, release, recovery, promotion) returns a job to its own lane;
- a **processing list per worker**: a claim atomically moves a job from the ready list
  into the claiming worker's list, sets its state to ``processing``, gives it a **lease**
  (a deadline) and a **claim token** (unique per claim); the worker settles it (complete /
  fail / retry) in one atomic step fenced by that token, or the reaper recovers it once
  the lease has expired;
- a **delayed set** of jobs waiting for a retry (state ``failing``) or enqueued with a
  due time (state ``delayed``), promoted to the ready list when due;
- the **job registry**: ``id -> state`` (state strings ``queued:<ms>``,
  ``processing:<ms>:<worker_id>``, ``failing:<ms>:<attempts>``, ``delayed:<ms>:<due_ms>``,
  ``completed:<ms>``,
  ``failed:<ms>``, ``cancelled:<ms>``), the job's **incarnation token** (chosen by the
  producer; a job cancelled and enqueued again under the same id is a new incarnation with
  a new token, and every event carries the token of the incarnation it is about), the
  attempt counter, and once terminal the serialized result or error, each with its own
  TTL; when it expires the id is forgotten (free to be enqueued again);
- a **worker registry** with heartbeat TTLs, **leader locks** for the reaper, and an
  **event stream** per queue (job transitions, used for ``enqueue_and_wait`` and
  ``Queue.on``). Events are routed by need: a subscriber names the kinds it wants
  (:meth:`Storage.subscribe`), and the *notice* kinds (:data:`NOTICE_KINDS`: terminal
  outcomes, cancel requests, fenced settlements) have a route of their own, so a waiter
  or a worker never receives (let alone decodes) the ``enqueued``/``progress``/... events.

All methods are async and are Trio checkpoints. Every mutating method is atomic: it either
happens entirely or not at all (a Lua script on Redis, a lock-protected step in memory,
a rename on disk, a transaction or a single statement on PostgreSQL). Times are seconds (float); state strings carry wall-clock milliseconds.

To write a backend, subclass :class:`Storage`, implement the abstract methods, and add a
fixture for it to ``tests/conftest.py``: the conformance suite in ``tests/test_storage*.py``
then runs against it.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Self

import trio

from .._model._types import CancelStatus, UpdateTTLStatus
from ._records import *  # noqa: F403 - the interface's records, re-exported
from ._records import __all__ as _records

__all__ = ["Storage", *_records]


class Storage(abc.ABC):
    """Abstract storage backend. See the module docstring for the data model.

    Lifecycle: ``async with storage:`` (or ``await storage.open()`` /
    ``await storage.aclose()``). Opening is reference-counted, so several
    :class:`~trioqueue.Queue` objects may share one storage; each opens it on start and
    closes it on stop, and the backend really connects on the first open and disconnects
    on the last close.
    """

    def __init__(self) -> None:
        self._open_count = 0

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (on the first call); later calls only count."""
        if self._open_count == 0:
            await self._connect()
        self._open_count += 1

    async def aclose(self) -> None:
        """Disconnect on the last matching close. Safe to call under cancellation."""
        if self._open_count <= 0:
            return
        self._open_count -= 1
        if self._open_count == 0:
            await self._disconnect()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def watchdog(self) -> None:  # noqa: B027 - optional hook
        """Backend hook: timers the backend's calls rely on, run by every running
        :class:`~trioqueue.Queue` in its nursery for as long as it runs (cancelled at its
        stop). RedisStorage enforces its request timeout here, so that a call on the lean
        client waits for its reply without a cancel scope of its own (calls made with no
        watchdog running bound their waits themselves). Default: returns at once."""

    async def _connect(self) -> None:  # noqa: B027 - optional hook
        """Backend hook: acquire connections/files. Default: nothing."""

    async def _disconnect(self) -> None:  # noqa: B027 - optional hook
        """Backend hook: release them. Called shielded from cancellation. Default: nothing."""

    # -- producers -------------------------------------------------------------------

    @abc.abstractmethod
    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        """Atomically, for each job in order: if the id is unknown (or ``cancelled``: the
        new job is a new incarnation), register it as ``queued:<now>`` with attempts 0 and
        its token, and append its envelope to the ready list (publishing ``enqueued``) —
        or, when its ``run_at`` is in the future, as ``delayed:<now>:<run_at ms>`` in the
        delayed set (publishing ``enqueued``; waiting claims recompute their wake-up); if
        the id is completed and its result is cached, return it; otherwise return
        ``duplicate`` with the existing state. The same id twice in one batch: the second is
        a duplicate of the first. Outcomes other than ``queued`` carry the existing token."""

    @abc.abstractmethod
    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        """Cancel a ``queued``, ``delayed`` or ``failing`` job: its state becomes ``cancelled:<now>``, kept
        for its result TTL (an enqueue of the id starts a new incarnation meanwhile); make
        sure it is never claimed; publish ``cancelled``. A job already cancelled answers
        ``cancelled`` again and publishes nothing.

        A ``processing`` job gets a *cancel request* (kept with it until it ends) and
        ``cancel_requested`` is published (``worker_id``: its holder), answering
        ``cancelled``: the holder cancels the handler and settles with
        :attr:`SettleKind.CANCEL`. From then on the job can only end ``completed``/``failed``
        (it finished first) or ``cancelled``: a retry, a release, a recovery by the reaper
        and a :meth:`start` of a reserved claim all make it ``cancelled`` (publishing
        ``cancelled``). Otherwise return ``completed``, ``failed`` or ``not_found`` and
        change nothing."""

    @abc.abstractmethod
    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        """The registry entry of a job, with its result/error if terminal and cached."""

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        """:meth:`get_job` of many ids at once, in order (``None`` for an unknown or
        expired id), in one round trip to the server (Redis: one script, the queue's keys
        sharing a Cluster slot; PostgreSQL: one query) and one consistent snapshot on the
        backends that have one. This default asks :meth:`get_job` for each id in turn."""
        return [await self.get_job(queue, jid) for jid in job_ids]

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        """The envelope the job was enqueued with (its payload: ``decode_envelope``), or
        ``None`` if the id is unknown, expired, or its envelope is no longer kept (Redis
        drops a completed job's envelope; every backend keeps it while the job may still
        run, and for a failed or cancelled job, which can be retried). For inspection
        (the dashboard's job page); never on a hot path."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_envelope (job payloads)")

    @abc.abstractmethod
    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        """Set the TTL (from now) of a terminal job's result or error, and of its registry
        entry. ``not_terminal`` if the job is not completed/failed/cancelled,
        ``missing_payload`` if the registry says completed/failed but the result/error is
        gone."""

    #: ``True`` when :meth:`enqueue_in_transaction` is implemented (PostgreSQL).
    supports_transactions = False

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        """:meth:`enqueue` with a debounce, atomically for each job in order (storage time):

        - if the id is waiting, ``delayed`` or ``queued`` (not claimed), the waiting job
          takes this job's envelope (its payload and options) and max attempts and result
          TTL, keeping its incarnation token, priority and creation time; a delayed one
          becomes due at ``now + delay``, but never later than ``created + max_wait``
          (``None``: no bound); a queued one (due already) stays queued. Answers
          ``debounced``, with the state and the token. Nothing is published but a ``due``
          notice when the due time moved earlier;
        - otherwise as :meth:`enqueue`, the new job due at ``now + delay``.

        The same id twice in one call: the second debounces the first."""
        raise NotImplementedError(f"{type(self).__name__} does not implement debounce()")

    async def enqueue_in_transaction(self, queue: str, jobs: Sequence[NewJob], transaction: object) -> list[EnqueueOutcome]:
        """:meth:`enqueue` inside the application's open ``transaction`` (made by the
        backend, e.g. ``PostgresStorage.transaction()``): the jobs exist, and claimers are
        woken, only if and when that transaction commits; a rollback leaves no trace.
        Only for backends with :attr:`supports_transactions`."""
        raise NotImplementedError(f"{type(self).__name__} has no transactions (transactional enqueue needs PostgreSQL)")

    async def enqueue_flow_in_transaction(self, jobs: Sequence[FlowJob], transaction: object) -> EnqueueOutcome:
        """:meth:`enqueue_flow` inside the application's open ``transaction``: the whole
        tree exists (and claimers of its queues are woken) only if and when that
        transaction commits. A refused tree (:class:`~trioqueue.FlowError`) writes nothing
        and leaves the transaction usable. Only for backends with
        :attr:`supports_transactions`."""
        raise NotImplementedError(f"{type(self).__name__} has no transactions (transactional enqueue needs PostgreSQL)")

    # -- consumers -------------------------------------------------------------------

    @abc.abstractmethod
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
        """Claim up to ``max_jobs`` jobs in priority order, waiting
        up to ``timeout`` seconds for the first one (a job of any priority wakes the wait at
        once); return ``[]`` on timeout. Within a priority, the groups that have ready jobs
        (:attr:`NewJob.group`; jobs without a group form one group) are served
        round-robin, one job per turn, FIFO within a group: a ring of the groups with ready
        jobs, rotated on each claim, so a claim costs the same whatever the number of
        groups. A paused group (:meth:`set_group_paused`), and one at its
        ``group_concurrency``, leave the ring until resumed or a slot of theirs is freed.

        Each claim atomically moves the job from the ready list to ``worker_id``'s
        processing list, sets its state to ``processing:<now>:<worker_id>``, its lease
        deadline to ``now + lease`` and a new claim token. The first ``start`` claims (all
        when ``None``) are *started*: their attempt counter is incremented. The others are
        *reserved* (prefetched): their attempt counts only once :meth:`start` says their
        handler is about to run, so a worker that dies holding them costs them nothing.
        Due jobs of the delayed set are promoted to the ready list first (publishing
        ``requeued`` for a retry, ``promoted`` for a delayed job); a claim waiting for work
        wakes when the earliest of them is due.
        Cancelled or stale entries are skipped and dropped.

        Flow control (see :class:`ClaimLimits`): a claim takes at most as many jobs as the
        rate limit's free tokens and the free concurrency slots allow, and none while a
        ``RateLimited`` hold lasts; a claim refused by them waits until the next token or
        the end of the hold is due, or until a settlement, release or recovery frees a slot.

        Cancellation: if the call is cancelled, no job may be left claimed-but-unreturned
        in a way the worker cannot see: a job claimed at the moment of cancellation either
        stays in the ready list or is in the worker's processing list (where
        :meth:`held_jobs` finds it and :meth:`release` gives it back).
        """

    @abc.abstractmethod
    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """Acknowledge finished attempts, each atomically: remove the job from the worker's
        processing list and store its outcome (completed/failed with TTL, or failing and
        scheduled for retry), publishing ``completed``/``failed``/``failing``; for
        :attr:`SettleKind.RATE_LIMITED`, state ``delayed`` due in ``delay`` seconds with the
        attempt counter as before this attempt, every claim of the queue held off for
        ``delay`` seconds, publishing ``rate_limited``.

        Fencing by claim: a settlement whose claim token is not the job's current claim in
        ``worker_id``'s processing list (the reaper recovered it, it was claimed again, or
        never claimed) changes nothing, publishes ``fenced``, and yields ``False`` at its
        index; otherwise ``True``. Idempotent: a settlement whose claim was already settled
        (a retried call whose first try landed) yields ``True`` and changes nothing."""

    @abc.abstractmethod
    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        """Give claimed-but-unfinished jobs back: move each from the worker's processing
        list to the *front* of the ready list (of its priority's lane), state ``queued``.
        A started claim's attempt stays counted (its handler may have run in part), a
        reserved claim's was never counted; with ``refund`` the holder says that none of
        these claims' handlers ran (prefetched claims handed back at shutdown), and a
        started claim's attempt is taken back. Returns how many were released. Used at
        shutdown and when reconciling after a cancelled claim."""

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        """Count the attempts of reserved claims ``(job_id, claim_token)`` whose handlers are
        about to run: each still held by ``worker_id`` under that claim has its attempt
        counter incremented and becomes started (``True`` at its index). ``False`` (nothing
        changed) when the claim is no longer held: the worker must not run it. A started
        claim answers ``True`` again. Backends whose :meth:`dequeue` never reserves need not
        implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement start() (reserved claims)")

    #: ``True`` when :meth:`start_nowait` is implemented (a backend without I/O).
    supports_start_nowait = False

    def start_nowait(self, queue: str, worker_id: str, job_id: str, token: str) -> bool:
        """:meth:`start` of one claim as a plain call, for a backend that needs no I/O for
        it (memory): the consumer then counts each reserved claim's attempt right before
        its handler, with no batch and no wait. Only called when
        :attr:`supports_start_nowait` is set."""
        raise NotImplementedError(f"{type(self).__name__} does not implement start_nowait()")

    @abc.abstractmethod
    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        """Ids in ``worker_id``'s processing list."""

    @abc.abstractmethod
    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        """Register/refresh a live worker for ``ttl`` seconds and extend to ``now + lease``
        the leases of its claims ``(job_id, claim_token)`` that it still holds under that
        claim (others are left alone), in one atomic step. Returns a
        :class:`HeartbeatReply`:

        - ``cancel_requested``: the ids among the held claims whose job has a cancel
          request (see :meth:`cancel`), so a worker that missed the event still learns it;
        - ``lost``: a :class:`LostClaim` ``(job_id, claim_token, why)`` for each claim
          passed that the worker no longer holds: ``fenced``, the job is processing
          under another claim (of any worker, this one included); ``cancelled``, the job
          ended cancelled (a cancel request ended the claim); ``recovered``, anything
          else: the reaper put it back or failed it, it was released, or it is
          forgotten. A claim that itself settled the job (its settlement landed first)
          is not lost and not listed. The worker cancels the handlers of lost claims:
          their outcome would be fenced."""

    @abc.abstractmethod
    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        """Remove a worker from the registry (its processing list should be empty)."""

    @abc.abstractmethod
    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        """Live workers: ``worker_id -> heartbeat expiry`` (seconds since the epoch). With
        ``include_expired``, also the registered workers whose heartbeat expired and that
        :meth:`recover_stalled` has not removed yet (dead, or holding jobs to recover)."""

    # -- reaper ----------------------------------------------------------------------

    @abc.abstractmethod
    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        """Recover every processing job whose lease has expired or whose worker is no
        longer registered as alive: a reserved claim (never started) goes back to the ready
        list with its attempt counter unchanged; a started one goes back (state ``queued``)
        if its attempts are below its max_attempts, else it is failed for good with a
        ``StalledJobError`` error stored for its result TTL. Publishes ``stalled`` and then
        ``requeued``/``failed`` for each. A worker whose heartbeat expired and whose
        processing list is empty is removed from the worker registry. Due jobs of the
        delayed set are promoted, as :meth:`dequeue` does (so they become ``queued`` on
        time even while no consumer claims).

        Returns ``([(job_id, "requeued" | "failed" | "cancelled"), ...], next_deadline)`` where
        ``next_deadline`` is the earliest lease deadline or due time still pending (seconds
        since the epoch), or ``None``: the reaper sleeps until then."""

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        """Store the serialized ``progress`` of a running job, fenced by its claim token
        (``False``, nothing changed, when ``worker_id`` no longer holds that claim), and
        publish ``progress`` (``result`` carries the value). It is kept in the record
        (:attr:`JobRecord.progress`) until the job is enqueued again."""
        raise NotImplementedError(f"{type(self).__name__} does not implement progress")

    # -- trees of jobs (flows) -----------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        """Write a tree of jobs in ONE atomic step, parents before their children (the
        root first, ``parent`` ``None``). If the root's id is known (and not cancelled),
        write nothing and return what :meth:`enqueue` would (``duplicate``/``completed``).
        Otherwise a job with children enters ``waiting_children:<now>`` (held nowhere: no
        ready list, no lease), a leaf is queued (or delayed) as :meth:`enqueue` does; each
        job records its parent, each parent its children, its ``policy`` and how many
        children are not terminal yet. A child id already known (and not cancelled) on its
        queue raises :class:`~trioqueue.FlowError` naming it, writing nothing; so does a tree
        across queues the backend cannot write in one step (Redis Cluster: queues whose
        keys are in different slots; the error names the root job and the queues).

        From then on, with the transition that makes a child terminal (settle, cancel,
        recovery: in its atomic step, or through a note that step writes and that is acted
        on right after, and by the next ``recover_stalled`` after a crash): a completed
        child (or a failed one under ``ignore``/``continue``) counts as done; once none is left, the parent becomes
        ``queued`` in its lane (publishing ``promoted``, waking claims). Under ``cancel``,
        a child failed for good or cancelled fails the parent at once
        (``ChildJobFailedError``: :func:`child_failed_error`, publishing ``failed``),
        cancels its queued/delayed/failing siblings and requests the cancellation of its
        processing ones (as :meth:`cancel` does); a failed parent is a failed child of its
        own parent, level by level. :meth:`cancel` of a parent cancels every descendant.
        A terminal child's result and record are kept until its parent is terminal (and
        then for its own TTL)."""
        root = jobs[0].job.id if jobs else "?"
        raise NotImplementedError(
            f"{type(self).__name__} does not implement trees of jobs (job {root!r} has children): nothing was written"
        )

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        """Add ``children`` (a subtree list, parents before children; direct children
        name ``(queue, job_id)`` as parent) to the processing job ``job_id`` held by
        ``worker_id`` under claim ``token``, atomically as :meth:`enqueue_flow` writes a
        tree (``FlowError`` for a known id, writing nothing). ``False`` (nothing written)
        when the claim is no longer held. ``policy`` is the job's ``on_child_failure`` when
        these are its first children. The job is then settled with
        :attr:`SettleKind.WAIT_CHILDREN` to wait for them. Under ``cancel``, once one of
        them failed for good (or was cancelled), any later settlement of the job's runs
        that would complete it or put it back (``COMPLETE``, ``RETRY``, ``RATE_LIMITED``:
        a run cut short before it stored ``WAIT_CHILDREN`` runs again, and finds its
        children ended) fails it as ``WAIT_CHILDREN`` would (``ChildJobFailedError``); a
        job queued, failing or delayed again then is failed at once by the failure."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement trees of jobs (children added to job {job_id!r}): nothing was written"
        )

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        """The records of a job's children, ``(queue, record)`` in the order they were
        added (children whose record expired or was removed are left out)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement trees of jobs")

    # -- schedules (cron and periodic jobs) ----------------------------------------------

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        """Create or replace the schedule ``name`` of ``queue`` (``spec`` is opaque bytes
        made by the scheduler), atomically and only if its stored spec is still
        ``expected`` (``None``: only if there is no such schedule): a compare-and-set, so
        that concurrent registrations never overwrite each other unseen. True if written;
        False (nothing changed) otherwise. Replacing keeps its last tick."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Delete a schedule (and its last tick); False if there was none."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        """Every schedule of ``queue``: ``name -> (spec, last_tick)``, ``last_tick`` in
        seconds since the epoch (``None`` before the first)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        """Run one tick of a schedule, in ONE atomic step: if the schedule exists and
        ``tick`` is later than its last tick, enqueue ``job`` exactly as :meth:`enqueue`
        does (dedup by id, ``enqueued`` event, wake-ups; ``None``: a skipped tick, nothing
        enqueued) and set the last tick to ``tick``: True. Otherwise (``tick`` not later,
        or the schedule is gone) change nothing: False. A tick thus runs at most once,
        whatever its job's result TTL and whoever else ticks the schedule."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    # -- flow control ------------------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause (or resume) claiming on ``queue`` for every worker: while paused,
        :meth:`dequeue` claims nothing (it waits, up to its timeout; running jobs are not
        touched); resuming wakes waiting claims at once. Stored in the storage, so every
        process sees it. Publishes ``paused``/``resumed`` when the flag changed; returns
        whether it changed."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pause/resume")

    async def is_paused(self, queue: str) -> bool:
        """Whether claiming on ``queue`` is paused."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pause/resume")

    # -- groups (fair queuing) ----------------------------------------------------------

    #: ``True`` when the backend keeps groups (:attr:`NewJob.group`): round-robin claims,
    #: ``ClaimLimits.group_concurrency`` and :meth:`set_group_paused`.
    supports_groups = False
    #: ``True`` when :meth:`dequeue` enforces ``ClaimLimits.group_rate``.
    supports_group_rate = False

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        """Pause (or resume) claiming the jobs of ``group`` on ``queue``, for every worker:
        while paused, :meth:`dequeue` passes over the group's ready jobs (other groups'
        are claimed as usual); resuming puts them back in the round-robin and wakes
        waiting claims. Returns whether the flag changed."""
        raise NotImplementedError(f"{type(self).__name__} does not implement groups")

    async def paused_groups(self, queue: str) -> list[str]:
        """The paused groups of ``queue``, sorted."""
        raise NotImplementedError(f"{type(self).__name__} does not implement groups")

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        """The number of ``queued`` and ``processing`` jobs of each group with any
        (``group -> {"queued": n, "processing": n}``; jobs without a group under ``""``).
        For the admin CLI (``stats --group``): it may scan the queue's active jobs."""
        raise NotImplementedError(f"{type(self).__name__} does not implement groups")

    # -- job registry queries and administration ---------------------------------------
    #
    # Each backend keeps, per queue and per state kind (:data:`STATE_KINDS`), an index of
    # the jobs in that state ordered by when they entered it (memory: an append-only log
    # with lazy deletion; file: the records' state times, scanned with a bounded heap;
    # Redis: one sorted set per state scored by the entry time, kept by the scripts that
    # move jobs). A job's envelope is kept until its record expires, so a failed or
    # cancelled job can be retried.

    async def counts(self, queue: str) -> dict[str, int]:
        """The number of jobs of ``queue`` in each state kind: every kind of
        :data:`STATE_KINDS` is a key (zeros included)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement job counts")

    async def oldest(self, queue: str, state: str) -> float | None:
        """When the job that has been in the non-terminal state kind ``state`` (queued,
        delayed, processing, failing) the longest entered it, in seconds since the epoch
        (ms precision); ``None`` when no job is in it. ``ValueError`` for another state.
        Feeds the oldest-job-age gauge of :mod:`trioqueue.metrics`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement oldest-job look-ups")

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        """A page of the jobs in state kind ``state``, newest first (by the time they
        entered it; file and Redis order jobs of the same millisecond by id), at most
        ``limit``; and the cursor of the next page (``None`` at the end). Cursors are
        opaque and stable: paging on while jobs come and go lists every job that stayed in
        the state exactly once, and not the jobs that entered it after the cursor's job.
        Memory stays bounded by ``limit`` whatever the number of jobs. A malformed cursor
        raises ``ValueError``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement job listing")

    async def retry_job(self, queue: str, job_id: str, token: str) -> bool:
        """Enqueue a ``failed`` or ``cancelled`` job again with its original envelope, as a
        new incarnation ``token`` with attempts reset (``queued:<now>``, appended to the
        ready list, publishing ``enqueued``). False (nothing changed) if the job is not
        failed or cancelled (or unknown)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement retry of failed jobs")

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        """Forget the jobs in terminal state kind ``state`` (completed, failed, cancelled)
        that entered it more than ``older_than`` seconds ago (all when ``None``), as if
        their TTL had run out. Returns how many. Redis works in bounded slices."""
        raise NotImplementedError(f"{type(self).__name__} does not implement purge")

    async def remove_job(self, queue: str, job_id: str) -> bool:
        """Forget a job that is not processing: its registry entry, result/error, and its
        place in the ready list or delayed set (it will never run), publishing
        ``removed``. False (nothing changed) if the id is unknown or processing."""
        raise NotImplementedError(f"{type(self).__name__} does not implement remove")

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        """Empty ``queue``, atomically: forget every job of it in every state (ready
        lists, delayed set, processing lists and leases, the registry with results,
        errors and progress, the state indexes, trees' links) and its flow-control state
        (rate-limit log, ``RateLimited`` hold, and the groups': rings, claimed slots,
        ``group_rate`` logs), as if none had ever been enqueued. The pause flag, the paused
        groups, the worker registry and (unless ``schedules``) the schedules with their
        last ticks are kept. A worker still running a job of the queue finds its
        claim gone: its settlement is fenced (changes nothing, publishes ``fenced``) and
        its heartbeat lists the claim as lost (``recovered``). Trees are not followed across
        queues: a parent on another queue waiting for a child of this one is not told
        (cancel or remove it). Publishes ``cleared`` (a notice: waiters re-read the
        registry and find their job gone). Returns how many jobs were forgotten (records
        whose TTL had run out but that were not swept yet may be counted)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement clear")

    async def queue_names(self) -> list[str]:
        """The names of the queues this storage knows (sorted): memory, the queues it has
        structures for; file, its queue directories; Redis, a set maintained by the
        producer (each process adds a queue's name once, on its first enqueue)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement queue names")

    @abc.abstractmethod
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take (or, if ``owner`` already holds it, renew) the leader lock ``name`` for
        ``ttl`` seconds. True if ``owner`` holds it afterwards."""

    @abc.abstractmethod
    async def release_lock(self, name: str, owner: str) -> bool:
        """Release the lock if ``owner`` holds it. True if it did."""

    # -- events ----------------------------------------------------------------------

    @abc.abstractmethod
    def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[list[StorageEvent]]]:
        """An async context manager yielding a receive channel of event batches for
        ``queue``, in publication order. Subscribed once ``__aenter__`` returns (no event
        published after that is missed, barring ``resync``); unsubscribed on exit.

        ``kinds`` routes by need: only events of those kinds are delivered (never an
        empty batch), plus every ``resync``, which is never filtered out; ``None`` (the
        default) delivers every kind. A backend should route, not just filter, when
        ``kinds`` is a subset of :data:`NOTICE_KINDS`: such a subscriber (a waiter, a
        worker) must not pay for the other events (Redis publishes the notice kinds on a
        second channel, ``{prefix:queue}:notices``, and subscribes there; memory and file
        filter before delivering). Use :func:`select_events` to filter."""
