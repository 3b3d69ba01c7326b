"""The records the storage interface passes (jobs to enqueue, claims, settlements, job
records, events) and the state kinds, apart from the :class:`~trioqueue.storage.Storage`
interface itself (``_base.py``, which re-exports them)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

from .._model._types import DEFAULT_PRIORITY, EnqueueStatus
from ._rules import (
    CANCELLED,
    COMPLETED,
    DELAYED,
    FAILED,
    FAILING,
    PROCESSING,
    QUEUED,
    STATE_KINDS,
    TERMINAL_KINDS,
    WAITING_CHILDREN,
    Rec,
    SettleKind,
    child_failed_error,
    parse_job_state,
    ttl_update_status,
    waiting_state,
)

__all__ = [
    "CANCELLED",
    "CLEARED",
    "COMPLETED",
    "Claim",
    "ClaimLimits",
    "DELAYED",
    "EnqueueOutcome",
    "FAILED",
    "FAILING",
    "FENCED",
    "FlowJob",
    "HeartbeatReply",
    "JobRecord",
    "LostClaim",
    "NOTICE_KINDS",
    "NewJob",
    "PROCESSING",
    "QUEUED",
    "RECOVERED",
    "STATE_KINDS",
    "SettleKind",
    "Settlement",
    "StorageEvent",
    "TERMINAL_KINDS",
    "WAITING_CHILDREN",
    "child_failed_error",
    "parse_job_state",
    "waiting_state",
    "check_active_kind",
    "check_state_kind",
    "job_record",
    "lost_why",
    "select_events",
    "ttl_update_status",
    "wanted_kinds",
]


# The state grammar (kinds, terminal kinds) is owned by the lifecycle rules (``_rules``);
# re-exported here for the backends and the interface.
# The event of :meth:`Administration.clear`: every job of the queue was forgotten (a notice:
# waiters re-read the registry and find their job gone).
CLEARED = "cleared"

# The event kinds someone *acts on*, routed on their own (Redis: a second pub/sub channel):
# a job's terminal outcome (what ``enqueue_and_wait`` waits for: ``removed`` ends a job
# too), a cancel request (for the worker holding the job), a fenced settlement, a
# storage ``error``, ``paused``/``resumed`` (workers hand back the jobs they prefetched)
# and ``due``: a job entered the delayed set (a delayed enqueue, a retry, a rate-limited
# put-back) due before anything else pending there (``result``: its due time, epoch ms as
# text), so the reaper, which promotes due jobs, wakes in time; and ``cleared``
# (:meth:`Administration.clear`: every job of the queue is gone). A subscription asking
# for some of these only (``subscribe(queue, kinds=NOTICE_KINDS)``) gets none of the
# per-job traffic (``enqueued``, ``progress``, ``requeued``...).
NOTICE_KINDS = frozenset(
    {COMPLETED, FAILED, CANCELLED, "removed", "cancel_requested", "fenced", "error", "paused", "resumed", "due", CLEARED}
)


def wanted_kinds(kinds: Collection[str] | None) -> frozenset[str] | None:
    """``kinds`` of :meth:`Storage.subscribe` as a frozenset (``None``: every kind)."""
    return None if kinds is None else frozenset(kinds)


def select_events(events: list[StorageEvent], kinds: frozenset[str] | None) -> list[StorageEvent]:
    """The events of ``events`` a subscription for ``kinds`` receives: those of its kinds
    and every ``resync`` (all of them when ``kinds`` is ``None``), in order."""
    if kinds is None:
        return events
    return [ev for ev in events if ev.kind in kinds or ev.kind == "resync"]


def check_active_kind(state: str) -> None:
    """``ValueError`` unless ``state`` is a non-terminal state kind."""
    if state not in STATE_KINDS or state in TERMINAL_KINDS:
        active = ", ".join(k for k in STATE_KINDS if k not in TERMINAL_KINDS)
        raise ValueError(f"expected a non-terminal state ({active}), got {state!r}")


def check_state_kind(state: str, *, terminal: bool = False) -> None:
    """``ValueError`` unless ``state`` is a state kind (a terminal one with ``terminal``)."""
    allowed = TERMINAL_KINDS if terminal else STATE_KINDS
    if state not in allowed:
        raise ValueError(f"unknown state {state!r}: expected one of {', '.join(allowed)}")


class NewJob(NamedTuple):
    """A job to enqueue: its id, encoded envelope, and the registry fields a backend keeps.
    ``token`` names this incarnation of the id (unique; made by the producer); ``run_at``
    (seconds since the epoch) delays the job until then (``None`` or past: ready now).
    ``priority`` (0..9, lower first) picks the job's lane of the ready list; the job keeps
    it for life (retries, releases, recoveries and promotions return it to that lane).
    ``group`` (``None``: no group) puts it in that group's lane of its priority: claims
    take the groups of a priority round-robin (see :meth:`Storage.dequeue`)."""

    id: str
    envelope: bytes
    max_attempts: int
    result_ttl: float  # seconds the result/error (and the dedup entry) is kept once terminal
    token: str = ""
    run_at: float | None = None
    priority: int = DEFAULT_PRIORITY
    group: str | None = None


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


# Why a worker no longer holds a claim (:attr:`LostClaim.why`; see :meth:`Storage.heartbeat`):
# the reaper took the job back (queued again, or failed for good) or it was released: the
# claim is gone; the job ended ``cancelled`` (CANCELLED, the state kind); another claim holds
# the job now. (A worker adds ``expired`` of its own: it could not renew the lease in time.)
RECOVERED = "recovered"
FENCED = "fenced"


def lost_why(kind: str | None, claim: str | None, token: str) -> str | None:
    """Why claim ``token`` is no longer held, for a backend's :meth:`Storage.heartbeat`,
    given the job's state kind (``None``: unknown id) and its current (or last settled)
    claim token ``claim``; ``None`` when that very claim settled the job (a settlement
    that landed while the heartbeat was under way: not a loss)."""
    if kind == PROCESSING:
        return FENCED
    if claim == token:
        return None
    return CANCELLED if kind == CANCELLED else RECOVERED


class LostClaim(NamedTuple):
    """A claim ``(id, token)`` passed to :meth:`Storage.heartbeat` that its worker no longer
    holds, and ``why``: ``recovered`` (the reaper put the job back or failed it, it was
    released, or it is forgotten), ``cancelled`` (the job ended cancelled) or ``fenced``
    (another claim holds the job)."""

    id: str
    token: str
    why: str


class HeartbeatReply(NamedTuple):
    """What :meth:`Storage.heartbeat` tells the worker of the claims it passed:
    ``cancel_requested``, the ids of held claims whose job has a cancel request; ``lost``,
    the claims it no longer holds (their leases were not renewed)."""

    cancel_requested: list[str]
    lost: list[LostClaim]


class ClaimLimits(NamedTuple):
    """Queue-wide flow control applied by :meth:`Storage.dequeue` (the caller passes its
    queue's settings on every call; the state they govern lives in the storage, so the
    limits hold across every worker process):

    - ``rate``: at most ``rate`` jobs claimed per sliding window of ``per`` seconds
      (0: no limit). A token is taken when a job is *claimed*, started or reserved, so
      prefetching can never exceed the rate (a Queue with a rate limit does not prefetch:
      its claims start at once, so claims, attempts and handler starts coincide).
    - ``concurrency``: at most that many jobs of the queue claimed (processing) at once
      (0: no limit). A claim holds its slot until it is settled, released, or recovered
      by the reaper (a dead worker's slots come back with its jobs).

    - ``group_concurrency``: at most that many jobs of one group claimed at once (0: no
      limit; jobs without a group are not limited by it). A group at its limit is passed
      over (the claim takes other groups' jobs); its slot comes back as a concurrency
      slot does.
    - ``group_rate``: at most that many jobs of one group claimed per sliding window of
      ``group_per`` seconds (0: no limit; jobs without a group are not limited by it). A
      group over its rate is passed over until its next token is due (a claim refused
      for it waits until then, as for the queue's rate).

    A claim refused by them waits (up to its timeout) until the next token is due or a
    slot is freed, never spinning. The ``RateLimited`` hold (:attr:`SettleKind.RATE_LIMITED`)
    applies to every claim, with or without limits.
    """

    rate: int = 0
    per: float = 1.0
    concurrency: int = 0
    group_concurrency: int = 0
    group_rate: int = 0
    group_per: float = 1.0


class Settlement(NamedTuple):
    """The end of one attempt, acknowledged by the worker that holds the job.

    ``data`` is the serialized result (COMPLETE) or error (FAIL, RETRY); ``ttl`` is the
    result/error TTL in seconds (COMPLETE, FAIL) and ``delay`` the retry delay (RETRY).
    ``token`` is the claim token of the attempt (:attr:`Claim.token`).

    ``keep`` (COMPLETE, FAIL; ``None``: no limit) is count-based retention: at most that
    many jobs of the queue are kept in the state the settlement enters (``completed``
    or ``failed``), the newest; the older ones are forgotten as if their TTL had run
    out, beside the TTL (whichever removes a job first). Memory and Redis apply it in
    the settlement's atomic step (Redis orders terminal jobs by when they expire: by
    when they ended, for jobs that share a TTL); PostgreSQL in the same call, right
    after the settlement commits; the file backend in batches (see ``FileStorage``).
    The jobs of trees of jobs are not counted out while their tree needs them.
    """

    kind: SettleKind
    id: str
    data: bytes
    ttl: float = 0.0
    delay: float = 0.0
    token: str = ""
    keep: int | None = None


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
    parent: tuple[str, str] | None = None  # a child of a tree: its parent ``(queue, id)``
    children: int = 0  # a parent: how many children it has (see ``Trees.get_children``)
    group: str | None = None  # its group (``NewJob.group``), ``None`` without one


class StorageEvent(NamedTuple):
    """One transition, as published on a queue's event stream.

    ``kind`` is one of ``enqueued``, ``completed``, ``failed``, ``failing``, ``requeued``,
    ``cancelled``, ``stalled``, ``removed`` (:meth:`Administration.remove_job`), ``fenced`` (a settlement refused because the worker no
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


class FlowJob(NamedTuple):
    """One job of a tree (:meth:`Trees.enqueue_flow`, :meth:`Trees.add_children`):
    the job, the queue it lives on, its ``parent`` ``(queue, id)`` (``None`` for the root)
    and ``policy``, its own ``on_child_failure`` (``cancel``, ``continue``, ``ignore``),
    used when it has children or dependencies; ``depends_on``, the ``(queue, id)`` of the
    existing jobs it waits for besides its children (see :meth:`Trees.enqueue_flow`)."""

    queue: str
    job: NewJob
    parent: tuple[str, str] | None = None
    policy: str = "cancel"
    depends_on: tuple[tuple[str, str], ...] = ()


def job_record(r: Rec, state: str | None = None) -> JobRecord:
    """The interface's view of a registry record (``state``: its state string, when the
    backend knows more of it than the record, e.g. a delayed job's due time)."""
    return JobRecord(
        r.id, r.state() if state is None else state, r.created, r.attempts, r.max_attempts, r.result, r.error,
        r.token, r.progress, r.priority, r.parent, 0 if r.children is None else len(r.children), r.group,
    )  # fmt: skip
