"""The model walk's records of what it did (the incarnations it enqueued, the handler
runs it saw, its consumers), the flow limits its consumers share, and how many tasks
run, for ``test_model.py``."""

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
    group: str | None = None  # the job's group (fair queuing), from its payload
    began: float = 0.0  # wall clock
    not_before: float | None = None  # a delayed job's due time (at the latest)
    ended: float = math.inf  # wall clock: when the handler returned, raised or was cancelled
    n: int | None = None  # the payload's "n": which enqueue made the incarnation it runs
    passed_sleep: float | None = None  # wall clock: when its durable sleep returned
    waits: list[Wait] = field(default_factory=list)  # its waits for signals, in order
    # a dependent's view of its dependencies: (children_results(), children_failures() as id -> error type)
    seen_deps: tuple[dict[str, Any], dict[str, str]] | None = None


@dataclass
class Wait:
    """One ``wait_for_signal`` call of a run: the k-th wait of the run, when it began, how
    it ended (``msg`` with ``value``, ``timeout`` at ``at``, or the name of the
    BaseException that ended it: ``Parked``, ``Cancelled``)."""

    k: int
    began: float
    outcome: str | None = None
    value: Any = None
    at: float = math.inf


@dataclass
class Effect:
    """One call of a step's function: the incarnation (job id, payload ``n``), the step's
    name, the value it returned (unique in the walk), when it was called."""

    job_id: str
    n: int
    name: str
    value: str
    t: float


@dataclass
class Dependent:
    """A job enqueued with ``depends_on``: its incarnation, its dependencies (each with its
    incarnation then), and its ``on_child_failure``."""

    inc: Incarnation
    n: int
    deps: list[tuple[str, Incarnation]]
    policy: str


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
    group_concurrency: int | None = None

    def settings(self) -> dict[str, Any]:
        return {"rate_limit": self.rate, "global_concurrency": self.concurrency, "group_concurrency": self.group_concurrency}


def live_tasks() -> int:
    """Tasks started under the current one (a client library's own system tasks, such as
    valkey-glide's, are not ours to judge)."""
    count = 0
    todo = [trio.lowlevel.current_task()]
    while todo:
        task = todo.pop()
        count += 1
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return count
