"""The job lifecycle, written once and free of I/O (the h11 way: a state machine with no
sockets, no files, no clock): the state grammar, the transitions a job's record may take
and what each does to it (attempts, claim tokens, leases, results, expiry), the decision
of a stalled job (back in the queue, or failed), what a child's end does to its parent
(``on_child_failure``), debounce and retention arithmetic.

:class:`Rec` is the one registry record the rules act on. MemoryStorage and FileStorage
keep their jobs in subclasses of it that add only *where* a backend files a record (the
in-process index and heaps; the file backend's marker name); every change of a record's lifecycle fields goes through the functions here.
The backends then file the record where its new kind says (a ready lane, the delayed
heap or ``delayed/``, an expiry index...) and publish the events named here. The model
walks (``tests/model``) compare Redis (Lua) and PostgreSQL (SQL) against MemoryStorage,
so against these rules.

Ownership of the state grammar. This module owns the table of state kinds
(:data:`STATE_KINDS`, :data:`KIND_FIELDS`: which kinds exist, which are terminal, which
field each kind's state string carries) and the transition table (:data:`TRANSITIONS`).
The Rust core's state codec (``rust/src/state.rs``, exposed as
``trioqueue._core.parse_state``/``format_state``) is the fast reader and writer of those
strings on the hot paths; it is derived from this table, and ``tests/model/test_rules.py``
verifies it against it (every kind but ``waiting_children`` round-trips through it with
the field given here, and it knows no kind this table lacks). ``waiting_children:<ms>``
is read and written here (:func:`parse_job_state`, :func:`format_job_state`). Python owns
it because the rules that give the kinds their meaning (which step may move a job from
which kind to which) are Python, run by the two reference backends; the Rust codec stays
a codec, and a kind added here without it fails that test.

Group slots and rates are not here: they are claim-time flow control, kept by each
backend's claim (see ``_flowstate`` for the queue-wide part both share).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final, NamedTuple, NoReturn

from .._core import format_state, parse_state
from .._model._serde import decode_error, encode_error
from .._model._types import DEFAULT_PRIORITY, CancelStatus, JobError, UpdateTTLStatus
from ._steps import decode_signals

__all__ = [
    "ACTIVE_KINDS",
    "BACK",
    "cancel",
    "cancel_by_ancestor",
    "CANCEL_CHILDREN",
    "cancel_claimed",
    "CANCELLABLE",
    "CANCELLED",
    "child_failed_error",
    "claim",
    "complete",
    "COMPLETED",
    "debounce",
    "debounce_delay",
    "debounce_run_at",
    "debounces",
    "DELAYED",
    "ended_cancels_children",
    "ENDS_BY_CHILDREN",
    "enqueue_kind",
    "existing_outcome",
    "FAIL",
    "fail_by_children",
    "FAILED",
    "failed_by_children",
    "FAILING",
    "format_job_state",
    "in_tree",
    "is_expired",
    "KEPT",
    "KIND_FIELDS",
    "NOTHING",
    "parent_verdict",
    "parse_job_state",
    "PROCESSING",
    "promote",
    "QUEUED",
    "Rec",
    "recover",
    "release",
    "RELEASE",
    "release_parent",
    "removable",
    "replaceable",
    "request_cancel",
    "retryable",
    "settle",
    "settled_before",
    "SettleKind",
    "stalled_error",
    "start",
    "STATE_KINDS",
    "TERMINAL_KINDS",
    "TransitionError",
    "TRANSITIONS",
    "ttl_update_status",
    "UNCOUNTED",
    "WAITING_CHILDREN",
    "WAITING_SIGNAL",
    "WaitSignal",
    "waiting_state",
    "signal_state",
    "signal",
    "signal_wakes",
    "park_signal",
]

# -- the state grammar -------------------------------------------------------------------

QUEUED: Final = "queued"
PROCESSING: Final = "processing"
FAILING: Final = "failing"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
DELAYED: Final = "delayed"
WAITING_CHILDREN: Final = "waiting_children"  # a parent whose children are not all terminal
WAITING_SIGNAL: Final = "waiting_signal"  # a job waiting for a signal (``Job.wait_for_signal``)

# Every state kind, in the order ``counts()`` reports them; the terminal ones may be purged.
STATE_KINDS = (QUEUED, DELAYED, PROCESSING, FAILING, COMPLETED, FAILED, CANCELLED, WAITING_CHILDREN, WAITING_SIGNAL)
TERMINAL_KINDS = (COMPLETED, FAILED, CANCELLED)
ACTIVE_KINDS = tuple(k for k in STATE_KINDS if k not in TERMINAL_KINDS)
# The kinds a cancel ends at once (a processing job gets a cancel request instead).
CANCELLABLE = (QUEUED, DELAYED, FAILING, WAITING_CHILDREN, WAITING_SIGNAL)

# The field each kind's state string carries after ``<kind>:<ms>`` (``None``: none):
# ``processing:<ms>:<worker id>``, ``failing:<ms>:<attempts>``, ``delayed:<ms>:<due ms>``.
KIND_FIELDS: dict[str, str | None] = {
    QUEUED: None,
    DELAYED: "due_ms",
    PROCESSING: "worker",
    FAILING: "attempts",
    COMPLETED: None,
    FAILED: None,
    CANCELLED: None,
    WAITING_CHILDREN: None,
    WAITING_SIGNAL: None,
}


def waiting_state(ms: int) -> str:
    """The state string of a parent waiting for its children."""
    return f"{WAITING_CHILDREN}:{ms}"


def signal_state(ms: int) -> str:
    """The state string of a job waiting for a signal."""
    return f"{WAITING_SIGNAL}:{ms}"


def format_job_state(kind: str, ms: int, extra: str | int | None = None) -> str:
    """A state string (``format_state``, the Rust codec, and the kinds Python owns:
    ``waiting_children:<ms>``, ``waiting_signal:<ms>``)."""
    if kind == WAITING_CHILDREN:
        return waiting_state(ms)
    if kind == WAITING_SIGNAL:
        return signal_state(ms)
    return format_state(kind, ms, extra)


def parse_job_state(state: str) -> tuple[str, int, str | int | None]:
    """``parse_state`` (the Rust codec) that also reads ``waiting_children:<ms>`` and
    ``waiting_signal:<ms>``."""
    if state.startswith("waiting_"):
        if state.startswith("waiting_children:"):
            return WAITING_CHILDREN, int(state[17:]), None
        if state.startswith("waiting_signal:"):
            return WAITING_SIGNAL, int(state[15:]), None
    return parse_state(state)


# -- settlements -------------------------------------------------------------------------


class SettleKind(StrEnum):
    COMPLETE = "complete"  # store result, state completed, notify
    FAIL = "fail"  # store error, state failed, notify
    RETRY = "retry"  # state failing, back to the ready list after ``delay``
    CANCEL = "cancel"  # the handler was cancelled on request: state cancelled, notify
    # the handler raised RateLimited: back as ``delayed`` for ``delay`` without counting
    # the attempt, and claims of the whole queue pause for ``delay`` (publishes
    # ``rate_limited``)
    RATE_LIMITED = "rate_limited"
    # the handler raised WaitForChildren: state ``waiting_children`` without counting the
    # attempt, queued again once every child is terminal (at once if none is pending)
    WAIT_CHILDREN = "wait_children"
    # the handler went to sleep (``Job.sleep``): back as ``delayed`` for ``delay`` without
    # counting the attempt, as ``RATE_LIMITED`` but the queue's claims go on (publishes
    # ``sleeping``)
    SLEEP = "sleep"
    # the handler waits for a signal (``Job.wait_for_signal``): state ``waiting_signal``
    # without counting the attempt, queued again once the signal arrives (at once if it
    # has), or once its deadline passes; ``data`` is :meth:`WaitSignal.encode`
    WAIT_SIGNAL = "wait_signal"


# put the job back
BACK = (SettleKind.RETRY, SettleKind.RATE_LIMITED, SettleKind.WAIT_CHILDREN, SettleKind.SLEEP, SettleKind.WAIT_SIGNAL)
# their attempt did not happen
UNCOUNTED = (SettleKind.RATE_LIMITED, SettleKind.WAIT_CHILDREN, SettleKind.SLEEP, SettleKind.WAIT_SIGNAL)
# the ends of a run that a child failed under ``cancel`` turns into the parent's failure
# (a wait for a signal too: a message could change nothing)
ENDS_BY_CHILDREN = (SettleKind.COMPLETE, SettleKind.RETRY, SettleKind.RATE_LIMITED, SettleKind.SLEEP, SettleKind.WAIT_SIGNAL)
# the settlements count-based retention (``Settlement.keep``) applies to: the kind they enter
KEPT = {SettleKind.COMPLETE: COMPLETED, SettleKind.FAIL: FAILED}

# -- the transition table ----------------------------------------------------------------

#: step -> {kind before (``None``: no record) -> the kinds the step may leave it in}.
#: Every function below that changes a record's kind checks its move against this table
#: (:class:`TransitionError` otherwise): a backend cannot take a job where the lifecycle
#: does not go.
TRANSITIONS: dict[str, dict[str | None, tuple[str, ...]]] = {
    # a new incarnation: no record, or a cancelled one (anything else is a duplicate)
    "enqueue": {None: (QUEUED, DELAYED, WAITING_CHILDREN), CANCELLED: (QUEUED, DELAYED, WAITING_CHILDREN)},
    "claim": {QUEUED: (PROCESSING,)},
    # a reserved claim starts (processing), or goes: cancelled on request, back when paused
    "start": {PROCESSING: (PROCESSING, CANCELLED, QUEUED)},
    "settle": {PROCESSING: (COMPLETED, FAILED, FAILING, DELAYED, WAITING_CHILDREN, WAITING_SIGNAL, CANCELLED, QUEUED)},
    "release": {PROCESSING: (QUEUED, CANCELLED, FAILED)},
    # the reaper: a stalled claim goes back, fails (attempts used up), or ends cancelled
    "recover": {PROCESSING: (QUEUED, FAILED, CANCELLED)},
    # a due retry or delayed job, or a job waiting for a signal whose deadline passed
    "promote": {FAILING: (QUEUED,), DELAYED: (QUEUED,), WAITING_SIGNAL: (QUEUED,)},
    # a cancel: at once unless processing (that one gets a cancel request, and stays)
    "cancel": {QUEUED: (CANCELLED,), DELAYED: (CANCELLED,), FAILING: (CANCELLED,), WAITING_CHILDREN: (CANCELLED,),
               WAITING_SIGNAL: (CANCELLED,), PROCESSING: (PROCESSING,)},  # fmt: skip
    # the signal a waiting job waits for arrived: queued again
    "signal": {WAITING_SIGNAL: (QUEUED,)},
    # every child of a waiting parent ended: queued again for its next run
    "release_parent": {WAITING_CHILDREN: (QUEUED,)},
    # a child failed under ``cancel``: the parent fails (waiting for its children or for a
    # signal, or back for a run of its own)
    "fail_by_children": {WAITING_CHILDREN: (FAILED,), QUEUED: (FAILED,), FAILING: (FAILED,), DELAYED: (FAILED,),
                         WAITING_SIGNAL: (FAILED,)},  # fmt: skip
    # an ancestor failed or was cancelled: a parent about to be released or failed by its
    # children is cancelled instead (the cascade on its way would cancel it)
    "cancel_by_ancestor": {WAITING_CHILDREN: (CANCELLED,), QUEUED: (CANCELLED,), FAILING: (CANCELLED,), DELAYED: (CANCELLED,),
                           WAITING_SIGNAL: (CANCELLED,)},  # fmt: skip
    # retry_job: a failed or cancelled job runs again (a new incarnation)
    "retry_job": {FAILED: (QUEUED,), CANCELLED: (QUEUED,)},
}

_ALLOWED = frozenset((step, old, new) for step, table in TRANSITIONS.items() for old, news in table.items() for new in news)


def _sources(step: str, new: str) -> frozenset[str | None]:
    """The kinds from which ``step`` may take a job to ``new``: the table, read once for
    the inline checks of the per-job steps (:func:`claim`, :func:`complete`)."""
    return frozenset(old for old, news in TRANSITIONS[step].items() if new in news)


_CLAIMABLE = _sources("claim", PROCESSING)
_STARTABLE = frozenset(TRANSITIONS["start"])
_COMPLETABLE = _sources("settle", COMPLETED)


class TransitionError(ValueError):
    """A step tried to move a job where the lifecycle does not go (a backend's bug)."""


def _expect(r: Rec, step: str) -> None:
    """Refuse (before changing anything) a step the job's kind does not allow."""
    if r.kind not in TRANSITIONS[step]:
        allowed = ", ".join(str(k) for k in TRANSITIONS[step])
        raise TransitionError(f"job {r.id!r}: {step} of a {r.kind} job (allowed from: {allowed})")


def _move(r: Rec, step: str, new: str) -> None:
    if (step, r.kind, new) not in _ALLOWED:
        allowed = ", ".join(TRANSITIONS.get(step, {}).get(r.kind, ())) or "nothing"
        raise TransitionError(f"job {r.id!r}: {step} may not take a {r.kind} job to {new} (allowed: {allowed})")
    r.kind = new


def _refuse(r: Rec, step: str, new: str) -> NoReturn:
    """The :class:`TransitionError` of a move the table does not allow (the hot paths,
    :func:`claim` and :func:`complete`, check the table inline and call this to refuse):
    the step's own refusal (:func:`_expect`) where the kind allows no such step."""
    _expect(r, step)
    _move(r, step, new)
    raise AssertionError("unreachable: the move was refused")  # pragma: no cover


# -- the record --------------------------------------------------------------------------


class Rec:
    """A job's registry record: what the lifecycle reads and changes.

    ``ts``: when (ms) it entered its kind; ``created``: when (ms) this incarnation was
    enqueued; ``exp``: when (seconds) it is forgotten (``None``: not while it lives, or
    while its parent may read it); ``lease``: a processing job's lease deadline
    (seconds); ``token``: the incarnation; ``claim``: the current (or last settled)
    claim's token, ``claims`` how many this incarnation had; ``started``: the current
    claim's attempt is counted; ``parent``: a child's parent ``(queue, id)``;
    ``children``: a parent's children ``(queue, id)``, ``policy`` its
    ``on_child_failure`` (and of its dependencies); ``deps``: the jobs ``(queue, id)`` it
    depends on (``depends_on``); ``dependents``: the jobs that depend on it;
    ``group``: its group (``None``: none)."""

    __slots__ = (
        "id",
        "kind",
        "ts",
        "worker",
        "attempts",
        "max_attempts",
        "result_ttl",
        "created",
        "exp",
        "envelope",
        "result",
        "error",
        "lease",
        "token",
        "claim",
        "claims",
        "started",
        "progress",
        "steps",
        "signals",
        "wait",
        "cancel_requested",
        "priority",
        "parent",
        "children",
        "policy",
        "group",
        "deps",
        "dependents",
    )

    def __init__(
        self,
        id: str,
        kind: str,
        ts: int,
        attempts: int,
        max_attempts: int,
        result_ttl: float,
        created: int,
        envelope: bytes,
        token: str = "",
        priority: int = DEFAULT_PRIORITY,
        group: str | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.ts = ts
        self.worker: str | None = None
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.result_ttl = result_ttl
        self.created = created
        self.exp: float | None = None
        self.envelope = envelope
        self.result: bytes | None = None
        self.error: bytes | None = None
        self.lease: float | None = None
        self.token = token
        self.claim: str | None = None
        self.claims = 0
        self.started = False
        self.progress: bytes | None = None
        self.steps: bytes | None = None  # its stored steps (``_steps``): a new record has none
        self.signals: bytes | None = None  # its mailbox (``_steps.encode_step`` entries): a new record has none
        self.wait: tuple[str, int] | None = None  # waiting_signal: (the name, the messages on it needed)
        self.cancel_requested = False
        self.priority = priority
        self.parent: tuple[str, str] | None = None
        self.children: list[tuple[str, str]] | None = None
        self.policy = "cancel"
        self.group = group
        self.deps: list[tuple[str, str]] | None = None
        self.dependents: list[tuple[str, str]] | None = None

    def state(self, due_ms: int | None = None) -> str:
        """Its state string (``due_ms``: a delayed or failing job's due time, which the
        backend keeps where it files the record)."""
        kind = self.kind
        if kind == PROCESSING:
            return format_state(PROCESSING, self.ts, self.worker)
        if kind == FAILING:
            return format_state(FAILING, self.ts, self.attempts)
        if kind == DELAYED:
            return format_state(DELAYED, self.ts, self.ts if due_ms is None else due_ms)
        if kind == WAITING_CHILDREN:
            return waiting_state(self.ts)
        if kind == WAITING_SIGNAL:
            return signal_state(self.ts)
        return format_state(kind, self.ts)


def in_tree(r: Rec) -> bool:
    """Whether ``r`` is a job of a tree (a child, a parent, a dependency or a dependent):
    its record goes by its TTL only, never counted out by ``Settlement.keep`` while its
    tree (or a dependent) may need it."""
    return r.parent is not None or r.children is not None or r.dependents is not None or r.deps is not None


def is_expired(r: Rec, now: float) -> bool:
    return r.exp is not None and r.exp <= now


# -- enqueue -----------------------------------------------------------------------------


def replaceable(r: Rec | None) -> bool:
    """Whether an enqueue of an id whose record is ``r`` (``None``: none, or forgotten)
    makes a new incarnation; otherwise it is a duplicate (see :func:`existing_outcome`)."""
    return r is None or r.kind == CANCELLED


def enqueue_kind(run_at: float | None, now: float) -> str:
    """The kind a new job enters: delayed until ``run_at`` if that is still to come."""
    return DELAYED if run_at is not None and run_at > now else QUEUED


def existing_outcome(r: Rec) -> bytes | None:
    """An enqueue of an id that exists (not :func:`replaceable`): the cached result when
    the job completed with one (the outcome ``completed``), else ``None`` (``duplicate``)."""
    return r.result if r.kind == COMPLETED else None


# -- claims ------------------------------------------------------------------------------


def claim(r: Rec, worker_id: str, now_ms: int, deadline: float, start: bool) -> int:
    """A queued job claimed by ``worker_id`` until ``deadline``: its new claim token is
    ``<incarnation>.<n>``; ``start``: its attempt is counted now (else by :func:`start`,
    a *reserved* claim). Returns the attempt's number (1-based) either way."""
    if r.kind not in _CLAIMABLE:  # (the table, checked inline: once a job)
        _refuse(r, "claim", PROCESSING)
    r.kind = PROCESSING
    r.ts = now_ms
    r.worker = worker_id
    n = r.claims = r.claims + 1
    r.claim = f"{r.token}.{n}"
    r.lease = deadline
    r.started = start
    if start:
        r.attempts += 1
        return r.attempts
    return r.attempts + 1


def start(r: Rec, paused: bool, now: float) -> str:
    """A held claim's handler is about to run: ``run`` (its attempt counted now, if it
    was reserved); ``cancelled`` (a reserved claim of a job with a cancel request ends
    cancelled); ``back`` (the queue is paused: a reserved claim goes back to the front of
    its lane, its attempt never counted). The caller files the record and drops its
    claim unless ``run``."""
    if r.kind not in _STARTABLE:  # (_expect, inline: once a job)
        _expect(r, "start")
    if not r.started:
        if r.cancel_requested:
            cancel_claimed(r, now, step="start")
            return CANCELLED
        if paused:
            release(r, now, False, step="start")
            return "back"
        r.started = True
        r.attempts += 1
    return "run"


def cancel_claimed(r: Rec, now: float, step: str = "settle") -> None:
    """End a claimed job as cancelled (a cancel settlement, a cancel request met by a
    release, a start or the reaper)."""
    _move(r, step, CANCELLED)
    r.ts = int(now * 1000)
    r.worker = None
    r.lease = None
    r.started = False
    r.exp = now + r.result_ttl


def release(r: Rec, now: float, refund: bool, worker_id: str = "", step: str = "release") -> str:
    """A held job handed back by its worker ``worker_id``: ``queued`` again (the caller
    puts it before everything else of its lane), ``cancelled`` if it has a cancel
    request, or ``failed`` (``StalledJobError``, as the reaper's recovery of it) if it is
    a started claim that used its last attempt and no ``refund`` is given: its handler
    may have run, and no job runs more than ``max_attempts`` attempts. ``refund``: a
    started claim's attempt is taken back (its handler never ran)."""
    _expect(r, step)
    if r.cancel_requested and step == "release":
        cancel_claimed(r, now, step)
        return CANCELLED
    if step == "release" and not refund and r.started and r.attempts >= r.max_attempts:
        _move(r, step, FAILED)
        r.ts = int(now * 1000)
        r.worker = None
        r.lease = None
        r.claim = None
        r.error = encode_error(stalled_error(r.id, worker_id, r.attempts))
        r.exp = now + r.result_ttl
        return FAILED
    _move(r, step, QUEUED)
    r.ts = int(now * 1000)
    r.worker = None
    r.lease = None
    if refund:
        r.attempts -= r.started
    r.started = False
    r.claim = None
    return QUEUED


def settled_before(r: Rec | None, token: str) -> bool:
    """Whether a settlement of claim ``token`` that the job no longer holds was already
    made by that very claim (a retried call: answered True, nothing changes); otherwise
    it is fenced."""
    return r is not None and r.claim == token and r.kind != PROCESSING


def failed_by_children(policy: str, failed: bool) -> bool:
    """Whether a held parent whose child ``failed`` (or was cancelled, or is gone) fails
    whatever its run ends with (but a failure of its own, or a cancel): under ``cancel``,
    as waiting for its children would. A run cut short after ``add_children`` (a crash, a
    forced stop) runs again once its children ended: it must not complete."""
    return failed and policy == "cancel"


# The event each settled kind publishes (``None``: none of its own; a parent left waiting
# is announced by its release or its failure; a job that waits for a signal by
# ``waiting_signal``, as a sleep by ``sleeping``).
_SETTLED_EVENT = {COMPLETED: "completed", FAILED: "failed", CANCELLED: "cancelled", FAILING: "failing",
                  DELAYED: "rate_limited", WAITING_CHILDREN: None, WAITING_SIGNAL: "waiting_signal",
                  QUEUED: "requeued"}  # fmt: skip


def settle(
    r: Rec, kind: SettleKind, data: bytes, now: float, ttl: float = 0.0, by_children: bool = False
) -> str | None:
    """The end of the held claim's attempt (fencing is the caller's: ``r`` is held by the
    settling claim). Counts the attempt (a reserved claim's too; not a rate-limited or
    waiting or sleeping one's), stores the result or error, and moves the job: ``completed``,
    ``failed`` (both kept ``ttl`` seconds), ``failing`` (a retry: the caller files it
    due after the retry delay), ``delayed`` (rate limited: the same, and claims of the
    queue pause; asleep: the same, event ``sleeping``), ``waiting_children`` (the tree
    decides next: :func:`parent_verdict`), ``waiting_signal`` (event ``waiting_signal``;
    the caller files it due at the wait's deadline, if any) or ``queued`` (a wait for a signal that has arrived: the
    caller queues it), or ``cancelled`` (a cancel, or a cancel request met by anything that would put it
    back). ``by_children``: :func:`failed_by_children` (the run's end becomes waiting,
    which fails it). Returns the event kind to publish (``None``: none yet)."""
    _expect(r, "settle")
    if kind in UNCOUNTED:
        r.attempts -= r.started  # rate limited, or waiting: the attempt did not happen
    elif not r.started and kind is not SettleKind.CANCEL:
        r.attempts += 1  # settled without start(): the attempt happened
    if by_children and kind in ENDS_BY_CHILDREN:
        kind = SettleKind.WAIT_CHILDREN
    if kind is SettleKind.CANCEL or (kind in BACK and r.cancel_requested):
        cancel_claimed(r, now)
        return "cancelled"
    r.ts = int(now * 1000)
    r.worker = None
    r.lease = None
    if kind is SettleKind.COMPLETE:
        _move(r, "settle", COMPLETED)
        r.result = data
        r.exp = now + ttl
    elif kind is SettleKind.FAIL:
        _move(r, "settle", FAILED)
        r.error = data
        r.exp = now + ttl
    elif kind is SettleKind.WAIT_CHILDREN:
        _move(r, "settle", WAITING_CHILDREN)
        r.started = False
    elif kind is SettleKind.WAIT_SIGNAL:
        park_signal(r, WaitSignal.decode(data))
    elif kind is SettleKind.RATE_LIMITED:
        _move(r, "settle", DELAYED)
    elif kind is SettleKind.SLEEP:
        _move(r, "settle", DELAYED)
        return "sleeping"
    else:
        _move(r, "settle", FAILING)
        r.error = data
    return _SETTLED_EVENT[r.kind]


def complete(r: Rec, data: bytes, now: float, now_ms: int, ttl: float) -> None:
    """:func:`settle` ``complete`` of a held job outside a tree with no cancel request:
    the common case, with the clock read once per call by the caller."""
    if r.kind not in _COMPLETABLE:  # (the table, checked inline: once a job)
        _refuse(r, "settle", COMPLETED)
    if not r.started:
        r.attempts += 1
    r.kind = COMPLETED
    r.ts = now_ms
    r.worker = None
    r.lease = None
    r.result = data
    r.exp = now + ttl


# -- the reaper --------------------------------------------------------------------------


def stalled_error(job_id: str, worker_id: str, attempts: int) -> JobError:
    return JobError(
        "StalledJobError",
        f"job {job_id!r} stalled on worker {worker_id!r} (lease expired or worker died) "
        f"and has used all {attempts} attempts",
    )


def recover(r: Rec, now: float, worker_id: str) -> str:
    """A processing job whose lease ran out or whose worker died: ``cancelled`` (it had a
    cancel request), ``requeued`` (a reserved claim never ran: back at no cost; or
    attempts are left) or ``failed`` (``StalledJobError``: every attempt used). The claim
    is gone either way (a late settlement of it is fenced)."""
    _expect(r, "recover")
    r.worker = None
    r.lease = None
    r.claim = None
    r.ts = int(now * 1000)
    if r.cancel_requested:
        cancel_claimed(r, now, "recover")
        return "cancelled"
    if not r.started or r.attempts < r.max_attempts:
        _move(r, "recover", QUEUED)
        r.started = False
        return "requeued"
    _move(r, "recover", FAILED)
    r.error = encode_error(stalled_error(r.id, worker_id, r.attempts))
    r.exp = now + r.result_ttl
    return "failed"


def promote(r: Rec, now_ms: int) -> str:
    """A due retry (``failing``) or delayed job, or a job waiting for a signal whose
    deadline passed, is queued: the event to publish."""
    _expect(r, "promote")
    event = "requeued" if r.kind == FAILING else "promoted"
    _move(r, "promote", QUEUED)
    r.ts = now_ms
    r.wait = None
    return event


# -- cancel ------------------------------------------------------------------------------


def cancel(r: Rec | None, now: float) -> tuple[CancelStatus, str | None]:
    """A cancel of the job whose record is ``r``: its status, and the event to publish
    (``cancelled``: it ended now, kept ``result_ttl`` seconds; ``cancel_requested``: it
    runs, and its worker is asked to stop; ``None``: nothing changed). The tree's side
    (its children cancelled, its parent re-evaluated) is the caller's."""
    if r is None:
        return CancelStatus.NOT_FOUND, None
    if r.kind in CANCELLABLE:
        _move(r, "cancel", CANCELLED)
        r.ts = int(now * 1000)
        r.worker = None
        r.lease = None
        r.wait = None
        r.exp = now + r.result_ttl
        return CancelStatus.CANCELLED, "cancelled"
    if r.kind == CANCELLED:
        return CancelStatus.CANCELLED, None
    if r.kind == PROCESSING:
        if r.cancel_requested:
            return CancelStatus.CANCELLED, None
        r.cancel_requested = True
        return CancelStatus.CANCELLED, "cancel_requested"
    return CancelStatus(r.kind), None


def request_cancel(r: Rec) -> bool:
    """A cancel request reaches a processing job (a cascade): whether it is new."""
    if r.cancel_requested:
        return False
    r.cancel_requested = True
    return True


# -- trees -------------------------------------------------------------------------------

NOTHING: Final = "nothing"
CANCEL_CHILDREN: Final = "cancel_children"
FAIL: Final = "fail"
RELEASE: Final = "release"


def parent_verdict(
    kind: str, policy: str, failed: bool, pending: int, cancel_requested: bool = False, ancestor_ended: bool = False
) -> str:
    """What a parent does, given its kind, its ``on_child_failure`` ``policy``, whether a
    child of it ``failed`` (failed, was cancelled, or is gone), how many are ``pending``
    (not terminal), whether it has a cancel request, and whether an ancestor of it failed
    or was cancelled (a cascade is on its way):

    - ``cancel_children``: it runs and a child failed under ``cancel`` (it fails when its
      run ends: :func:`failed_by_children`), or it has a cancel request: its children
      that have not ended are cancelled;
    - ``fail``: it waits (for its children or for a signal, or is back for a run of its
      own) and a child failed under ``cancel``: it fails with ``ChildJobFailedError``
      (:func:`fail_by_children`);
    - ``release``: it waits and no child is pending: queued again (:func:`release_parent`);
    - ``cancelled``: instead of ``fail`` or ``release`` when an ancestor ended (released,
      it could run after its root's cancel; failed, it would end otherwise than the
      cascade on its way says: :func:`cancel_by_ancestor`);
    - ``nothing``.

    A parent that ended is not here: its end cancels its children unless it completed
    (:func:`ended_cancels_children`)."""
    failing = failed_by_children(policy, failed)
    if kind == PROCESSING:
        return CANCEL_CHILDREN if failing or cancel_requested else NOTHING
    if kind in (QUEUED, FAILING, DELAYED, WAITING_SIGNAL):
        return (CANCELLED if ancestor_ended else FAIL) if failing else NOTHING
    if kind != WAITING_CHILDREN:
        return NOTHING
    if failing:
        return CANCELLED if ancestor_ended else FAIL
    if pending:
        return NOTHING
    return CANCELLED if ancestor_ended else RELEASE


def ended_cancels_children(kind: str) -> bool:
    """A parent that ended ``kind``: none of its children may run on unless it completed."""
    return kind != COMPLETED


def release_parent(r: Rec, now_ms: int) -> None:
    """Every child of a waiting parent ended: queued again (event ``promoted``)."""
    _move(r, "release_parent", QUEUED)
    r.ts = now_ms


def fail_by_children(r: Rec, failures: list[tuple[str, bytes]], now: float) -> None:
    """A parent fails because of its children ``(id, stored error)`` (event ``failed``)."""
    _move(r, "fail_by_children", FAILED)
    r.ts = int(now * 1000)
    r.worker = None
    r.lease = None
    r.wait = None
    r.error = child_failed_error(r.id, failures)
    r.exp = now + r.result_ttl


def cancel_by_ancestor(r: Rec, now: float) -> None:
    """A parent about to be released or failed by its children, whose ancestor failed or
    was cancelled (event ``cancelled``)."""
    _move(r, "cancel_by_ancestor", CANCELLED)
    r.ts = int(now * 1000)
    r.wait = None
    r.exp = now + r.result_ttl


def child_failed_error(job_id: str, failures: list[tuple[str, bytes]]) -> bytes:
    """The stored error of a parent failed by its children (``ChildJobFailedError``),
    listing each failed child's ``(id, stored error)`` (empty: cancelled, or gone)."""
    errors = {cid: decode_error(data) if data else JobError("JobCancelledError", f"job {cid!r} was cancelled") for cid, data in failures}
    message = f"job {job_id!r} failed because of its children: " + "; ".join(
        f"{cid}: {e.type}: {e.message}" for cid, e in errors.items()
    )
    # The traceback field lists the children's errors as JSON (ChildJobFailedError.errors).
    listed = json.dumps({cid: {"type": e.type, "message": e.message} for cid, e in errors.items()})
    return encode_error(JobError("ChildJobFailedError", message, listed))


# -- debounce ----------------------------------------------------------------------------


def debounces(r: Rec | None) -> bool:
    """Whether a debounced enqueue updates the job whose record is ``r`` (it has not been
    claimed yet) rather than enqueueing a new one. A job that ran and is back ``delayed``
    or ``queued`` (asleep, rate limited, woken, recovered...) is in the middle of its
    durable run: not debounced (the enqueue is a duplicate), as one that waits for a
    signal or runs."""
    return r is not None and r.kind in (DELAYED, QUEUED) and r.claims == 0


def debounce_delay(delay: float, max_wait: float | None) -> float:
    """The delay of a debounced job enqueued afresh."""
    return min(delay, max_wait or delay)


def debounce(r: Rec, envelope: bytes, max_attempts: int, result_ttl: float, now: float, delay: float,
             max_wait: float | None) -> float | None:  # fmt: skip
    """A debounced enqueue meets its job not yet claimed: it takes the new envelope and
    settings; a delayed one is due ``delay`` from now, but no later than ``max_wait``
    after it was first enqueued. Returns its new due time (``None``: queued already)."""
    r.envelope, r.max_attempts, r.result_ttl = envelope, max_attempts, result_ttl
    if r.kind != DELAYED:
        return None
    return debounce_run_at(now, delay, max_wait, r.created)


def debounce_run_at(now: float, delay: float, max_wait: float | None, created_ms: int) -> float:
    run_at = now + delay
    return run_at if max_wait is None else min(run_at, created_ms / 1000 + max_wait)


# -- retention ---------------------------------------------------------------------------


def ttl_update_status(kind: str | None, result: bytes | None, error: bytes | None) -> UpdateTTLStatus | None:
    """The refusal :meth:`Storage.update_result_ttl` returns for a job in state ``kind``
    (``None``: unknown id), or ``None`` when the TTL may be updated."""
    if kind is None:
        return UpdateTTLStatus.NOT_FOUND
    if kind == CANCELLED:
        return None
    if kind not in (COMPLETED, FAILED):
        return UpdateTTLStatus.NOT_TERMINAL
    if (result if kind == COMPLETED else error) is None:
        return UpdateTTLStatus.MISSING_PAYLOAD
    return None


def retryable(r: Rec | None) -> bool:
    """Whether ``retry_job`` runs the job again (a new incarnation): failed or cancelled."""
    return r is not None and r.kind in (FAILED, CANCELLED)


# -- steps -------------------------------------------------------------------------------


def retried_steps(old: Rec, reset_steps: bool) -> bytes | None:
    """The steps a job run again by ``retry_job`` starts with: those of the incarnation
    it replaces (it resumes after the last one saved), none when ``reset_steps``. Every
    other new incarnation of an id (enqueued after the old one was forgotten or
    cancelled, a tree's job written over a cancelled one) is a new record: no steps."""
    return None if reset_steps else old.steps


def save_step(r: Rec | None, worker_id: str, token: str, entry: bytes) -> bool:
    """Append the stored step ``entry`` (``_steps.encode_step``) to the steps of ``r`` if
    ``worker_id`` holds it under claim ``token`` (the fence of ``Steps.save_step``)."""
    if r is None or r.kind != PROCESSING or r.worker != worker_id or r.claim != token:
        return False
    r.steps = entry if r.steps is None else r.steps + entry
    return True


def removable(r: Rec | None) -> bool:
    """Whether ``remove_job`` forgets the job: any but a processing one."""
    return r is not None and r.kind != PROCESSING


# -- signals -----------------------------------------------------------------------------


class WaitSignal(NamedTuple):
    """What a run waiting for a signal settles with (:attr:`SettleKind.WAIT_SIGNAL`, its
    ``data``: :meth:`encode`): the signal's ``name``, how many messages on it the job
    must have to run again (``needed``: the k-th wait on a name takes the k-th message),
    and its ``deadline_ms`` (epoch ms; ``None``: none), after which it runs again anyway."""

    name: str
    needed: int
    deadline_ms: int | None = None

    def encode(self) -> bytes:
        """The settlement's ``data``: JSON ``[name, needed, deadline_ms]`` (read by the
        Redis script as it is)."""
        return json.dumps([self.name, self.needed, self.deadline_ms], separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> WaitSignal:
        name, count, deadline = json.loads(data)
        return cls(str(name), int(count), None if deadline is None else int(deadline))


def count_signals(mailbox: bytes | None, name: str) -> int:
    """How many messages on ``name`` the mailbox ``mailbox`` holds."""
    return sum(1 for n, _ in decode_signals(mailbox) if n == name)


def park_signal(r: Rec, wait: WaitSignal) -> None:
    """The held job settles waiting for ``wait`` (the rest of :func:`settle`): queued
    again at once when it has the messages already (a signal raced with the settlement),
    else ``waiting_signal`` (``r.wait`` says for what; the caller files it due at the
    deadline). Its attempt was not counted."""
    r.started = False
    if count_signals(r.signals, wait.name) >= wait.needed:
        _move(r, "settle", QUEUED)
        r.wait = None
    else:
        _move(r, "settle", WAITING_SIGNAL)
        r.wait = (wait.name, wait.needed)


def signal_wakes(r: Rec) -> bool:
    """Whether the waiting ``r`` has the messages it waits for now."""
    return r.kind == WAITING_SIGNAL and r.wait is not None and count_signals(r.signals, r.wait[0]) >= r.wait[1]


def signal(r: Rec | None, entry: bytes, now_ms: int) -> str:
    """A signal (``entry``: its name and payload, ``_steps.encode_step``) sent to the job
    whose record is ``r``: ``not_found`` (no record, or a terminal one: nothing stored),
    else appended to its mailbox: ``woken`` when it waited for it (now queued: the caller
    puts it in its lane and wakes the claims), ``delivered`` otherwise."""
    if r is None or r.kind in TERMINAL_KINDS:
        return "not_found"
    r.signals = entry if r.signals is None else r.signals + entry
    if not signal_wakes(r):
        return "delivered"
    _move(r, "signal", QUEUED)
    r.ts = now_ms
    r.wait = None
    return "woken"
