"""RedisStorage's registry queries and administration (:class:`RedisAdmin`, a part the
storage builds): counts, listing, the groups' counts, retry, purge, remove, clear and
the queue names.

The per-state index is the zset ``{prefix:queue}:states`` (id -> kind * 2**44 + the ms
the job entered its state; for a terminal job, the ms it is forgotten: the same member is
the expiry index), written by every script that changes a state: counts are ``ZCOUNT`` of
a kind's score range, pages are rank ranges of it (``list_jobs.lua``), purges go through
a kind's range in bounded slices. The known queue names live in the set
``{prefix:}:queues``: in a cluster that key hashes to another slot than the queue's keys,
so the enqueue script cannot add to it; each process adds a queue's name once, from
Python, before its first enqueue to that queue.
"""

from __future__ import annotations

import json

import trio

from .._base import STATE_KINDS, JobRecord, check_active_kind, check_state_kind
from .._cursor import decode_cursor, encode_cursor
from ._flows import RedisTrees
from ._runner import ScriptRunner, text

__all__ = ["RedisAdmin"]

_K44 = 2**44  # STATES scores: kind * 2**44 + the ms the job entered its state (terminal: leaves)
_PURGE_SLICE = 500  # jobs forgotten per script call (each call holds the server briefly)


class RedisAdmin:
    """The registry queries and administration of :class:`~trioqueue.storage.RedisStorage`,
    through its script runner; a removed child of a tree is acted on by ``trees``."""

    def __init__(self, runner: ScriptRunner, trees: RedisTrees) -> None:
        self._runner = runner
        self._trees = trees

    async def queue_names(self) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        members = await self._runner.transport.command(["SMEMBERS", self._runner.names_key()])
        return sorted(text(m) for m in members or ())

    async def counts(self, queue: str) -> dict[str, int]:
        await trio.lowlevel.checkpoint_if_cancelled()
        out = await self._runner.run("counts", queue, [])
        return {kind: int(n) for kind, n in zip(STATE_KINDS, out, strict=True)}

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        await trio.lowlevel.checkpoint_if_cancelled()
        lo = STATE_KINDS.index(state) * _K44  # the kind's score range of the states zset
        got = await self._runner.transport.command(
            ["ZRANGE", self._runner.key(queue, "states"), str(lo), str(lo + _K44 - 1), "BYSCORE", "LIMIT", "0", "1", "WITHSCORES"]
        )
        if not got:
            return None
        score = next(iter(got.values())) if isinstance(got, dict) else got[1]  # RESP3: {member: score}
        return (float(text(score)) - lo) / 1000

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        check_state_kind(state)
        after = decode_cursor(cursor)
        await trio.lowlevel.checkpoint_if_cancelled()
        args = [state, str(limit), "", ""] if after is None else [state, str(limit), str(after[0]), after[1]]
        recs, nxt_ms, nxt_id = await self._runner.run("list_jobs", queue, args)
        page = [
            JobRecord(
                text(r[0]),
                text(r[1]),
                int(float(r[2])),
                int(float(r[3])),
                int(float(r[4])),
                r[5],
                r[6],
                None if r[7] is None else text(r[7]),
                r[8],
                int(r[9]),
                group=None if not r[10] else text(r[10]),
            )
            for r in recs
        ]
        nxt = None if nxt_ms is None else encode_cursor(int(text(nxt_ms)), text(nxt_id))
        return page, nxt

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._runner.run("retry", queue, [job_id, token, "1" if reset_steps else "0"]))

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        await trio.lowlevel.checkpoint_if_cancelled()
        cutoff = ""
        if older_than is not None:
            time_ms = await self._runner.transport.command(["TIME"])
            now_ms = int(text(time_ms[0])) * 1000 + int(text(time_ms[1])) // 1000
            cutoff = str(int(now_ms - older_than * 1000))
        total, offset = 0, 0
        while True:  # the kind's range in slices; the jobs kept (newer) are skipped by offset
            n, nxt = await self._runner.run("purge", queue, [state, cutoff, str(_PURGE_SLICE), str(offset)])
            total += int(n)
            if nxt is None:
                return total
            offset = int(nxt)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        procs_key = self._runner.key(queue, "procs")
        while True:
            # The processing lists the script unlinks are declared in KEYS (Cluster, ACLs):
            # read their workers first; the script refuses (-1) if one was added meanwhile.
            runner = self._runner
            workers = sorted(text(w) for w in await runner.transport.command(["SMEMBERS", procs_key]) or ())
            keys = runner.keys("clear", queue, *(runner.plist(queue, w) for w in workers), *runner.flow_keys(queue))
            res = await runner.transport.script(runner.scripts["clear"], keys, ["1" if schedules else "0", *workers])
            if isinstance(res, list):  # jobs of trees were cleared: their parents and dependents next
                await self._trees.act(queue)
                return int(res[0])
            if int(res) >= 0:
                return int(res)

    async def remove_job(self, queue: str, job_id: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        removed = int(await self._runner.run("remove", queue, [job_id]))
        if removed == 2:  # a child of a tree: its parent next
            await self._trees.act(queue)
        return bool(removed)

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        """Scans the queue's active jobs' metadata (HSCAN, a page at a time)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        transport = self._runner.transport
        meta, jobs = self._runner.key(queue, "meta"), self._runner.key(queue, "jobs")
        out: dict[str, dict[str, int]] = {}
        cursor = b"0"
        while True:
            cursor, flat = await transport.command(["HSCAN", meta, cursor, "COUNT", "1000"])
            ids, metas = flat[0::2], flat[1::2]
            states = await transport.command(["HMGET", jobs, *ids]) if ids else []
            for raw, st in zip(metas, states, strict=True):
                kind = (st or b"").split(b":", 1)[0].decode()
                if kind in ("queued", "processing"):
                    group = json.loads(raw).get("g") or ""
                    counts = out.setdefault(group, {"queued": 0, "processing": 0})
                    counts[kind] += 1
            if cursor in (b"0", 0, "0"):
                return out
