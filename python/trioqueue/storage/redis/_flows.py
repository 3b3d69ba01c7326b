"""RedisStorage's trees of jobs (flows): a tree is written by one script
(``flow_enqueue.lua``), children added to a running job by another (``flow_add.lua``),
and what a job's end does to its tree is done by the script that ends it (the
``tree`` fragment: a parent queued once no child is pending, failed with
``ChildJobFailedError`` under ``cancel``, its other children cancelled, a parent's end
cancelling its children and releasing their kept records).

A tree lives on one queue here: a script's keys are one queue's (one hash tag, so one
Redis Cluster slot), and a tree across queues is refused (:class:`~trioqueue.FlowError`
naming the job, nothing written)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._model._errors import FlowError
from ..._model._types import EnqueueStatus
from .._base import EnqueueOutcome, FlowJob, JobRecord, NewJob
from ._control import _ms, enqueue_args

__all__ = ["RedisFlows", "tree_of"]

_QUEUED = EnqueueOutcome(EnqueueStatus.QUEUED)


def tree_of(jobs: Sequence[FlowJob], queue: str) -> list[dict[str, Any]]:
    """The tree's description for the scripts: ``{id, pa, ch, po, t}`` per job, in order;
    :class:`FlowError` for a job on another queue than ``queue``."""
    kids: dict[str, list[str]] = {}
    for fj in jobs:
        if fj.queue != queue or (fj.parent is not None and fj.parent[0] != queue):
            raise FlowError(
                f"job {fj.job.id!r} is on queue {fj.queue!r}, its parent's on {fj.parent[0] if fj.parent else queue!r}: "
                "on RedisStorage a tree of jobs lives on one queue (one hash tag, one Cluster slot); nothing was written"
            )
        if fj.parent is not None:
            kids.setdefault(fj.parent[1], []).append(fj.job.id)
    out = []
    for fj in jobs:
        d: dict[str, Any] = {"id": fj.job.id, "t": _ms(fj.job.result_ttl)}
        if fj.parent is not None:
            d["pa"] = fj.parent[1]
        if fj.job.id in kids:
            d["ch"] = kids[fj.job.id]
            d["po"] = fj.policy
        out.append(d)
    return out


class RedisFlows:
    """The flows part of :class:`~trioqueue.storage.RedisStorage`."""

    _named: set[str]
    prefix: str
    _transport: Any

    if TYPE_CHECKING:  # provided by RedisStorage and its other parts (after this one)

        async def _run(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
            ...

        async def _run_shielded(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
            ...

        async def _register_name(self, queue: str) -> None:
            ...

        def _call_token(self) -> str:
            ...

        async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
            ...

        async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
            ...

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        await trio.lowlevel.checkpoint_if_cancelled()
        queue = jobs[0].queue
        tree = tree_of(jobs, queue)
        if queue not in self._named:
            await self._register_name(queue)
        args: list[Any] = [json.dumps(tree), self._call_token()]
        for fj in jobs:
            args += enqueue_args(fj.job)
        reply = await self._run_shielded("flow_enqueue", queue, args)
        code = reply[0]
        if code == b"dup":  # the root exists: what enqueue says of it (it writes nothing)
            [outcome] = await self.enqueue(queue, [jobs[0].job])
            return outcome
        if code == b"exists":
            job_id = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            raise FlowError(f"job {job_id!r} already exists on queue {queue!r}: a tree's jobs must be new")
        return _QUEUED

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        tree = tree_of(children, queue)
        args: list[Any] = [json.dumps(tree), job_id, worker_id, token, policy, self._call_token()]
        for fj in children:
            args += enqueue_args(fj.job)
        reply = await self._run_shielded("flow_add", queue, args)
        code = reply[0]
        if code == b"exists":
            child = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            raise FlowError(f"job {child!r} already exists on queue {queue!r}: a tree's jobs must be new")
        return bool(code == b"ok")

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        rec = await self.get_job(queue, job_id)
        if rec is None or not rec.children:
            return []
        kids = await self._tree_children(queue, job_id)
        out = []
        for cid in kids:
            c = await self.get_job(queue, cid)
            if c is not None:
                out.append((queue, c))
        return out

    async def _tree_children(self, queue: str, job_id: str) -> list[str]:
        raw = await self._transport.command(["HGET", "{" + self.prefix + ":" + queue + "}:tree", job_id])
        if raw is None:
            return []
        return [str(c) for c in json.loads(raw).get("ch", [])]
