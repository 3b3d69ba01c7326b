"""RedisStorage's trees of jobs (flows): a tree is written by one script
(``flow_enqueue.lua``), children added to a running job by another (``flow_add.lua``),
and what a job's end does to its tree is noted by the script that ends it and done by
``tree_act.lua`` right after (the ``tree`` fragment: a parent queued once no child is
pending, failed with ``ChildJobFailedError`` under ``cancel``, its other children
cancelled, a parent's end cancelling its children and releasing their kept records); the
reaper's ``recover`` reports notes a crash left, and ``tree_act`` acts on them.

A tree may span queues of the storage: those scripts are sent the keys of every queue
involved (each queue's in turn, and their names). Each queue of a tree spanning several
remembers them all (its ``tree_queues`` set), so that ``tree_act`` called for one queue
learns the others: it answers ``need`` with the queues it was not given, and is called
again with them (known ones are kept per queue). On Redis Cluster a script's keys must
share a slot: a tree across queues needs queues whose keys do (a common ``{tag}`` in
their names, see :func:`~._keys.queue_base`), and is refused otherwise
(:class:`~trioqueue.FlowError` naming the root job and the queues, nothing written)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from ..._model._errors import FlowError, StorageError
from .._base import EnqueueOutcome, FlowJob, JobRecord, NewJob
from . import _keys
from ._enqueue import QUEUED, enqueue_args
from ._runner import SHIELD_LIMIT, RedisSettings, ScriptRunner, ms, text

__all__ = ["RedisTrees", "tree_of"]

_NEED_ROUNDS = 32  # tree_act calls learning more queues before giving up (never near)


def tree_of(jobs: Sequence[FlowJob], first: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The tree's description for the scripts, ``{id, q, pa, pq, ch, cq, po, t, dp, dq}``
    per job in order (``q``: the index, from 1, of its queue in the names; ``pq``, ``cq``:
    its parent's and children's queues where they differ from its own; ``dp``, ``dq``: its
    dependencies and their queues), and the names of the queues it spans, its
    dependencies' included (``first`` first)."""
    names = [first]
    for fj in jobs:
        for q in [fj.queue, *(dq for dq, _ in fj.depends_on)]:
            if q not in names:
                names.append(q)
    kids: dict[tuple[str, str], list[FlowJob]] = {}
    for fj in jobs:
        if fj.parent is not None:
            kids.setdefault(fj.parent, []).append(fj)
    out = []
    for fj in jobs:
        d: dict[str, Any] = {"id": fj.job.id, "q": names.index(fj.queue) + 1, "t": ms(fj.job.result_ttl)}
        if fj.parent is not None:
            d["pa"] = fj.parent[1]
            if fj.parent[0] != fj.queue:
                d["pq"] = fj.parent[0]
        mine = kids.get((fj.queue, fj.job.id))
        if mine:
            d["ch"] = [c.job.id for c in mine]
            if any(c.queue != fj.queue for c in mine):
                d["cq"] = [c.queue for c in mine]
            d["po"] = fj.policy
        if fj.depends_on:
            d["dp"] = [did for _, did in fj.depends_on]
            d["dq"] = [dq for dq, _ in fj.depends_on]
            d["po"] = fj.policy
        out.append(d)
    return out, names


