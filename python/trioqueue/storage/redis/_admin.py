"""RedisStorage's registry queries and administration (a mixin kept apart from
``_storage.py``): counts, listing, retry, purge, remove, clear and the queue names.

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

from collections.abc import Sequence
from typing import Any

import trio

from .._base import STATE_KINDS, JobRecord, check_active_kind, check_state_kind
from .._cursor import decode_cursor, encode_cursor
from ._keys import names_key, queue_key

__all__ = ["RedisAdmin"]

_K44 = 2**44  # STATES scores: kind * 2**44 + the ms the job entered its state (terminal: leaves)
_PURGE_SLICE = 500  # jobs forgotten per script call (each call holds the server briefly)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisAdmin:
    """The admin part of :class:`~trioqueue.storage.RedisStorage`."""

    prefix: str
    _transport: Any
    _named: set[str]

    async def _run(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        raise NotImplementedError

    def _base(self, queue: str) -> str:
        raise NotImplementedError

    async def _tree_act(self, queue: str) -> None:
        raise NotImplementedError

    _scripts: dict[str, Any]

    def _keys(self, name: str, queue: str, *extra: str) -> list[str]:
        raise NotImplementedError

    def _plist(self, queue: str, worker_id: str) -> str:
        raise NotImplementedError

    def _flow_keys(self, queue: str) -> list[str]:
        raise NotImplementedError

    def _states_key(self, queue: str) -> str:
        return queue_key(self._base(queue), "states")

    def _names_key(self) -> str:
        return names_key(self.prefix)

    async def _register_name(self, queue: str) -> None:
        """Add ``queue`` to the set of names, once per process (before its first enqueue)."""
        if queue not in self._named:
            await self._transport.command(["SADD", self._names_key(), queue])
            self._named.add(queue)

    async def queue_names(self) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        members = await self._transport.command(["SMEMBERS", self._names_key()])
        return sorted(_text(m) for m in members or ())

    async def counts(self, queue: str) -> dict[str, int]:
        await trio.lowlevel.checkpoint_if_cancelled()
        out = await self._run("counts", queue, [])
        return {kind: int(n) for kind, n in zip(STATE_KINDS, out, strict=True)}

    async def oldest(self, queue: str, state: str) -> float | None:
        check_active_kind(state)
        await trio.lowlevel.checkpoint_if_cancelled()
        lo = STATE_KINDS.index(state) * _K44  # the kind's score range of the states zset
        got = await self._transport.command(
            ["ZRANGE", self._states_key(queue), str(lo), str(lo + _K44 - 1), "BYSCORE", "LIMIT", "0", "1", "WITHSCORES"]
        )
        if not got:
            return None
        score = next(iter(got.values())) if isinstance(got, dict) else got[1]  # RESP3: {member: score}
        return (float(_text(score)) - lo) / 1000

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        check_state_kind(state)
        after = decode_cursor(cursor)
        await trio.lowlevel.checkpoint_if_cancelled()
        args = [state, str(limit), "", ""] if after is None else [state, str(limit), str(after[0]), after[1]]
        recs, nxt_ms, nxt_id = await self._run("list_jobs", queue, args)
        page = [
            JobRecord(
                _text(r[0]),
                _text(r[1]),
                int(float(r[2])),
                int(float(r[3])),
                int(float(r[4])),
                r[5],
                r[6],
                None if r[7] is None else _text(r[7]),
                r[8],
                int(r[9]),
                group=None if not r[10] else _text(r[10]),
            )
            for r in recs
        ]
        nxt = None if nxt_ms is None else encode_cursor(int(_text(nxt_ms)), _text(nxt_id))
        return page, nxt

    async def retry_job(self, queue: str, job_id: str, token: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._run("retry", queue, [job_id, token]))

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        check_state_kind(state, terminal=True)
        await trio.lowlevel.checkpoint_if_cancelled()
        cutoff = ""
        if older_than is not None:
            time_ms = await self._transport.command(["TIME"])
            now_ms = int(_text(time_ms[0])) * 1000 + int(_text(time_ms[1])) // 1000
            cutoff = str(int(now_ms - older_than * 1000))
        total, offset = 0, 0
        while True:  # the kind's range in slices; the jobs kept (newer) are skipped by offset
            n, nxt = await self._run("purge", queue, [state, cutoff, str(_PURGE_SLICE), str(offset)])
            total += int(n)
            if nxt is None:
                return total
            offset = int(nxt)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        procs_key = queue_key(self._base(queue), "procs")
        while True:
            # The processing lists the script unlinks are declared in KEYS (Cluster, ACLs):
            # read their workers first; the script refuses (-1) if one was added meanwhile.
            workers = sorted(_text(w) for w in await self._transport.command(["SMEMBERS", procs_key]) or ())
            keys = self._keys("clear", queue, *(self._plist(queue, w) for w in workers), *self._flow_keys(queue))
            n = int(await self._transport.script(self._scripts["clear"], keys, ["1" if schedules else "0", *workers]))
            if n >= 0:
                return n

    async def remove_job(self, queue: str, job_id: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        removed = int(await self._run("remove", queue, [job_id]))
        if removed == 2:  # a child of a tree: its parent next
            await self._tree_act(queue)
        return bool(removed)
