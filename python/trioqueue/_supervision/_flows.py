"""Making the jobs a queue enqueues (:class:`JobMaker`), alone or as trees
(``children=``), and the children's counts of a tree's parent."""

from __future__ import annotations

import weakref
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import count
from typing import TYPE_CHECKING, Any

from .._core import encode_envelope
from .._model import _validate as check
from .._model._clock import now as _now
from .._model._errors import FlowError, ValidationError
from .._model._flows import Child, check_on_child_failure, dependencies, walk_tree
from .._model._options import EnqueueOptions, JobOptions, check_enqueue_options
from .._model._types import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_RESULT_TTL,
    EnqueueResult,
    EnqueueStatus,
    JobState,
    JobStatus,
)
from ..storage._base import EnqueueOutcome, FlowJob, JobRecord, NewJob, Storage, parse_job_state
from ..storage._capabilities import Debounce, Groups, Transactions, Trees, require
from ._execution import encode_failure, encode_value
from ._observers import QueueObserver, notify

if TYPE_CHECKING:
    from ._registry import JobReader
    from ._settings import JobDefaults

__all__ = ["JobMaker", "children_counts", "debounce_of", "queue_defaults", "remember_queue", "with_children"]

_new = tuple.__new__  # a NewJob per enqueued job, built as the tuple it is


# The job makers of this process's Queues, by (storage, queue name): the last one made
# for a name gives the settings of the children other queues enqueue to it (held weakly:
# a Queue no longer referenced gives none).
_QUEUES: weakref.WeakValueDictionary[tuple[int, str], JobMaker] = weakref.WeakValueDictionary()


def remember_queue(maker: JobMaker) -> None:
    """Note ``maker`` (a new Queue's) as the one whose defaults its queue's children take."""
    _QUEUES[id(maker.storage), maker.name] = maker


def queue_defaults(storage: Storage, queue: str) -> tuple[int, float]:
    """``(max_attempts, result_ttl)`` of a job enqueued to ``queue`` of ``storage``
    without options of its own: those of the last Queue made for it in this process (on
    that very storage object), else the library's defaults."""
    maker = _QUEUES.get((id(storage), queue))
    if maker is not None and maker.storage is storage:
        return maker.defaults.max_attempts, maker.defaults.result_ttl
    return DEFAULT_MAX_ATTEMPTS, DEFAULT_RESULT_TTL


