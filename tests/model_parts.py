"""The model walk's records of what it did (the incarnations it enqueued, the handler
runs it saw, its consumers) and the flow limits its consumers share, for
``test_model.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import trio

from trioqueue import Queue, RateLimit
from trioqueue.testing import FaultyStorage


@dataclass
class Incarnation:
    job_id: str
    token: str | None
    kind: str
    attempts_seen: int = 0
    cancel_requested: bool = False
    since: float = 0.0  # wall clock before the enqueue call that made it (its runs begin after)


@dataclass
class Run:
    job_id: str
    worker: str
    attempt: int
    returned: bool = False
    incarnation: Incarnation | None = None  # the job id's latest when the handler began
    began: float = 0.0  # wall clock
    not_before: float | None = None  # a delayed job's due time (at the latest)
    ended: float = math.inf  # wall clock: when the handler returned, raised or was cancelled


@dataclass
class Consumer:
    queue: Queue[Any, Any]
    faulty: FaultyStorage
    scope: trio.CancelScope
    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True)
class Flow:
    """The flow limits every consumer of a walk shares (as the README requires)."""

    rate: RateLimit | None = None
    concurrency: int | None = None

    def settings(self) -> dict[str, Any]:
        return {"rate_limit": self.rate, "global_concurrency": self.concurrency}
