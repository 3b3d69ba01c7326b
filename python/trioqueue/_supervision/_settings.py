"""The settings of a Queue and of a Worker, each validated once into one frozen object.

:class:`JobDefaults` are a :class:`~trioqueue.Queue`'s (what its jobs get when an enqueue
gives no option, and how payloads and results are encoded); :class:`WorkerSettings` are a
:class:`~trioqueue.Worker`'s (how it claims, runs and settles). The parts a Queue or a
Worker builds are handed these objects (or what they need of them), never copies of
their fields.
"""

from __future__ import annotations

import inspect
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._model import _validate as check
from .._model._errors import ValidationError
from .._model._limits import RateLimit
from .._model._retry import ExponentialBackoff, RetryDelay, retry_policy
from .._model._serde import JsonSerde, Serde
from .._model._types import DEFAULT_MAX_ATTEMPTS, DEFAULT_RESULT_TTL, FOREVER_TTL
from ..storage._base import ClaimLimits, Storage
from ..storage._capabilities import Groups, require
from ._batch import BatchSettings, batch_settings
from ._consumer import claim_limits
from ._execution import AfterExecution, RetryIf, check_retry_if
from ._leases import lease_margin as resolve_lease_margin
from ._pool import check_executor

__all__ = ["WORKER_ARGUMENTS", "JobDefaults", "WorkerSettings", "check_storage", "default_worker_id"]

