"""RedisStorage's worker registry, progress, pause and schedules (a mixin kept apart from
``_storage.py``): each one script call (``workers.lua``, ``progress.lua``, ``pause.lua``,
``schedule_*.lua``), or one plain command for a read of one key."""

from __future__ import annotations

import json

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._model._types import DEFAULT_PRIORITY
from .._base import NewJob
from ._admin import _text
from ._keys import queue_key

__all__ = ["RedisControl", "enqueue_args"]


def _ms(seconds: float) -> int:
    return max(0, int(math.ceil(seconds * 1000)))


def enqueue_args(job: NewJob) -> list[Any]:
    """The five ARGV fields of ``job`` in ``enqueue.lua`` (and ``schedule_tick.lua``)."""
    run_at = "" if job.run_at is None else str(int(job.run_at * 1000))
    limits = f"{job.max_attempts}:{_ms(job.result_ttl)}"
    if job.priority != DEFAULT_PRIORITY or job.group is not None:
        limits += f":{job.priority}"
    if job.group is not None:
        limits += f":{job.group}"
    return [job.id, job.envelope, limits, job.token, run_at]


class RedisControl:
    """The worker registry, progress, pause and schedules of
    :class:`~trioqueue.storage.RedisStorage`."""

    _transport: Any

    if TYPE_CHECKING:  # provided by RedisAdmin and RedisStorage

        async def _register_name(self, queue: str) -> None: ...

        def _call_token(self) -> str: ...

    async def _run(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        raise NotImplementedError

    def _base(self, queue: str) -> str:
        raise NotImplementedError

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._run("unregister", queue, [worker_id], worker_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint_if_cancelled()
        flat = await self._run("workers", queue, ["1" if include_expired else "0"])
        return {_text(flat[i]): float(flat[i + 1]) / 1000 for i in range(0, len(flat), 2)}

    # -- progress, pause, schedules ----------------------------------------------------

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._run("progress", queue, [worker_id, job_id, token, progress]))

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._run("pause", queue, ["1" if paused else "0"]))

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._run("group_pause", queue, [group, "1" if paused else "0"]))

    async def paused_groups(self, queue: str) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        names = await self._transport.command(["SMEMBERS", queue_key(self._base(queue), "gpaused")])
        return sorted(n.decode("utf-8", "surrogatepass") for n in names or ())

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        """Scans the queue's active jobs' metadata (HSCAN, a page at a time)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        base = self._base(queue)
        out: dict[str, dict[str, int]] = {}
        cursor = b"0"
        while True:
            cursor, flat = await self._transport.command(["HSCAN", queue_key(base, "meta"), cursor, "COUNT", "1000"])
            ids, metas = flat[0::2], flat[1::2]
            states = await self._transport.command(["HMGET", queue_key(base, "jobs"), *ids]) if ids else []
            for raw, st in zip(metas, states, strict=True):
                kind = (st or b"").split(b":", 1)[0].decode()
                if kind in ("queued", "processing"):
                    group = json.loads(raw).get("g") or ""
                    counts = out.setdefault(group, {"queued": 0, "processing": 0})
                    counts[kind] += 1
            if cursor in (b"0", 0, "0"):
                return out

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._transport.command(["EXISTS", queue_key(self._base(queue), "paused")]))

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        check = ["0"] if expected is None else ["1", expected]
        return bool(await self._run("schedule_put", queue, [name, spec, *check]))

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._run("schedule_remove", queue, [name]))

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        specs, ticks = await self._run("schedule_get", queue, [])
        last = {_text(ticks[i]): float(ticks[i + 1]) for i in range(0, len(ticks), 2)}
        return {_text(specs[i]): (specs[i + 1], last.get(_text(specs[i]))) for i in range(0, len(specs), 2)}

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        args: list[Any] = [name, repr(float(tick))]
        if job is not None:
            await self._register_name(queue)  # as an enqueue does
            args += [self._call_token(), *enqueue_args(job)]
        return bool(await self._run("schedule_tick", queue, args))
