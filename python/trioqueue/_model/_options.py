"""The options of a job: those a producer gives ``enqueue`` (:class:`EnqueueOptions`, the
one declaration every way of enqueueing takes), and those stored in its envelope because
they override the queue's settings when it runs (:class:`JobOptions`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, TypedDict, get_type_hints

from .._core import CodecError
from . import _validate as check
from ._flows import Child, JobRef, OnChildFailure, children_from_json, depends_on_from_json

__all__ = ["ENQUEUE_OPTIONS", "NO_JOB_OPTIONS", "EnqueueOptions", "JobOptions", "OptionHelp", "check_enqueue_options"]


@dataclass(frozen=True, slots=True)
class OptionHelp:
    """What an enqueue option means, for the command line (its flag is the option's name
    with dashes, ``--help`` shows ``text``, ``metavar`` names its value, which is parsed
    by ``number``: a number type, or a parser of the text)."""

    text: str
    metavar: str = "S"
    number: type[int] | type[float] | Callable[[str], Any] = float


class EnqueueOptions(TypedDict, total=False):
    """The per-job options of an enqueue, each overriding the queue's setting for this job
    (absent or ``None``: the queue's). The one declaration of them: :meth:`Queue.enqueue`,
    :meth:`~Queue.enqueue_many` and :meth:`~Queue.enqueue_and_wait`, the producers
    (:class:`~trioqueue.SyncProducer`, :class:`~trioqueue.AsyncioProducer`) take them as
    keywords (``**options``, typed by this class), and ``trioqueue enqueue`` has a flag for
    each. The first accepted enqueue of an id fixes them. (``priority`` has no ``None``: it
    is 5, :data:`~trioqueue.DEFAULT_PRIORITY`, unless given.)"""

    max_attempts: Annotated[int | None, OptionHelp("attempts at most, this job (default: the queue's)", "N", int)]
    result_ttl: Annotated[float | None, OptionHelp("seconds its result or error is kept")]
    retry_delay: Annotated[float | None, OptionHelp("seconds between its attempts (a fixed delay)")]
    job_timeout: Annotated[float | None, OptionHelp("seconds an attempt may run before it is cancelled")]
    delay: Annotated[float | None, OptionHelp("run it S seconds from now")]
    at: Annotated[datetime | float | None, OptionHelp("run it at this time: a UNIX timestamp (an aware datetime too, from Python)", "T")]
    priority: Annotated[int, OptionHelp("0 (first) to 9 (last); default 5", "P", int)]
    debounce: Annotated[
        float | None,
        OptionHelp("run it S seconds after the last enqueue of its id: a waiting job takes the new payload"),
    ]
    max_wait: Annotated[float | None, OptionHelp("with debounce: run it at most S seconds after the first enqueue")]
    dedup_window: Annotated[
        float | None, OptionHelp("enqueues of its id within S seconds after it ended are duplicates")
    ]
    group: Annotated[
        str | None,
        OptionHelp("its group (e.g. a tenant): a priority's groups are claimed round-robin", "G", str),
    ]
    children: Annotated[
        Sequence[Child] | None,
        OptionHelp(
            'child jobs, as JSON: [{"id": ..., "payload": ..., "queue": ..., "children": [...]}]; the job runs once they are terminal',
            "JSON",
            children_from_json,
        ),
    ]
    on_child_failure: Annotated[
        OnChildFailure | None, OptionHelp("cancel (default), continue or ignore: what a failed child does to this job", "P", str)
    ]
    depends_on: Annotated[
        Sequence[str | JobRef] | None,
        OptionHelp(
            'jobs it waits for, as JSON: ["id", ["queue", "id"], ...]; it runs once they are terminal',
            "JSON",
            depends_on_from_json,
        ),
    ]


#: Every enqueue option: name -> its help (the keys of :class:`EnqueueOptions`, in order).
ENQUEUE_OPTIONS: dict[str, OptionHelp] = {
    name: hint.__metadata__[0] for name, hint in get_type_hints(EnqueueOptions, include_extras=True).items()
}


def check_enqueue_options(options: dict[str, Any], job_id: str | None = None) -> None:
    """``TypeError`` naming an unknown option (and the job), as for an unknown keyword."""
    if not options.keys() <= ENQUEUE_OPTIONS.keys():
        unknown = sorted(options.keys() - ENQUEUE_OPTIONS.keys())
        where = f" (job {job_id!r})" if job_id is not None else ""
        raise TypeError(
            f"unknown enqueue option {unknown[0]!r}{where}: the options are {', '.join(ENQUEUE_OPTIONS)}"
        )


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Per-job settings given to ``enqueue`` that override the queue's; stored in the
    job's envelope (``None``: the queue's setting). ``run_at`` (a delayed job's due time,
    for the queue-wait metric) and ``trace`` (the producer's trace context, see
    ``_tracing``) ride along."""

    retry_delay: float | None = None
    job_timeout: float | None = None
    run_at: float | None = None
    trace: dict[str, str] | None = None

    @classmethod
    def build(
        cls,
        job_id: str,
        retry_delay: float | None,
        job_timeout: float | None,
        *,
        run_at: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> JobOptions | None:
        """Validated options, or ``None`` when there is nothing to store."""
        if retry_delay is None and job_timeout is None and run_at is None and not trace:
            return None
        return cls(
            None if retry_delay is None else check.non_negative_seconds("retry_delay", retry_delay, job=job_id),
            None if job_timeout is None else check.seconds("job_timeout", job_timeout, job=job_id),
            run_at,
            trace or None,
        )

    def encode(self) -> bytes:
        fields = {"rd": self.retry_delay, "jt": self.job_timeout, "ra": self.run_at, "tc": self.trace}
        return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> JobOptions:
        if not data:
            return NO_JOB_OPTIONS
        try:
            fields = json.loads(data)
            rd, jt, ra = fields.get("rd"), fields.get("jt"), fields.get("ra")
            if any(v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v >= 0) for v in (rd, jt, ra)):
                raise ValueError(f"bad values {fields!r}")
        except (ValueError, AttributeError) as exc:
            raise CodecError(f"unreadable job options: {exc}") from exc
        tc = fields.get("tc")
        if not (isinstance(tc, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in tc.items())):
            tc = None  # a damaged trace context is dropped, never a reason to fail the job
        return cls(rd, jt, ra, tc)


NO_JOB_OPTIONS = JobOptions()