class JobMaker:
    """Makes and stores the jobs a queue enqueues: validated and encoded with the queue's
    job ``defaults``, alone or as trees, debounced or in an application's transaction;
    counted to its ``observers``; an enqueue's outcome read back with its ``reader``.
    Each job gets a fresh incarnation token (a random prefix per maker, then a counter)."""

    def __init__(
        self, storage: Storage, name: str, defaults: JobDefaults, observers: list[QueueObserver], reader: JobReader
    ) -> None:
        self.storage = storage
        self.name = name
        self.defaults = defaults
        self.observers = observers
        self.reader = reader
        self._token_prefix = uuid.uuid4().hex[:12] + "-"
        self._token_seq = count(1)

    def new_job(
        self,
        job_id: Any,
        payload: Any,
        options: EnqueueOptions,
        trace: dict[str, str] | None,
        defaults: tuple[int, float] | None = None,
    ) -> NewJob:
        """A validated job to enqueue (``ValidationError`` naming the problem and the job),
        with ``defaults`` (``(max_attempts, result_ttl)``, ``None``: this queue's) where
        ``options`` give none."""
        jid = check.job_id(job_id)
        default_attempts, default_ttl = (self.defaults.max_attempts, self.defaults.result_ttl) if defaults is None else defaults
        if not options:  # the common case: the queue's settings
            run_at, prio, attempts, ttl, group = None, DEFAULT_PRIORITY, default_attempts, default_ttl, None
            stored = JobOptions.build(jid, None, None, trace=trace) if trace else None
        else:
            check_enqueue_options(dict(options), jid)
            run_at = check.run_at(options.get("delay"), options.get("at"), job=jid)
            prio = check.priority(options.get("priority", DEFAULT_PRIORITY), job=jid)
            group = options.get("group")
            if group is not None:
                group = check.group(group, job=jid)
                require(self.storage, Groups, f"job {jid!r}: group=")
            max_attempts, result_ttl = options.get("max_attempts"), options.get("result_ttl")
            attempts = default_attempts if max_attempts is None else check.positive_int("max_attempts", max_attempts, job=jid)
            ttl = default_ttl if result_ttl is None else check.seconds("result_ttl", result_ttl, job=jid)
            retry_delay, job_timeout = options.get("retry_delay"), options.get("job_timeout")
            stored = JobOptions.build(jid, retry_delay, job_timeout, run_at=run_at, trace=trace)
            check_on_child_failure(options.get("on_child_failure"), jid)
            window = options.get("dedup_window")
            if window is not None:  # the id stays known (its record kept) that long after it ended
                ttl = max(ttl, check.seconds("dedup_window", window, job=jid))
            if options.get("children") is not None:
                require(self.storage, Trees, f"job {jid!r}: children=")
            if options.get("depends_on") is not None:
                require(self.storage, Trees, f"job {jid!r}: depends_on=")
            if debounce_of(options, jid) is not None:
                if run_at is not None or options.get("children") is not None or options.get("depends_on") is not None:
                    raise ValidationError(f"debounce cannot be combined with delay, at, children or depends_on (job {jid!r})")
                require(self.storage, Debounce, f"job {jid!r}: debounce=")
        data = encode_value(self.defaults.payload_serde, payload, "payload of job", ValidationError, jid)
        envelope = encode_envelope(
            jid, data, int(_now() * 1000), 0, attempts, int(ttl * 1000), None, None if stored is None else stored.encode()
        )
        return _new(NewJob, (jid, envelope, attempts, ttl, self.new_token(), run_at, prio, group))  # (all fields)

    def new_jobs(self, jobs: Iterable[tuple[Any, Any]], options: EnqueueOptions, trace: dict[str, str] | None) -> list[NewJob]:
        """:meth:`new_job` of each ``(id, payload)`` of ``jobs`` (``enqueue_many``): with no
        options and no trace (the common case) its steps inline, one clock reading and
        the queue's settings looked up once for the batch."""
        if options or trace:
            return [self.new_job(jid, payload, options, trace) for jid, payload in jobs]
        defaults = self.defaults
        attempts, ttl = defaults.max_attempts, defaults.result_ttl
        ttl_ms = int(ttl * 1000)
        serde = defaults.payload_serde
        dumps = serde.dumps
        valid_id = check.job_id
        now_ms = int(_now() * 1000)
        prefix, seq = self._token_prefix, self._token_seq
        out: list[NewJob] = []
        append = out.append
        for job_id, payload in jobs:
            jid = valid_id(job_id)
            try:
                data = dumps(payload)
            except Exception as exc:
                raise encode_failure(serde, "payload of job", ValidationError, jid, exc) from exc
            if type(data) is not bytes and not isinstance(data, bytes):
                raise encode_failure(serde, "payload of job", ValidationError, jid, data)
            envelope = encode_envelope(jid, data, now_ms, 0, attempts, ttl_ms, None, None)
            append(_new(NewJob, (jid, envelope, attempts, ttl, f"{prefix}{next(seq):x}", None, DEFAULT_PRIORITY, None)))
        return out

    def new_token(self) -> str:
        return f"{self._token_prefix}{next(self._token_seq):x}"

    def _enqueued(self, outcomes: list[EnqueueOutcome]) -> list[EnqueueOutcome]:
        if self.observers:
            notify(self.observers, "jobs_enqueued", self.name, sum(o.status is EnqueueStatus.QUEUED for o in outcomes))
        return outcomes

    def enqueue_result(self, job_id: str, outcome: EnqueueOutcome) -> EnqueueResult:
        status = outcome.status
        if status is EnqueueStatus.QUEUED:
            return EnqueueResult(job_id, status)
        state = JobState(parse_job_state(outcome.state)[0]) if outcome.state else None
        if status is EnqueueStatus.COMPLETED:
            return EnqueueResult(job_id, status, state, self.reader.load_result(job_id, outcome.result))
        return EnqueueResult(job_id, status, state)

    # -- trees ---------------------------------------------------------------------------

    def tree(self, new: NewJob, options: EnqueueOptions, trace: dict[str, str] | None) -> list[FlowJob] | None:
        """The jobs of the tree rooted at ``new`` (``None``: no ``children`` nor
        ``depends_on`` option), all validated (:class:`FlowError` naming the job on a
        refusal, nothing written). A job with ``depends_on`` alone is a tree of one job."""
        if not options:
            return None
        children, depends_on = options.get("children"), options.get("depends_on")
        if children is None and depends_on is None:
            return None
        policy = check_on_child_failure(options.get("on_child_failure"), new.id)
        deps = () if depends_on is None else dependencies(depends_on, self.name, new.id)
        jobs = [FlowJob(self.name, new, None, policy, deps)]
        if children is not None:
            jobs += self.subtree(self.name, new.id, children, trace)
        mine = {(fj.queue, fj.job.id) for fj in jobs}
        for fj in jobs:
            for dep in fj.depends_on:
                if dep in mine:
                    raise FlowError(
                        f"job {fj.job.id!r} depends on job {dep[1]!r} of queue {dep[0]!r}, of its own tree: "
                        "a dependency must be a job that exists already"
                    )
        return jobs

    def subtree(
        self, queue: str, job_id: str, children: Sequence[Child], trace: dict[str, str] | None = None
    ) -> list[FlowJob]:
        """The jobs of ``children`` (and theirs) of job ``(queue, job_id)``, parents first."""
        jobs = []
        for parent, child in walk_tree(queue, job_id, children):
            options = dict(child.options)
            if "children" in options or "on_child_failure" in options:
                raise FlowError(f"give a Child's children and on_child_failure as its fields, not options (job {child.id!r})")
            if child.queue is not None:
                check.job_id(child.queue, "queue")
            where = child.queue or parent.queue
            depends_on = options.pop("depends_on", None)
            deps = () if depends_on is None else dependencies(depends_on, where, child.id)
            # a job of queue ``where``: its settings, not this queue's (see Child)
            defaults = None if where == self.name else queue_defaults(self.storage, where)
            new = self.new_job(child.id, child.payload, options, trace, defaults)  # type: ignore[arg-type]
            jobs.append(FlowJob(where, new, (parent.queue, parent.id), child.on_child_failure, deps))
        if not jobs:
            raise FlowError(f"children of job {job_id!r} is empty: give at least one Child, or no children option")
        return jobs

    async def store(self, new: NewJob, tree: list[FlowJob] | None, options: EnqueueOptions) -> EnqueueOutcome:
        """Enqueue ``new`` alone (debounced, by ``options``), or as the root of ``tree``."""
        if tree is None and not options:  # the common case (no debounce): straight to the storage
            [outcome] = self._enqueued(await self.storage.enqueue(self.name, [new]))
        elif tree is None:
            [outcome] = await self.store_in(None, [new], options)
        else:
            trees = require(self.storage, Trees, f"job {new.id!r}: children= or depends_on=")
            outcome = self._enqueued([await trees.enqueue_flow(tree)])[0]
        return outcome

    async def store_in(
        self, transaction: object | None, new: list[NewJob], options: EnqueueOptions, tree: list[FlowJob] | None = None
    ) -> list[EnqueueOutcome]:
        """Enqueue ``new`` (or the ``tree`` rooted at ``new[0]``, in a transaction) in the
        application's ``transaction`` (or on its own: ``None``), debounced when ``options``
        say so (validated by :meth:`new_job`)."""
        debounce = debounce_of(options, new[0].id) if options else None
        if transaction is None:
            if debounce is None:
                return self._enqueued(await self.storage.enqueue(self.name, new))
            debouncing = require(self.storage, Debounce, f"job {new[0].id!r}: debounce=")
            return self._enqueued(await debouncing.debounce(self.name, new, *debounce))
        if debounce is not None:
            raise ValidationError(f"job {new[0].id!r}: debounce cannot be combined with transaction=")
        storage = require(self.storage, Transactions, f"job {new[0].id!r}: transaction=")
        if tree is not None:
            return self._enqueued([await storage.enqueue_flow_in_transaction(tree, transaction)])
        return self._enqueued(await storage.enqueue_in_transaction(self.name, new, transaction))


def debounce_of(options: EnqueueOptions, job_id: str) -> tuple[float, float | None] | None:
    """``(delay, max_wait)`` of a debounced enqueue (``None``: not debounced), validated
    (``ValidationError`` naming the job)."""
    delay, max_wait = options.get("debounce"), options.get("max_wait")
    if delay is None:
        if max_wait is not None:
            raise ValidationError(f"max_wait needs debounce (job {job_id!r})")
        return None
    delay = check.seconds("debounce", delay, job=job_id)
    return delay, None if max_wait is None else check.seconds("max_wait", max_wait, job=job_id)


def children_counts(records: list[tuple[str, JobRecord]]) -> dict[JobState, int]:
    """Children's counts by state (every state, zeros included)."""
    counts = dict.fromkeys(JobState, 0)
    for _, r in records:
        counts[JobState(parse_job_state(r.state)[0])] += 1
    return counts


def with_children(status: JobStatus, records: list[tuple[str, JobRecord]]) -> JobStatus:
    return replace(status, children=children_counts(records))
