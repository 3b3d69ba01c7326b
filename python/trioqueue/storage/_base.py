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
  ``Queue.on``).

All methods are async and are Trio checkpoints. Every mutating method is atomic: it either
happens entirely or not at all (a Lua script on Redis, a lock-protected step in memory,
a rename on disk). Times are seconds (float); state strings carry wall-clock milliseconds.

To write a backend, subclass :class:`Storage`, implement the abstract methods, and add a
fixture for it to ``tests/conftest.py``: the conformance suite in ``tests/test_storage.py``
then runs against it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple
from enum import StrEnum
from typing import Self

import trio

from .._models import DEFAULT_PRIORITY, CancelStatus, EnqueueStatus, UpdateTTLStatus

__all__ = [
    "Claim",
    "EnqueueOutcome",
    "JobRecord",
    "NewJob",
    "Settlement",
    "SettleKind",
    "Storage",
    "StorageEvent",
]


# The kinds of state strings (``parse_state``), shared by the backends.
QUEUED = "queued"
PROCESSING = "processing"
FAILING = "failing"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
DELAYED = "delayed"


class NewJob(NamedTuple):
    """A job to enqueue: its id, encoded envelope, and the registry fields a backend keeps.
    ``token`` names this incarnation of the id (unique; made by the producer); ``run_at``
    (seconds since the epoch) delays the job until then (``None`` or past: ready now).
    ``priority`` (0..9, lower first) picks the job's lane of the ready list; the job keeps
    it for life (retries, releases, recoveries and promotions return it to that lane)."""

    id: str
    envelope: bytes
    max_attempts: int
    result_ttl: float  # seconds the result/error (and the dedup entry) is kept once terminal
    token: str = ""
    run_at: float | None = None
    priority: int = DEFAULT_PRIORITY


class EnqueueOutcome(NamedTuple):
    """What an enqueue-if-absent did for one job.

    ``status`` is ``queued``, ``duplicate`` (``state`` is the existing state string) or
    ``completed`` (``result`` holds the cached serialized result); for the last two,
    ``token`` is the existing incarnation's token.
    """

    status: EnqueueStatus
    state: str | None = None
    result: bytes | None = None
    token: str | None = None


class Claim(NamedTuple):
    """A job moved into a worker's processing list.

    ``token`` is the claim token (opaque, unique per claim) that fences every later call
    about this claim. ``started`` says whether the attempt was counted at claim time; a
    *reserved* claim (``started`` false: prefetched) is counted by :meth:`Storage.start`
    just before its handler runs. ``attempts`` is the attempt's number (1-based) either way.
    """

    id: str
    envelope: bytes
    attempts: int
    token: str = ""
    started: bool = True


class SettleKind(StrEnum):
    COMPLETE = "complete"  # store result, state completed, notify
    FAIL = "fail"  # store error, state failed, notify
    RETRY = "retry"  # state failing, back to the ready list after ``delay``
    CANCEL = "cancel"  # the handler was cancelled on request: state cancelled, notify


