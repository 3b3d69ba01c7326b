"""Trees of jobs (flows): the :class:`Child` a producer declares, the ``on_child_failure``
policies, and the validation of a tree before anything is written."""

from __future__ import annotations

import json

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ._errors import FlowError

if TYPE_CHECKING:
    from ._types import JobStatus

__all__ = [
    "ON_CHILD_FAILURE",
    "Child",
    "JobRef",
    "OnChildFailure",
    "check_on_child_failure",
    "children_from_json",
    "depends_on_from_json",
    "dependencies",
    "split_links",
    "walk_tree",
]

OnChildFailure = Literal["cancel", "continue", "ignore"]

#: The ``on_child_failure`` policies: ``cancel`` (the default, as a Trio nursery: the
#: first child that fails for good cancels its siblings and fails the parent),
#: ``continue`` (the parent runs once every child is terminal and reads the failures),
#: ``ignore`` (a failed child counts as done).
ON_CHILD_FAILURE: tuple[str, ...] = ("cancel", "continue", "ignore")


class JobRef(NamedTuple):
    """A job of a storage: its queue's name and its id."""

    queue: str
    id: str


@dataclass(frozen=True, slots=True)
class Child:
    """A child job of a tree (``queue.enqueue(..., children=[Child(...), ...])``).

    ``queue`` names the queue it runs on (``None``: the parent's; any queue of the same
    storage; on Redis Cluster queues sharing a hash tag). ``children`` makes it a parent
    in turn (trees of any depth), with its own ``on_child_failure``. ``options`` are its
    enqueue options (:class:`~trioqueue.EnqueueOptions`: ``max_attempts``, ``priority``,
    ``delay``, ``depends_on``: existing jobs it waits for besides its children, ids of its
    own queue or :class:`JobRef`...). The job's payload is encoded by the enqueueing
    queue's serde.

    A child on another queue is that queue's job: the ``max_attempts`` and ``result_ttl``
    its options do not give are those of the last :class:`~trioqueue.Queue` made for that
    queue on the same storage object in this process, else the library's defaults (3
    attempts, 3600 s): never the parent queue's."""

    id: str
    payload: Any = None
    queue: str | None = None
    children: Sequence[Child] = ()
    on_child_failure: OnChildFailure = "cancel"
    options: Mapping[str, Any] = field(default_factory=dict)


def check_on_child_failure(value: Any, job_id: str) -> str:
    """The policy, or :class:`FlowError` naming the job."""
    if value is None:
        return "cancel"
    if value not in ON_CHILD_FAILURE:
        raise FlowError(
            f"on_child_failure must be one of {', '.join(map(repr, ON_CHILD_FAILURE))}, got {value!r} (job {job_id!r})"
        )
    return str(value)


def walk_tree(
    queue: str, job_id: str, children: Sequence[Child], seen: set[JobRef] | None = None
) -> Iterator[tuple[JobRef, Child]]:
    """Every descendant of ``(queue, job_id)``, parents before their children, as
    ``(parent, child)``; :class:`FlowError` for a duplicate id within the tree (a job
    listed twice, or a cycle: a Child reached again through its own children), a child
    that is not a :class:`Child`, or a bad policy."""
    seen = {JobRef(queue, job_id)} if seen is None else seen
    if isinstance(children, (str, bytes)) or not isinstance(children, Sequence):
        raise FlowError(f"children must be a list of Child, got {type(children).__name__} (job {job_id!r})")
    parent = JobRef(queue, job_id)
    for child in children:
        if not isinstance(child, Child):
            raise FlowError(f"a child must be a trioqueue.Child, got {child!r} (job {job_id!r})")
        ref = JobRef(child.queue or queue, child.id)
        if ref in seen:
            raise FlowError(f"job {child.id!r} appears twice in the tree of job {job_id!r} (a duplicate id or a cycle)")
        seen.add(ref)
        check_on_child_failure(child.on_child_failure, child.id)
        yield parent, child
        yield from walk_tree(ref.queue, child.id, child.children, seen)


def dependencies(value: Any, queue: str, job_id: str) -> tuple[tuple[str, str], ...]:
    """``depends_on`` of job ``job_id`` of ``queue`` as ``((queue, id), ...)`` (a plain id:
    a job of ``queue``), each named once; :class:`FlowError` naming the job for a value
    that is not a list of ids and :class:`JobRef`, an empty list, or the job itself."""
    if isinstance(value, (str, bytes, JobRef)) or not isinstance(value, Sequence):
        raise FlowError(f"depends_on must be a list of job ids or JobRef, got {value!r} (job {job_id!r})")
    out: list[tuple[str, str]] = []
    for dep in value:
        if isinstance(dep, JobRef) or (isinstance(dep, tuple) and len(dep) == 2):
            ref = (dep[0], dep[1])
        else:
            ref = (queue, dep)
        if not all(isinstance(x, str) and x for x in ref):
            raise FlowError(f"a dependency must be a job id (str) or a JobRef, got {dep!r} (job {job_id!r})")
        if ref == (queue, job_id):
            raise FlowError(f"job {job_id!r} cannot depend on itself")
        if ref not in out:
            out.append(ref)
    if not out:
        raise FlowError(f"depends_on of job {job_id!r} is empty: name at least one job, or give no depends_on")
    return tuple(out)


def depends_on_from_json(text: str) -> list[Any]:
    """``depends_on`` written as JSON (the command line's ``--depends-on``): a list of ids,
    or of ``[queue, id]`` pairs for jobs of other queues."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FlowError(f"--depends-on is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise FlowError(f"depends_on must be a JSON list of ids or [queue, id] pairs, got {data!r}")
    return [JobRef(str(d[0]), str(d[1])) if isinstance(d, list) and len(d) == 2 else d for d in data]


def children_from_json(text: str) -> list[Child]:
    """Children written as JSON (the command line's ``--children``): a list of objects
    with ``id`` and optionally ``payload``, ``queue``, ``children``, ``on_child_failure``
    and ``options``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FlowError(f"--children is not valid JSON: {exc}") from None
    return _children(data)


def _children(data: Any) -> list[Child]:
    if not isinstance(data, list):
        raise FlowError(f"children must be a JSON list of objects, got {data!r}")
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise FlowError(f"a child must be an object with a string id, got {item!r}")
        out.append(
            Child(
                item["id"],
                item.get("payload"),
                item.get("queue"),
                _children(item.get("children", [])),
                item.get("on_child_failure", "cancel"),
                dict(item.get("options", {})),
            )
        )
    return out


def split_links(
    ref: JobRef, links: Mapping[JobRef, JobStatus]
) -> tuple[dict[JobRef, JobStatus], dict[JobRef, JobStatus]]:
    """:meth:`Queue.children`'s listing of job ``ref`` split in two: its children (the
    jobs naming it as their parent) and its dependencies (``depends_on``: the others)."""
    children = {r: s for r, s in links.items() if s.parent == ref}
    return children, {r: s for r, s in links.items() if r not in children}
