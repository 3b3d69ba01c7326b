"""Storage capabilities: what a backend may have or not, beyond the core :class:`Storage`.

Each capability is an abstract class that extends :class:`Storage` with the methods of one
feature; a backend lists the capabilities it has among its bases (``class
MemoryStorage(..., Trees, Schedules, Groups, ...)``), and code that needs one checks
``isinstance(storage, Groups)`` (or :func:`require`, which raises a
:class:`~trioqueue.ValidationError` naming the backend and the capability). There are no
``supports_*`` flags: the type says it. The conformance suite runs each capability's
tests on every backend that has it (``@pytest.mark.capability(Groups)``) and skips the
others.

Every method's docstring ends with its atomicity and fencing promise, as the core's do
(see :mod:`trioqueue.storage._base`).

Which backend has which:

============================ ====== ==== ===== ==========
capability                   memory file redis postgres
============================ ====== ==== ===== ==========
:class:`Trees`               yes    yes  yes   yes
:class:`Schedules`           yes    yes  yes   yes
:class:`Groups`              yes    yes  yes   yes
:class:`Debounce`            yes    yes  yes   yes
:class:`Administration`      yes    yes  yes   yes
:class:`Transactions`                          yes
:class:`NonBlockingStart`    yes
:class:`Steps`               yes    yes  yes   yes
:class:`Signals`             yes    yes  yes   yes
============================ ====== ==== ===== ==========
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TypeVar, cast

from .._model._errors import ValidationError
from ._base import Storage, StorageEvent
from ._records import Claim, ClaimLimits, EnqueueOutcome, FlowJob, JobRecord, NewJob, Settlement

__all__ = [
    "CAPABILITIES",
    "Administration",
    "Debounce",
    "Groups",
    "NonBlockingStart",
    "Schedules",
    "Signals",
    "Steps",
    "Transactions",
    "Trees",
    "capabilities_of",
    "require",
]


class Trees(Storage):
    """Trees of jobs (flows): a parent waits for its children (:meth:`enqueue_flow`), a
    running job adds children (:meth:`add_children`), and every terminal transition of a
    child tells its parent. :meth:`cancel` of a parent cancels its descendants, and
    :meth:`clear` forgets the links. A job may also wait for existing jobs it does not own,
    its dependencies (:attr:`FlowJob.depends_on`). ``Queue.enqueue(..., children=...)``,
    ``depends_on=``, ``Queue.children`` and ``JobContext.add_children`` need it."""

    @abc.abstractmethod
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
        then for its own TTL).

        Dependencies: a job with :attr:`FlowJob.depends_on` waits (``waiting_children``,
        with or without children) until each named job is terminal. They must exist (in
        any state, on any queue of the storage; not a job of ``jobs``): an unknown one
        raises :class:`~trioqueue.FlowError` naming the job and the missing id, writing
        nothing. In the same step each dependency records the dependent (a job may have
        many) and one already terminal counts at once (the dependent may be queued or
        failed right after, as a parent is). A dependency's end then counts on each of
        its dependents as a child's end on its parent (completed: done; failed, cancelled
        or removed: a failure, under the dependent's ``policy``), by the same means. A
        dependent's end never cancels its dependencies. A terminal dependency's record
        and result are kept (neither expired by its TTL nor counted out by
        ``Settlement.keep``) until no dependent (and no parent) of it waits (a removed
        dependent no longer does), then for its own TTL. On Redis Cluster, dependencies on other queues follow the rule of trees
        across queues (a shared slot).

        Atomic: the whole tree is one step. Fenced: no (dedup by the root's id)."""

    @abc.abstractmethod
    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        """Add ``children`` (a subtree list, parents before children; direct children
        name ``(queue, job_id)`` as parent) to the processing job ``job_id`` held by
        ``worker_id`` under claim ``token``, atomically as :meth:`enqueue_flow` writes a
        tree (``FlowError`` for a known id, writing nothing). ``False`` (nothing written)
        when the claim is no longer held, and, as for a lost claim, when the job is being
        cancelled: it has a cancel request (:meth:`cancel`, or its tree's cancel cascade),
        or an ancestor ended failed or cancelled whose cascade has not reached it yet (a
        backend that cascades in steps: file, Redis). No job of a tree starts after the
        tree's cancel reached it, as a :meth:`start` of a reserved claim with a cancel
        request runs nothing; the claim itself stays held until the run settles
        (``CANCEL``). ``policy`` is the job's ``on_child_failure`` when
        these are its first children. The job is then settled with
        :attr:`SettleKind.WAIT_CHILDREN` to wait for them. Under ``cancel``, once one of
        them failed for good (or was cancelled), any later settlement of the job's runs
        that would complete it or put it back (``COMPLETE``, ``RETRY``, ``RATE_LIMITED``, ``SLEEP``:
        a run cut short before it stored ``WAIT_CHILDREN`` runs again, and finds its
        children ended) fails it as ``WAIT_CHILDREN`` would (``ChildJobFailedError``); a
        job queued, failing or delayed again then is failed at once by the failure.

        Atomic: the whole subtree is one step. Fenced: by the claim token."""

    @abc.abstractmethod
    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        """The records of a job's children, ``(queue, record)`` in the order they were
        added, then of its dependencies in the order given (those whose record expired
        or was removed, or was replaced by another incarnation of the id, are left out).

        Atomic: a read. Fenced: no."""


