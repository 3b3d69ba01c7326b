"""The core storage interface: what every backend implements (what a job queue *is*).

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
a rename on disk, a transaction or a single statement on PostgreSQL). Times are seconds
(float); state strings carry wall-clock milliseconds.

Each method's docstring ends with its promise, written once here: **Atomic** says what is
one indivisible step (a crash or a cancellation leaves all of it or none of it), and
**Fenced** says what a stale caller's call cannot change. Three things fence: the *claim
token* (unique per claim, made by :meth:`Storage.dequeue`: settle, start, heartbeat's lease
renewal, progress, adding children), the *worker's processing list* (release), and the
*lock owner* (leader locks). The incarnation token is not a fence: it tells which
incarnation an outcome or an event is about.

The core is :class:`Storage` (this module). What a backend may have or not (trees of jobs,
schedules, groups, debounce, administration, transactions, a start without I/O) is a
*capability*, an abstract class of :mod:`trioqueue.storage._capabilities` that the backend
lists among its bases; code that needs one checks ``isinstance(storage, Capability)``.

To write a backend, subclass :class:`Storage` (and the capabilities it has), implement the
abstract methods, and add a fixture for it to ``tests/conftest.py``: the conformance suite
then runs against it, each capability's tests only on the backends that have it.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Self

import trio

from .._model._clock import note_run
from .._model._types import CancelStatus, UpdateTTLStatus
from ._records import *  # noqa: F403 - the interface's records, re-exported
from ._records import __all__ as _records

__all__ = ["Storage", *_records]


class Storage(abc.ABC):
    """Abstract storage backend: the core every backend implements. See the module
    docstring for the data model and the atomicity and fencing conventions.

    The core is: enqueue, claim (:meth:`dequeue`, :meth:`start`), settle (:meth:`settle`,
    :meth:`release`), renew (:meth:`heartbeat`), progress, recover
    (:meth:`recover_stalled`), status (:meth:`get_job`, :meth:`get_jobs`), list
    (:meth:`counts`, :meth:`list_jobs`), cancel, the worker registry, leader locks and
    events (:meth:`subscribe`). The rest are capabilities (``trioqueue.storage``:
    ``Trees``, ``Schedules``, ``Groups``, ``Debounce``, ``Administration``,
    ``Transactions``, ``NonBlockingStart``).

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
        note_run()  # (a storage opened under a MockClock follows it: see _model._clock)
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
        a duplicate of the first. Outcomes other than ``queued`` carry the existing token.

        Atomic: each job's step (the check of its id, its record, its place in the ready
        list or delayed set, its ``enqueued`` event). Fenced: no (nothing is claimed yet);
        the id deduplicates a repeated call."""

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
        change nothing.

        Atomic: the one step (the new state or cancel request, its event). Fenced: no
        (anyone may cancel); a holder's later settlement honours the cancel request."""

    @abc.abstractmethod
    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        """The registry entry of a job, with its result/error if terminal and cached.

        Atomic: a read of one consistent record. Fenced: no."""

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        """:meth:`get_job` of many ids at once, in order (``None`` for an unknown or
        expired id), in one round trip to the server (Redis: one script, the queue's keys
        sharing a Cluster slot; PostgreSQL: one query) and one consistent snapshot on the
        backends that have one. This default asks :meth:`get_job` for each id in turn.

        Atomic: each record is consistent (all of them together where the backend reads a
        snapshot). Fenced: no."""
        return [await self.get_job(queue, jid) for jid in job_ids]

    @abc.abstractmethod
    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        """Set the TTL (from now) of a terminal job's result or error, and of its registry
        entry. ``not_terminal`` if the job is not completed/failed/cancelled,
        ``missing_payload`` if the registry says completed/failed but the result/error is
        gone.

        Atomic: one step (both TTLs or neither). Fenced: no."""

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
        groups. A paused group (:meth:`Groups.set_group_paused`), and one at its
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

        Groups (:attr:`NewJob.group`, ``ClaimLimits.group_concurrency`` and
        ``group_rate``) are kept only by a backend with the ``Groups`` capability; the
        callers give them to no other.

        Atomic: each claim (the move, the state, the lease, the new claim token, the
        attempt of a started claim, the flow-control accounting). Fenced: no; it makes the
        claim token that fences every later call about the claim.
        """

    @abc.abstractmethod
    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """Acknowledge finished attempts, each atomically: remove the job from the worker's
        processing list and store its outcome (completed/failed with TTL, or failing and
        scheduled for retry), publishing ``completed``/``failed``/``failing``; for
        :attr:`SettleKind.RATE_LIMITED`, state ``delayed`` due in ``delay`` seconds with the
        attempt counter as before this attempt, every claim of the queue held off for
        ``delay`` seconds, publishing ``rate_limited``; for :attr:`SettleKind.SLEEP` (the
        handler went to sleep: ``Job.sleep``), the same without holding off any claim,
        publishing ``sleeping``; for :attr:`SettleKind.WAIT_SIGNAL` (``Signals``), state
        ``waiting_signal`` publishing ``waiting_signal`` (or ``queued`` publishing
        ``requeued`` if its messages have arrived). A job with a cancel request that a
        settlement would put back (``RETRY``, ``RATE_LIMITED``, ``WAIT_CHILDREN``,
        ``SLEEP``, ``WAIT_SIGNAL``) ends ``cancelled``.

        Fencing by claim: a settlement whose claim token is not the job's current claim in
        ``worker_id``'s processing list (the reaper recovered it, it was claimed again, or
        never claimed) changes nothing, publishes ``fenced``, and yields ``False`` at its
        index; otherwise ``True``. Idempotent: a settlement whose claim was already settled
        (a retried call whose first try landed) yields ``True`` and changes nothing.

        Atomic: each settlement (the outcome, the removal from the processing list, the
        freed flow-control slot, its event; a tree's parent learns of it as
        ``Trees.enqueue_flow`` says).
        Fenced: by the claim token, as above."""

    @abc.abstractmethod
    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        """Give claimed-but-unfinished jobs back: move each from the worker's processing
        list to the *front* of the ready list (of its priority's lane), state ``queued``.
        A started claim's attempt stays counted (its handler may have run in part), a
        reserved claim's was never counted; with ``refund`` the holder says that none of
        these claims' handlers ran (prefetched claims handed back at shutdown), and a
        started claim's attempt is taken back. Without ``refund``, a started claim that
        used its last attempt is not queued again: it fails (``StalledJobError``,
        publishing ``failed``), as the reaper's recovery of it would, so that no job runs
        more than ``max_attempts`` attempts; a job with a cancel request ends cancelled.
        Returns how many were released (queued again). Used at
        shutdown and when reconciling after a cancelled claim.

        Atomic: each job's release. Fenced: by the worker's processing list: a job that
        ``worker_id`` no longer holds is left alone (not counted)."""

    @abc.abstractmethod
    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        """Count the attempts of reserved claims ``(job_id, claim_token)`` whose handlers are
        about to run: each still held by ``worker_id`` under that claim has its attempt
        counter incremented and becomes started (``True`` at its index). ``False`` (nothing
        changed) when the claim is no longer held: the worker must not run it. A started
        claim answers ``True`` again (a job with a cancel request: see :meth:`cancel`).

        Atomic: each claim's step. Fenced: by the claim token."""

    @abc.abstractmethod
    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        """Ids in ``worker_id``'s processing list.

        Atomic: a read. Fenced: no."""

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
          their outcome would be fenced.

        Atomic: the whole call (the registration and every lease renewal) is one step.
        Fenced: each lease renewal by its claim token (a lost claim is reported, not
        renewed)."""

    @abc.abstractmethod
    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        """Remove a worker from the registry (its processing list should be empty).

        Atomic: one step. Fenced: no."""

    @abc.abstractmethod
    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        """Live workers: ``worker_id -> heartbeat expiry`` (seconds since the epoch). With
        ``include_expired``, also the registered workers whose heartbeat expired and that
        :meth:`recover_stalled` has not removed yet (dead, or holding jobs to recover).

        Atomic: a read. Fenced: no."""

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
        since the epoch), or ``None``: the reaper sleeps until then.

        Atomic: each job's recovery (checked against its lease and its worker in that
        step, so a recovery and a settlement racing for a claim never both happen: the
        loser is fenced or finds nothing). Fenced: by the lease: only an expired claim or
        the claim of a dead worker is recovered."""

    @abc.abstractmethod
    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        """Store the serialized ``progress`` of a running job, fenced by its claim token
        (``False``, nothing changed, when ``worker_id`` no longer holds that claim), and
        publish ``progress`` (``result`` carries the value). It is kept in the record
        (:attr:`JobRecord.progress`) until the job is enqueued again.

        Atomic: one step (the value and its event). Fenced: by the claim token."""

    # -- status and listing --------------------------------------------------------------
    #
    # Each backend keeps, per queue and per state kind (:data:`STATE_KINDS`), an index of
    # the jobs in that state ordered by when they entered it (memory: an append-only log
    # with lazy deletion; file: the records' state times, scanned with a bounded heap;
    # Redis: one sorted set per state scored by the entry time, kept by the scripts that
    # move jobs). A job's envelope is kept until its record expires, so a failed or
    # cancelled job can be retried.

    @abc.abstractmethod
    async def counts(self, queue: str) -> dict[str, int]:
        """The number of jobs of ``queue`` in each state kind: every kind of
        :data:`STATE_KINDS` is a key (zeros included).

        Atomic: a read (not necessarily one snapshot of every kind). Fenced: no."""

    @abc.abstractmethod
    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        """A page of the jobs in state kind ``state``, newest first (by the time they
        entered it; file and Redis order jobs of the same millisecond by id), at most
        ``limit``; and the cursor of the next page (``None`` at the end). Cursors are
        opaque and stable: paging on while jobs come and go lists every job that stayed in
        the state exactly once, and not the jobs that entered it after the cursor's job.
        Memory stays bounded by ``limit`` whatever the number of jobs. A malformed cursor
        raises ``ValueError``.

        Atomic: a read of each record (a page is not a snapshot: see the cursors' promise
        above). Fenced: no."""

    @abc.abstractmethod
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take (or, if ``owner`` already holds it, renew) the leader lock ``name`` for
        ``ttl`` seconds. True if ``owner`` holds it afterwards.

        Atomic: one compare-and-set step. Fenced: by the owner."""

    @abc.abstractmethod
    async def release_lock(self, name: str, owner: str) -> bool:
        """Release the lock if ``owner`` holds it. True if it did.

        Atomic: one compare-and-delete step. Fenced: by the owner."""

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
        filter before delivering). Use :func:`select_events` to filter.

        Atomic: every event is published by the atomic step of the transition it reports
        (never for a step that did not happen; on PostgreSQL, delivered once its
        transaction commits). A subscriber that misses events (a lost connection, a
        slow consumer) receives ``resync`` and re-reads what it needs. Fenced: no."""