class Settlement(NamedTuple):
    """The end of one attempt, acknowledged by the worker that holds the job.

    ``data`` is the serialized result (COMPLETE) or error (FAIL, RETRY); ``ttl`` is the
    result/error TTL in seconds (COMPLETE, FAIL) and ``delay`` the retry delay (RETRY).
    ``token`` is the claim token of the attempt (:attr:`Claim.token`).
    """

    kind: SettleKind
    id: str
    data: bytes
    ttl: float = 0.0
    delay: float = 0.0
    token: str = ""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registry entry as stored: ``state`` is the raw state string."""

    id: str
    state: str
    created_at_ms: int
    attempts: int
    max_attempts: int
    result: bytes | None = None
    error: bytes | None = None
    token: str | None = None  # the incarnation token
    progress: bytes | None = None  # the last progress reported by the handler (serialized)
    priority: int = DEFAULT_PRIORITY


class StorageEvent(NamedTuple):
    """One transition, as published on a queue's event stream.

    ``kind`` is one of ``enqueued``, ``completed``, ``failed``, ``failing``, ``requeued``,
    ``cancelled``, ``stalled``, ``fenced`` (a settlement refused because the worker no
    longer owned the job) or ``resync`` (the stream may have lost events: subscribers must
    re-check what they wait for; ``job_id`` is empty). ``result``/``error`` may carry the
    serialized result or error of ``completed``/``failed`` so that a waiter need not read
    it back; when they are ``None`` the waiter reads the registry. A ``progress`` event
    carries the serialized progress value in ``result``. ``token`` is the
    incarnation token of the job the event is about (job events carry it).
    """

    kind: str
    job_id: str
    worker_id: str | None = None
    result: bytes | None = None
    error: bytes | None = None
    token: str | None = None


def ttl_update_status(kind: str | None, result: bytes | None, error: bytes | None) -> UpdateTTLStatus | None:
    """The refusal :meth:`Storage.update_result_ttl` returns for a job in state ``kind``
    (``None``: unknown id), or ``None`` when the TTL may be updated."""
    if kind is None:
        return UpdateTTLStatus.NOT_FOUND
    if kind == "cancelled":
        return None
    if kind not in ("completed", "failed"):
        return UpdateTTLStatus.NOT_TERMINAL
    if (result if kind == "completed" else error) is None:
        return UpdateTTLStatus.MISSING_PAYLOAD
    return None


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

    @abc.abstractmethod
    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        """Set the TTL (from now) of a terminal job's result or error, and of its registry
        entry. ``not_terminal`` if the job is not completed/failed/cancelled,
        ``missing_payload`` if the registry says completed/failed but the result/error is
        gone."""

    # -- consumers -------------------------------------------------------------------

    @abc.abstractmethod
    async def dequeue(
        self, queue: str, worker_id: str, max_jobs: int, timeout: float, lease: float, start: int | None = None
    ) -> list[Claim]:
        """Claim up to ``max_jobs`` jobs in priority order (FIFO within a priority), waiting
        up to ``timeout`` seconds for the first one (a job of any priority wakes the wait at
        once); return ``[]`` on timeout.

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

        Cancellation: if the call is cancelled, no job may be left claimed-but-unreturned
        in a way the worker cannot see: a job claimed at the moment of cancellation either
        stays in the ready list or is in the worker's processing list (where
        :meth:`held_jobs` finds it and :meth:`release` gives it back).
        """

    @abc.abstractmethod
    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """Acknowledge finished attempts, each atomically: remove the job from the worker's
        processing list and store its outcome (completed/failed with TTL, or failing and
        scheduled for retry), publishing ``completed``/``failed``/``failing``.

        Fencing by claim: a settlement whose claim token is not the job's current claim in
        ``worker_id``'s processing list (the reaper recovered it, it was claimed again, or
        never claimed) changes nothing, publishes ``fenced``, and yields ``False`` at its
        index; otherwise ``True``. Idempotent: a settlement whose claim was already settled
        (a retried call whose first try landed) yields ``True`` and changes nothing."""

    @abc.abstractmethod
    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str]) -> int:
        """Give claimed-but-unfinished jobs back: move each from the worker's processing
        list to the *front* of the ready list (of its priority's lane), state ``queued``. Attempts never go down: a
        started claim's attempt stays counted (its handler may have run in part), a
        reserved claim's was never counted. Returns how many were released. Used at
        shutdown and when reconciling after a cancelled claim."""

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        """Count the attempts of reserved claims ``(job_id, claim_token)`` whose handlers are
        about to run: each still held by ``worker_id`` under that claim has its attempt
        counter incremented and becomes started (``True`` at its index). ``False`` (nothing
        changed) when the claim is no longer held: the worker must not run it. A started
        claim answers ``True`` again. Backends whose :meth:`dequeue` never reserves need not
        implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement start() (reserved claims)")

    @abc.abstractmethod
    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        """Ids in ``worker_id``'s processing list."""

    @abc.abstractmethod
    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> list[str]:
        """Register/refresh a live worker for ``ttl`` seconds and extend to ``now + lease``
        the leases of its claims ``(job_id, claim_token)`` that it still holds under that
        claim (others are left alone). Returns the ids among them that have a cancel
        request (see :meth:`cancel`), so a worker that missed the event still learns it."""

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

    # -- schedules (cron and periodic jobs) ----------------------------------------------

    async def put_schedule(self, queue: str, name: str, spec: bytes) -> None:
        """Create or replace the schedule ``name`` of ``queue`` (``spec`` is opaque bytes
        made by the scheduler). Replacing keeps its last tick."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Delete a schedule (and its last tick); False if there was none."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        """Every schedule of ``queue``: ``name -> (spec, last_tick)``, ``last_tick`` in
        seconds since the epoch (``None`` before the first)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement schedules")

    async def advance_schedule(self, queue: str, name: str, tick: float) -> bool:
        """Atomically set the schedule's last tick to ``tick`` if that moves it forward
        (True); False (nothing changed) if it is not later, or the schedule is gone."""
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

    @abc.abstractmethod
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take (or, if ``owner`` already holds it, renew) the leader lock ``name`` for
        ``ttl`` seconds. True if ``owner`` holds it afterwards."""

    @abc.abstractmethod
    async def release_lock(self, name: str, owner: str) -> bool:
        """Release the lock if ``owner`` holds it. True if it did."""

    # -- events ----------------------------------------------------------------------

    @abc.abstractmethod
    def subscribe(self, queue: str) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[list[StorageEvent]]]:
        """An async context manager yielding a receive channel of event batches for
        ``queue``, in publication order. Subscribed once ``__aenter__`` returns (no event
        published after that is missed, barring ``resync``); unsubscribed on exit."""