class Schedules(Storage):
    """Stored schedules (cron and periodic jobs): a compare-and-set registration and a
    tick that enqueues its job and records itself in one step, so a tick runs at most
    once whoever ticks it. ``Queue.schedule`` and the reaper's scheduler need it."""

    @abc.abstractmethod
    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        """Create or replace the schedule ``name`` of ``queue`` (``spec`` is opaque bytes
        made by the scheduler), atomically and only if its stored spec is still
        ``expected`` (``None``: only if there is no such schedule): a compare-and-set, so
        that concurrent registrations never overwrite each other unseen. True if written;
        False (nothing changed) otherwise. Replacing keeps its last tick.

        Atomic: one compare-and-set step. Fenced: by ``expected``."""

    @abc.abstractmethod
    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Delete a schedule (and its last tick); False if there was none.

        Atomic: one step. Fenced: no."""

    @abc.abstractmethod
    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        """Every schedule of ``queue``: ``name -> (spec, last_tick)``, ``last_tick`` in
        seconds since the epoch (``None`` before the first).

        Atomic: a read. Fenced: no."""

    @abc.abstractmethod
    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        """Run one tick of a schedule, in ONE atomic step: if the schedule exists and
        ``tick`` is later than its last tick, enqueue ``job`` exactly as :meth:`enqueue`
        does (dedup by id, ``enqueued`` event, wake-ups; ``None``: a skipped tick, nothing
        enqueued) and set the last tick to ``tick``: True. Otherwise (``tick`` not later,
        or the schedule is gone) change nothing: False. A tick thus runs at most once,
        whatever its job's result TTL and whoever else ticks the schedule.

        Atomic: the tick and its job's enqueue are one step. Fenced: by the last
        tick (a tick not later than it changes nothing)."""


class Groups(Storage):
    """Fair queuing by group (:attr:`NewJob.group`): within a priority, :meth:`dequeue`
    serves the groups with ready jobs round-robin; it enforces
    ``ClaimLimits.group_concurrency`` and ``ClaimLimits.group_rate``, and passes over a
    paused group (:meth:`set_group_paused`). ``Queue.enqueue(..., group=...)``, a Queue's
    ``group_concurrency`` and ``group_rate_limit``, and the group pauses need it."""

    @abc.abstractmethod
    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        """Pause (or resume) claiming the jobs of ``group`` on ``queue``, for every worker:
        while paused, :meth:`dequeue` passes over the group's ready jobs (other groups'
        are claimed as usual); resuming puts them back in the round-robin and wakes
        waiting claims. Returns whether the flag changed.

        Atomic: one step (the flag, the ring, its event). Fenced: no."""

    @abc.abstractmethod
    async def paused_groups(self, queue: str) -> list[str]:
        """The paused groups of ``queue``, sorted.

        Atomic: a read. Fenced: no."""

    @abc.abstractmethod
    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        """The number of ``queued`` and ``processing`` jobs of each group with any
        (``group -> {"queued": n, "processing": n}``; jobs without a group under ``""``).
        For the admin CLI (``stats --group``): it may scan the queue's active jobs.

        Atomic: a read (not a snapshot). Fenced: no."""


class Debounce(Storage):
    """Debounced enqueue: a job not yet claimed takes the newer enqueue's payload and is
    due later (``Queue.enqueue(..., debounce=...)``)."""

    @abc.abstractmethod
    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        """:meth:`enqueue` with a debounce, atomically for each job in order (storage time):

        - if the id is waiting, ``delayed`` or ``queued`` and never claimed in this
          incarnation (one that ran and is back, asleep, rate limited or recovered, is
          in the middle of its run: a duplicate, as one in ``waiting_signal``), the waiting job
          takes this job's envelope (its payload and options) and max attempts and result
          TTL, keeping its incarnation token, priority and creation time; a delayed one
          becomes due at ``now + delay``, but never later than ``created + max_wait``
          (``None``: no bound); a queued one (due already) stays queued. Answers
          ``debounced``, with the state and the token. Nothing is published but a ``due``
          notice when the due time moved earlier;
        - otherwise as :meth:`enqueue`, the new job due at ``now + delay``.

        The same id twice in one call: the second debounces the first.

        Atomic: each job's step. Fenced: no (the id picks the waiting job; a claimed
        one is never touched)."""


class Administration(Storage):
    """Operating a queue: pause and resume, inspection (:meth:`oldest`,
    :meth:`get_envelope`, :meth:`queue_names`), and retention by hand (:meth:`retry_job`,
    :meth:`purge`, :meth:`remove_job`, :meth:`clear`). The admin CLI, the dashboard's
    actions, ``Queue.pause``/``resume``/``purge``/... and the metrics' oldest-job gauge
    need it. Each backend keeps, per queue and state kind, an index of the jobs in that
    state ordered by when they entered it (the core's :meth:`list_jobs` and
    :meth:`counts` read it too)."""

    @abc.abstractmethod
    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause (or resume) claiming on ``queue`` for every worker: while paused,
        :meth:`dequeue` claims nothing (it waits, up to its timeout; running jobs are not
        touched); resuming wakes waiting claims at once. Stored in the storage, so every
        process sees it. Publishes ``paused``/``resumed`` when the flag changed; returns
        whether it changed.

        Atomic: one step (the flag and its event). Fenced: no."""

    @abc.abstractmethod
    async def is_paused(self, queue: str) -> bool:
        """Whether claiming on ``queue`` is paused.

        Atomic: a read. Fenced: no."""

    @abc.abstractmethod
    async def oldest(self, queue: str, state: str) -> float | None:
        """When the job that has been in the non-terminal state kind ``state`` (queued,
        delayed, processing, failing) the longest entered it, in seconds since the epoch
        (ms precision); ``None`` when no job is in it. ``ValueError`` for another state.
        Feeds the oldest-job-age gauge of :mod:`trioqueue.metrics`.

        Atomic: a read. Fenced: no."""

    @abc.abstractmethod
    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        """Enqueue a ``failed`` or ``cancelled`` job again with its original envelope, as a
        new incarnation ``token`` with attempts reset (``queued:<now>``, appended to the
        ready list, publishing ``enqueued``). False (nothing changed) if the job is not
        failed or cancelled (or unknown). A backend with :class:`Steps` keeps the job's
        stored steps (the run resumes after the last one saved), unless ``reset_steps``:
        then they are forgotten in the same step.

        Atomic: one step. Fenced: by the job's state (only a failed or cancelled job)."""

    @abc.abstractmethod
    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        """Forget the jobs in terminal state kind ``state`` (completed, failed, cancelled)
        that entered it more than ``older_than`` seconds ago (all when ``None``), as if
        their TTL had run out: a job kept for a parent or dependent that waits (no TTL
        runs for it, see :meth:`Trees.enqueue_flow`) is spared. Returns how many. Redis
        works in bounded slices.

        Atomic: each job's removal (a purge cut short has removed some). Fenced: by
        the state: a job that left ``state`` meanwhile stays."""

    @abc.abstractmethod
    async def remove_job(self, queue: str, job_id: str) -> bool:
        """Forget a job that is not processing: its registry entry, result/error, and its
        place in the ready list or delayed set (it will never run), publishing
        ``removed``. False (nothing changed) if the id is unknown or processing.

        Atomic: one step. Fenced: by the state: a processing job is left alone."""

    @abc.abstractmethod
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
        whose TTL had run out but that were not swept yet may be counted).

        Atomic: one step for the whole queue. Fenced: no; it fences every claim of the
        queue that was held."""

    @abc.abstractmethod
    async def queue_names(self) -> list[str]:
        """The names of the queues this storage knows (sorted): memory, the queues it has
        structures for; file, its queue directories; Redis, a set maintained by the
        producer (each process adds a queue's name once, on its first enqueue).

        Atomic: a read. Fenced: no."""

    @abc.abstractmethod
    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        """The envelope the job was enqueued with (its payload: ``decode_envelope``), or
        ``None`` if the id is unknown, expired, or its envelope is no longer kept (Redis
        drops a completed job's envelope; every backend keeps it while the job may still
        run, and for a failed or cancelled job, which can be retried). For inspection
        (the dashboard's job page); never on a hot path.

        Atomic: a read. Fenced: no."""


class Transactions(Storage):
    """Enqueue in the application's own transaction (PostgreSQL): jobs exist only if and
    when it commits. ``Queue.enqueue(..., transaction=tx)`` needs it."""

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[object]:
        """A transaction of the application's own, as an async context manager yielding
        the object to pass as ``transaction``: it commits when the block ends normally
        and rolls back when it raises or is cancelled.

        Atomic: everything written in it, jobs and the application's rows alike.
        Fenced: no."""

    @abc.abstractmethod
    async def enqueue_in_transaction(self, queue: str, jobs: Sequence[NewJob], transaction: object) -> list[EnqueueOutcome]:
        """:meth:`enqueue` inside the application's open ``transaction`` (made by the
        backend, e.g. ``PostgresStorage.transaction()``): the jobs exist, and claimers are
        woken, only if and when that transaction commits; a rollback leaves no trace.

        Atomic: with the application's transaction (all of it, or none). Fenced:
        no."""

    @abc.abstractmethod
    async def enqueue_flow_in_transaction(self, jobs: Sequence[FlowJob], transaction: object) -> EnqueueOutcome:
        """:meth:`enqueue_flow` inside the application's open ``transaction``: the whole
        tree exists (and claimers of its queues are woken) only if and when that
        transaction commits. A refused tree (:class:`~trioqueue.FlowError`) writes nothing
        and leaves the transaction usable.

        Atomic: with the application's transaction. Fenced: no."""


class NonBlockingStart(Storage):
    """A backend that needs no I/O to count a reserved claim's attempt, to store a
    settlement or to deliver its events (memory): the consumer then starts each claim
    right before its handler, with no batch and no wait; a worker about to go idle stores
    the settlements waiting to be stored itself (no trip through the scheduler to the
    settler task); a Queue's listener takes the events as they are published (no trip to
    its task before a waiter hears of its job's end)."""

    @abc.abstractmethod
    def start_nowait(self, queue: str, worker_id: str, job_id: str, token: str) -> bool:
        """:meth:`start` of one claim as a plain call, for a backend that needs no I/O for
        it (memory): the consumer then counts each reserved claim's attempt right before
        its handler, with no batch and no wait.

        Atomic: one step, as :meth:`~Storage.start`. Fenced: by the claim token."""

    @abc.abstractmethod
    def settle_nowait(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        """:meth:`~Storage.settle` as a plain call (no checkpoint), for a backend that
        needs no I/O for it (memory). Atomic and fenced as :meth:`~Storage.settle`."""

    @abc.abstractmethod
    async def dequeue_into(
        self,
        queue: str,
        worker_id: str,
        timeout: float,
        lease: float,
        limits: ClaimLimits | None,
        wanted: Callable[[], tuple[int, int] | None],
        take: Callable[[list[Claim]], None],
    ) -> None:
        """:meth:`~Storage.dequeue` whose claims go to ``take`` as a plain call, for a
        backend that needs no I/O to claim (memory). ``wanted()``, asked right before each
        claim, gives ``(max_jobs, start)`` as :meth:`~Storage.dequeue` takes them, or
        ``None`` when no claim is wanted now (the call then returns). While the call waits,
        an :meth:`~Storage.enqueue` made in the same Trio run claims for it in the
        enqueuing step and hands the claims over there (no trip through the scheduler to
        the claiming task); the call itself goes on waiting. It returns once it handed
        claims over from its own step, when ``wanted()`` says ``None``, or at ``timeout``.
        ``take`` must not raise, block or call the storage.

        Atomic and fenced as :meth:`~Storage.dequeue`: claims reach ``take`` in the step
        that made them (a cancellation never drops them)."""

    @abc.abstractmethod
    def subscribe_nowait(
        self, queue: str, kinds: Collection[str] | None, deliver: Callable[[list[StorageEvent]], None]
    ) -> AbstractContextManager[None]:
        """:meth:`~Storage.subscribe` with each batch of events handed to ``deliver`` as a
        plain call, in the Trio run that subscribed: within the publishing step when that
        run made it (``deliver`` must not raise, block or call the storage), soon after
        otherwise. The same events, in the same order, as :meth:`~Storage.subscribe`."""


class Steps(Storage):
    """Steps of a durable job (``Job.step``): the return value of each step a running job
    completes is stored with the job, fenced by its claim, so that a later run of the job
    (a retry, a recovery, ``Queue.retry``) returns it instead of running the step again.

    A job's steps live as long as its record: a new incarnation of its id (enqueued after
    it was forgotten or cancelled, a tree's job written over a cancelled one) starts with
    none; :meth:`Administration.retry_job` keeps them unless told to reset them; removing,
    purging, clearing or the expiry of the record forgets them. ``Job.step`` needs it."""

    @abc.abstractmethod
    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        """Store ``value`` (the step's return value, encoded by the result serde) as step
        ``name`` of the processing job ``job_id`` held by ``worker_id`` under claim
        ``token``, after the steps already stored. ``False`` (nothing written) when the
        claim is no longer held. The caller saves a name once per run (it read the stored
        steps first): a name stored twice keeps its first value (:meth:`get_steps`).

        Atomic: one step (one round trip on Redis and PostgreSQL). Fenced: by the claim
        token."""

    @abc.abstractmethod
    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        """The stored steps of ``job_id``, ``name -> value`` in the order they were saved
        (empty for a job without any, or an unknown id). A worker reads them once per run,
        at the job's first ``Job.step``; ``Queue.get_status`` reads them for
        :attr:`~trioqueue.JobStatus.steps`.

        Atomic: a read. Fenced: no."""


class Signals(Steps):
    """Signals to durable jobs (``Queue.signal``, ``Job.wait_for_signal``): each job has a
    *mailbox*, the messages ``(name, payload)`` sent to it in order, kept with its record
    as its steps are; a running job waits for a message by settling
    :attr:`SettleKind.WAIT_SIGNAL` (its ``data``: ``_rules.WaitSignal.encode()``: the
    name, how many messages on it the job needs, and a deadline or none), which parks it
    in ``waiting_signal`` (no slot, no lease, its attempt not counted; event
    ``waiting_signal``, or ``requeued`` when the messages had arrived: queued at once)
    until a message makes the count, or its deadline passes (then it is promoted as a
    delayed job is).

    The mailbox lives as long as the record: a new incarnation starts with an empty one;
    :meth:`Administration.retry_job` keeps it (with ``reset_steps`` too: the run starts
    over and its waits take the same messages again); removing, purging, clearing or the
    expiry of the record forgets it. ``Queue.signal`` and ``Job.wait_for_signal`` need it
    (and :class:`Steps`, which it extends: a wait's outcome is kept as a step)."""

    @abc.abstractmethod
    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        """Send the message ``(name, payload)`` to the job ``job_id``: ``"not_found"``
        (nothing written) when the id is unknown or its job is terminal; otherwise append
        it to the job's mailbox and answer ``"delivered"``. A job in ``waiting_signal``
        for ``name`` that now has the messages it waits for is queued again in the same
        step (in its lane, publishing ``promoted``, waking the claims of every process).

        Atomic: one step (the check, the append, the wake-up). Fenced: no (anyone may
        send; a terminal job refuses)."""

    @abc.abstractmethod
    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        """The mailbox of ``job_id``: ``(name, payload)`` of every message sent to it, in
        the order they were sent (empty for an unknown id).

        Atomic: a read. Fenced: no."""


#: Every capability, in the order the docs list them.
CAPABILITIES: tuple[type[Storage], ...] = (
    Trees,
    Schedules,
    Groups,
    Debounce,
    Administration,
    Transactions,
    NonBlockingStart,
    Steps,
    Signals,
)

_C = TypeVar("_C", bound=Storage)

_WHAT: dict[object, str] = {
    Trees: "trees of jobs",
    Schedules: "schedules",
    Groups: "groups",
    Debounce: "debounce",
    Administration: "administration",
    Transactions: "transactions",
    NonBlockingStart: "a start without I/O",
    Steps: "steps",
    Signals: "signals",
}


def capabilities_of(storage: Storage) -> tuple[type[Storage], ...]:
    """The capabilities ``storage`` has (of :data:`CAPABILITIES`, in that order)."""
    return tuple(cap for cap in CAPABILITIES if isinstance(storage, cap))


def require(storage: Storage, capability: Callable[..., _C], what: str) -> _C:
    """``storage`` as a ``capability`` (for the type checker too), or a
    :class:`~trioqueue.ValidationError` saying that ``what`` needs it and naming the
    backend (nothing is written)."""
    # (``Callable[..., _C]`` rather than ``type[_C]``: mypy refuses an abstract class where
    # ``type[_C]`` is expected, and every capability is abstract.)
    if isinstance(storage, cast(type, capability)):
        return cast(_C, storage)
    name = getattr(capability, "__name__", repr(capability))
    raise ValidationError(
        f"{what} needs a storage with {_WHAT.get(capability, name)} (the {name} capability), not {type(storage).__name__}"
    )