class RedisTrees:
    """The trees of jobs of :class:`~trioqueue.storage.RedisStorage`, through its script
    runner; ``enqueue`` and ``get_job`` are the storage's (a tree whose root exists
    answers as an enqueue of the root; children are read as jobs)."""

    def __init__(
        self,
        runner: ScriptRunner,
        settings: RedisSettings,
        *,
        enqueue: Callable[[str, Sequence[NewJob]], Awaitable[list[EnqueueOutcome]]],
        get_job: Callable[[str, str], Awaitable[JobRecord | None]],
    ) -> None:
        self._runner = runner
        self._settings = settings
        self._enqueue = enqueue
        self._get_job = get_job
        self._tree_queues: dict[str, list[str]] = {}  # queue -> the queues its trees span (tree_act)

    def _check_slots(self, root: str, names: Sequence[str]) -> None:
        """On Cluster, :class:`FlowError` unless the keys of ``names`` share a slot."""
        if not self._settings.params.cluster or len(names) < 2:
            return
        if len({_keys.hash_slot(self._runner.base(q)) for q in names}) > 1:
            raise FlowError(
                f"the tree of job {root!r} spans queues {', '.join(map(repr, names))}, whose keys are in different "
                "Redis Cluster slots: a tree across queues needs queues that share a hash tag (a common {tag} in "
                "their names, e.g. 'report{jobs}' and 'fetchers{jobs}'); nothing was written"
            )

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        await trio.lowlevel.checkpoint_if_cancelled()
        queue = jobs[0].queue
        tree, names = tree_of(jobs, queue)
        self._check_slots(jobs[0].job.id, names)
        for q in names:
            if q not in self._runner.named:
                await self._runner.register_name(q)
        args: list[Any] = [json.dumps(tree), self._runner.call_token(), json.dumps(names)]
        for fj in jobs:
            args += enqueue_args(fj.job)
        reply = await self._runner.multi("flow_enqueue", names, args, SHIELD_LIMIT)
        code = reply[0]
        if code == b"dup":  # the root exists: what enqueue says of it (it writes nothing)
            [outcome] = await self._enqueue(queue, [jobs[0].job])
            return outcome
        if code == b"exists":
            job_id = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            where = next((fj.queue for fj in jobs if fj.job.id == job_id), queue)
            raise FlowError(f"job {job_id!r} already exists on queue {where!r}: a tree's jobs must be new")
        if code == b"nodep":
            job_id, dep, where = (text(x) for x in reply[1:4])
            raise FlowError(f"job {job_id!r} depends on job {dep!r} of queue {where!r}, which does not exist")
        if any(fj.depends_on for fj in jobs):  # its dependents are evaluated now (those ended count at once)
            await self.act(queue)
        return QUEUED

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        tree, names = tree_of(children, queue)
        self._check_slots(job_id, names)
        for q in names[1:]:
            if q not in self._runner.named:
                await self._runner.register_name(q)
        head: list[Any] = [json.dumps(tree), job_id, worker_id, token, policy, self._runner.call_token()]
        jobs: list[Any] = []
        for fj in children:
            jobs += enqueue_args(fj.job)
        for _ in range(_NEED_ROUNDS):  # told the queues of the job's ancestors as it asks
            reply = await self._runner.multi("flow_add", names, [*head, json.dumps(names), *jobs], SHIELD_LIMIT)
            code = reply[0]
            if code != b"need":
                break
            names = [*names, text(reply[1])]
        else:
            raise StorageError(f"the ancestors of job {job_id!r} on queue {queue!r} span more queues than flow_add was given")
        if code == b"exists":
            child = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            where = next((fj.queue for fj in children if fj.job.id == child), queue)
            raise FlowError(f"job {child!r} already exists on queue {where!r}: a tree's jobs must be new")
        return bool(code == b"ok")

    async def act(self, queue: str) -> None:
        """Act on the notes of trees the scripts of ``queue`` left, on every queue those
        trees span (``tree_act``, told of more queues as long as it asks)."""
        names = self._tree_queues.get(queue) or [queue]
        for _ in range(_NEED_ROUNDS):
            reply = await self._runner.multi("tree_act", names, names, SHIELD_LIMIT)
            if not isinstance(reply, list):
                if len(names) > 1:
                    self._tree_queues[queue] = names
                return
            names = names + [n for n in (text(x) for x in reply[1:]) if n not in names]
        raise StorageError(f"trees of jobs on queue {queue!r} span more queues than tree_act was given")

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        rec = await self._get_job(queue, job_id)
        if rec is None:
            return []
        children, deps = await self._tree_children(queue, job_id)
        out = []
        for cq, cid in children:
            c = await self._get_job(cq, cid)
            if c is not None and c.parent == (queue, job_id):  # (not a job of its own that took its id)
                out.append((cq, c))
        for dq, did in deps:
            d = await self._get_job(dq, did)
            if d is not None and (queue, job_id) in await self._dependents(dq, did):
                out.append((dq, d))
        return out

    async def _tree(self, queue: str, job_id: str) -> dict[str, Any]:
        raw = await self._runner.transport.command(["HGET", self._runner.key(queue, "tree"), job_id])
        return {} if raw is None else dict(json.loads(raw))

    async def _tree_children(self, queue: str, job_id: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """``(queue, id)`` of each child of the job, in order, and of each dependency."""
        t = await self._tree(queue, job_id)
        ch = [str(c) for c in t.get("ch", [])]
        dp = [str(d) for d in t.get("dp", [])]
        return (
            list(zip(t.get("cq") or [queue] * len(ch), ch, strict=True)),
            list(zip((str(q) for q in t.get("dq", [])), dp, strict=True)),
        )

    async def _dependents(self, queue: str, job_id: str) -> list[tuple[str, str]]:
        """``(queue, id)`` of each dependent of the job."""
        t = await self._tree(queue, job_id)
        return list(zip((str(q) for q in t.get("dsq", [])), (str(d) for d in t.get("ds", [])), strict=True))