def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """A Queue's job settings: ``max_attempts`` and ``result_ttl`` (seconds;
    :data:`FOREVER_TTL` for good) of a job enqueued without those options, and the serdes
    of payloads and results (``result_serde`` defaults to ``payload_serde``)."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    result_ttl: float = DEFAULT_RESULT_TTL
    payload_serde: Serde = JsonSerde()
    result_serde: Serde = JsonSerde()

    @staticmethod
    def build(
        max_attempts: Any = DEFAULT_MAX_ATTEMPTS,
        result_ttl: Any = DEFAULT_RESULT_TTL,
        payload_serde: Serde | None = None,
        result_serde: Serde | None = None,
    ) -> JobDefaults:
        """The defaults of a Queue's arguments (``result_ttl=None``: for good), validated
        (:class:`ValidationError` naming the argument)."""
        attempts = check.positive_int("max_attempts", max_attempts)
        ttl = FOREVER_TTL if result_ttl is None else check.seconds("result_ttl", result_ttl)
        payload = payload_serde or JsonSerde()
        result = result_serde or payload
        for what, serde in (("payload_serde", payload), ("result_serde", result)):
            if not (callable(getattr(serde, "dumps", None)) and callable(getattr(serde, "loads", None))):
                raise ValidationError(f"{what} must have dumps(value) -> bytes and loads(bytes) methods")
        return JobDefaults(attempts, ttl, payload, result)


def check_storage(storage: Storage, group_rate_limit: RateLimit | None, group_concurrency: int | None = None) -> None:
    """Raise :class:`ValidationError` if a worker's settings need a capability ``storage``
    lacks (naming the setting, the capability and the backend)."""
    if group_rate_limit is not None:
        require(storage, Groups, "group_rate_limit")
    if group_concurrency is not None:
        require(storage, Groups, "group_concurrency")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a :class:`~trioqueue.Worker` claims, runs and settles jobs: its constructor's
    arguments, validated (see :meth:`build` and the Worker's docstring for their meaning).
    Derived values: ``lease_margin`` resolved (never ``None``), ``prefetch`` resolved (0
    when ``claim_limits`` are set), ``processes`` the pool's size (``None`` for threads),
    ``batch`` a batch handler's batches (``None`` for a handler of one job)."""

    worker_id: str
    concurrency: int
    executor: Literal["thread", "process"]
    processes: int | None
    prefetch: int
    block_timeout: float
    visibility_timeout: float
    lease_margin: float
    job_timeout: float | None
    retry_delay: Callable[[int], float]  # seconds before the retry after attempt n
    retry_if: RetryIf | None
    after_execution: AfterExecution | None
    reaper: bool
    rate_limit: RateLimit | None
    global_concurrency: int | None
    group_concurrency: int | None
    group_rate_limit: RateLimit | None
    claim_limits: ClaimLimits | None
    batch: BatchSettings | None
    keep_completed: int | None
    keep_failed: int | None
    # the arguments these were built from (what a copy with changes is built anew from)
    arguments: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def build(
        storage: Storage | None = None,
        *,
        batch: bool = False,
        concurrency: int | None = None,
        worker_id: str | None = None,
        retry_delay: RetryDelay = ExponentialBackoff(),
        job_timeout: float | None = None,
        block_timeout: float = 5.0,
        visibility_timeout: float = 30.0,
        after_execution: AfterExecution | None = None,
        prefetch: int | None = None,
        reaper: bool = True,
        retry_if: RetryIf | None = None,
        rate_limit: RateLimit | None = None,
        global_concurrency: int | None = None,
        group_concurrency: int | None = None,
        group_rate_limit: RateLimit | None = None,
        lease_margin: float | None = None,
        executor: Literal["thread", "process"] = "thread",
        processes: int | None = None,
        batch_size: int = 100,
        batch_wait: float = 0.05,
        keep_completed: int | None = None,
        keep_failed: int | None = None,
    ) -> WorkerSettings:
        """Validate a Worker's arguments (:class:`ValidationError` naming the problem).
        ``batch``: the handler is a batch handler (``batch_size``/``batch_wait`` apply);
        ``storage``: the one the worker claims from, for the checks that depend on it
        (``group_rate_limit``; ``None``: not checked here)."""
        arguments = {k: v for k, v in locals().items() if k not in ("storage", "batch")}
        pool = check_executor(executor, processes)
        # (default: 1, or the pool's size when one is given: each handler needs a process)
        workers = check.positive_int("concurrency", concurrency if concurrency is not None else pool or 1)
        wid = check.job_id(worker_id, "worker_id") if worker_id is not None else default_worker_id()
        timeout = None if job_timeout is None else check.seconds("job_timeout", job_timeout)
        block = check.seconds("block_timeout", block_timeout)
        lease = check.seconds("visibility_timeout", visibility_timeout)
        # A claim this worker could not renew is given up this long before its lease runs out.
        margin = resolve_lease_margin(lease_margin, lease)
        kept_completed = check.keep_count("keep_completed", keep_completed)
        kept_failed = check.keep_count("keep_failed", keep_failed)
        batches = batch_settings(batch_size, batch_wait, executor) if batch else None
        per_worker = 1 if batches is None else batches.size
        ahead = per_worker * workers if prefetch is None else check.positive_int("prefetch", prefetch)
        # Queue-wide flow control, enforced by the storage at claim time (see ClaimLimits);
        # a flow-limited queue claims only for idle workers (no prefetch): its claims start
        # at once and hold no slot or token a worker is not using.
        if storage is not None:
            check_storage(storage, group_rate_limit, group_concurrency)
        limits = claim_limits(rate_limit, global_concurrency, group_concurrency, group_rate_limit)
        if limits is not None:
            if prefetch is not None:
                raise ValidationError("prefetch cannot be combined with rate_limit, global_concurrency or group limits")
            ahead = 0
        return WorkerSettings(
            worker_id=wid,
            concurrency=workers,
            executor=executor,
            # the size of the process pool (executor="process"), else None
            processes=None if executor == "thread" else pool or workers,
            prefetch=ahead,
            block_timeout=block,
            visibility_timeout=lease,
            lease_margin=margin,
            job_timeout=timeout,
            retry_delay=retry_policy(retry_delay),
            retry_if=check_retry_if(retry_if),
            after_execution=after_execution,
            reaper=bool(reaper),
            rate_limit=rate_limit,
            global_concurrency=global_concurrency,
            group_concurrency=group_concurrency,
            group_rate_limit=group_rate_limit,
            claim_limits=limits,
            batch=batches,
            keep_completed=kept_completed,
            keep_failed=kept_failed,
            arguments=arguments,
        )


# The Worker's settings among a constructor's arguments (a Queue's or a Worker's): those of
# WorkerSettings.build but its storage and what the handler given says (batch).
WORKER_ARGUMENTS = frozenset(inspect.signature(WorkerSettings.build).parameters) - {"storage", "batch"}
