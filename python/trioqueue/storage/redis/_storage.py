"""RedisStorage: the reliable queue on Redis >= 7 / Valkey.

Every mutating operation is one Lua script (see :mod:`._lua` for the key layout); how
they reach the server (the lean client on a standalone server, valkey-glide on Cluster),
retries and cancellation remedies live behind one :class:`~._transport.Transport`. An
awaited round trip costs far more under Trio than on the wire, so:

- concurrent :meth:`enqueue` calls on one queue share round trips (calls that arrive while
  one script call is in flight go together in the next one);
- :meth:`settle` acknowledges a whole batch in one script call, and a claim moves up to
  ``max_jobs`` jobs per call;
- a blocking :meth:`dequeue` waits with ``BLMOVE`` (≤ 1 s chunks) on a dedicated client
  that is closed if the wait is cancelled; the claim script is pipelined behind the
  ``BLMOVE`` on that connection, so the server validates and claims the moved job (with
  more, up to ``max_jobs``) as soon as it arrives, with no extra round trip.

Events are published by the scripts; subscriptions are the :mod:`._events` mixin's.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ..._drivers.resp import ConnParams, Script, Transport, parse_url, sentinel_url
from ..._model._errors import ValidationError
from ..._model._types import CancelStatus, UpdateTTLStatus
from . import _keys, _lua
from .._base import (
    Claim,
    ClaimLimits,
    HeartbeatReply,
    JobRecord,
    LostClaim,
    Settlement,
    SettleKind,
    Storage,
    StorageEvent,
)
from .._capabilities import Administration, Debounce, Groups, Schedules, Trees
from ._coalesce import Coalescer
from ._admin import RedisAdmin
from ._control import RedisControl, _ms
from ._events import RedisEvents, _Sub
from ._enqueue import RedisEnqueue, _text
from ._flows import RedisFlows

__all__ = ["RedisStorage"]

_RESYNC = StorageEvent("resync", "")
_KIND_CODE = {
    SettleKind.COMPLETE: "c",
    SettleKind.FAIL: "f",
    SettleKind.RETRY: "r",
    SettleKind.CANCEL: "x",
    SettleKind.RATE_LIMITED: "l",
    SettleKind.WAIT_CHILDREN: "w",
}
_FLOW_SCRIPTS = frozenset({"claim", "settle", "release"})  # recover adds the flow keys itself
_SWEEP_SLICE = 500  # expired jobs forgotten per script call (repeated while work remains)
_KEY_CACHE_SIZE = 4096  # (script, queue, worker) KEYS lists kept; cleared when full
_SHIELD_LIMIT = 5.0  # seconds a shielded mutation may hold up a cancellation


def open_transport(
    params: ConnParams,
    *,
    client: Any = None,
    lean: bool = True,
    retry_timeout: float = 30.0,
    on_fault: Callable[[], None] | None = None,
) -> Transport:
    """The transport for these settings, chosen once: the lean client on a standalone
    server unless told otherwise (``lean=False``) or given a client of the application's
    own (``client=``, a valkey-glide client); valkey-glide on Cluster."""
    fault = on_fault or (lambda: None)
    if lean and client is None and not params.cluster:
        from ..._drivers.resp._lean import LeanTransport

        return LeanTransport(params, retry_timeout=retry_timeout, on_fault=fault)
    from ..._drivers.resp._glide import GlideTransport  # needs the ``redis`` extra (valkey-glide)

    return GlideTransport(params, client=client, retry_timeout=retry_timeout, on_fault=fault)


class _Scripts(dict[str, Script]):
    """The queue scripts by name, each assembled the first time it is asked for (the 36
    of them took 0.18 s, a CLI command's whole connect, to assemble at once)."""

    def __missing__(self, name: str) -> Script:
        acked = name not in _lua.UNACKED_SCRIPTS  # with acknowledged writes: wait for a replica
        script = self[name] = Script(name, _lua.source(name), _lua.library(name), acked=acked)
        return script


class RedisStorage(
    RedisEnqueue,
    RedisFlows,
    RedisEvents,
    RedisControl,
    RedisAdmin,
    Trees,
    Schedules,
    Groups,
    Debounce,
    Administration,
):
    """Storage on Redis >= 7 or Valkey: standalone, Cluster, or a Sentinel service.

    ``url``: ``redis://[user[:password]@]host[:port][/db]`` or ``rediss://`` (TLS; add
    ``?ssl_cert_reqs=none`` to skip certificate checks); for Redis Sentinel,
    ``redis+sentinel://host1:26379,host2:26379/mymaster[/db]`` (or :meth:`from_sentinels`):
    the primary is the one the sentinels name, followed through failovers. ``prefix`` namespaces every key;
    each queue's keys share the hash tag ``{prefix:queue}``. ``client``: an existing GLIDE
    client to use for ordinary commands (blocking and pub/sub clients are still created
    from ``url``). ``retry_timeout``: how long an operation keeps retrying while the server
    is unreachable before raising :class:`~trioqueue.StorageError` (a server that cannot be
    reached when the storage opens is reported at once). ``lean``: on a
    standalone server, send ordinary commands, scripts and blocking claims through the
    built-in lean client (a Trio socket, RESP parsed in Rust; ~2.5x cheaper per call than
    GLIDE under Trio), subscriptions included; ``False`` sends everything through GLIDE.
    Cluster always uses GLIDE.
    ``replica_ack_timeout`` (seconds, off by default): acknowledged writes: after each
    mutation (enqueue, settle, cancel, retry...; not claims or heartbeats), wait up to
    that long for one replica to have it (``WAIT 1``) before acknowledging, and raise
    :class:`~trioqueue.StorageError` when none did. Without it, replication is
    asynchronous: a failover can lose the last acknowledged writes. Must be less than
    ``request_timeout``.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "trioqueue",
        client: Any = None,
        cluster: bool = False,
        request_timeout: float = 5.0,
        retry_timeout: float = 30.0,
        block_chunk: float = 1.0,
        watch_interval: float = 0.5,
        client_name: str | None = None,
        lean: bool = True,
        replica_ack_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.prefix = prefix
        self._params: ConnParams = parse_url(
            url,
            cluster=cluster,
            request_timeout=request_timeout,
            client_name=client_name,
            replica_ack_timeout=replica_ack_timeout,
        )
        if self._params.sentinels and client is not None:
            raise ValidationError("client= cannot be combined with Sentinel: the storage connects to the primary itself")
        self._transport: Transport = open_transport(
            self._params, client=client, lean=lean, retry_timeout=retry_timeout, on_fault=self._fault
        )
        self._block_chunk = block_chunk
        self._watch_interval = watch_interval
        self._scripts: dict[str, Script] = _Scripts()
        self._coalescers: dict[str, Coalescer] = {}
        self._subs: set[_Sub] = set()
        # (queue, worker) whose blocking move failed or was cancelled: the server may have
        # moved a job into the worker's list anyway; its next claim adopts such entries.
        self._drained: set[tuple[str, str]] = set()
        self._unclaimed_moves: set[tuple[str, str]] = set()
        self._call_seq = 0
        self._call_prefix = base64.urlsafe_b64encode(os.urandom(6)).decode()  # 8 chars: kept in records
        self._named: set[str] = set()  # queues added to the set of names (queue_names)
        self._key_cache: dict[tuple[str, str, str | None], list[str]] = {}
        self._tree_queues: dict[str, list[str]] = {}  # queue -> the queues its trees span (tree_act)

    @classmethod
    def from_sentinels(
        cls,
        sentinels: Sequence[str | tuple[str, int]],
        *,
        service: str,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        sentinel_username: str | None = None,
        sentinel_password: str | None = None,
        tls: bool = False,
        **options: Any,
    ) -> RedisStorage:
        """A storage on the primary of the Sentinel ``service`` (its master name), as
        ``sentinels`` name it: ``["host1:26379", ("host2", 26379)]`` (port 26379 when
        left out), tried in turn. ``username``/``password``: the data nodes'
        credentials; ``sentinel_username``/``sentinel_password``: the sentinels' own.
        ``options`` are the constructor's (``prefix``, ``replica_ack_timeout``...).
        The same as ``RedisStorage("redis+sentinel://host1:26379,host2:26379/service/db")``."""
        url = sentinel_url(
            sentinels,
            service=service,
            db=db,
            username=username,
            password=password,
            sentinel_username=sentinel_username,
            sentinel_password=sentinel_password,
            tls=tls,
        )
        return cls(url, **options)

    def __repr__(self) -> str:
        p = self._params
        if p.sentinels:
            return f"RedisStorage({p.display()}, prefix={self.prefix!r})"
        return f"RedisStorage({p.host}:{p.port}/{p.db}, prefix={self.prefix!r}, cluster={p.cluster})"

    # -- plumbing ----------------------------------------------------------------------

    def _base(self, queue: str) -> str:
        return _keys.queue_base(self.prefix, queue)

    def _keys(self, name: str, queue: str, *extra: str) -> list[str]:
        """KEYS of queue script ``name``: the queue keys it uses, then ``extra``
        (processing lists, flow keys)."""
        return [*_lua.keys_of(name, self._base(queue)), *extra]

    def _flow_keys(self, queue: str) -> list[str]:
        """The last KEYS of the scripts that apply or free flow control (claim, settle,
        release, recover): the rate limit's log, then the flow hash (the RateLimited hold
        ``h``; ``w`` while a claimer waits for a concurrency slot)."""
        return _keys.flow_keys(self._base(queue))

    def _plist(self, queue: str, worker_id: str) -> str:
        return _keys.processing_key(self._base(queue), worker_id)

    async def _connect(self) -> None:
        await self._transport.connect()

    async def _disconnect(self) -> None:
        with trio.CancelScope(shield=True):
            await self._transport.close()

    def _script_keys(self, name: str, queue: str, worker: str | None) -> list[str]:
        """KEYS of script ``name`` (built once per script, queue and worker: the names
        cost more to format than the rest of a call's arguments)."""
        cache_key = (name, queue, worker)
        keys = self._key_cache.get(cache_key)
        if keys is None:
            keys = self._keys(name, queue) if worker is None else self._keys(name, queue, self._plist(queue, worker))
            if name in _FLOW_SCRIPTS:
                keys += self._flow_keys(queue)
            if len(self._key_cache) >= _KEY_CACHE_SIZE:
                self._key_cache.clear()
            self._key_cache[cache_key] = keys
        return keys

    async def _run(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        return await self._transport.script(self._scripts[name], self._script_keys(name, queue, worker), args)

    async def _run_shielded(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        # A mutation whose reply matters (claims, acks): once sent, wait for its reply
        # even if cancelled, but never longer than _SHIELD_LIMIT, so that cancellation is
        # honoured within that bound even while the server is away (the Queue retries or
        # reconciles).
        return await self._transport.script(
            self._scripts[name], self._script_keys(name, queue, worker), args, shield=_SHIELD_LIMIT
        )

    async def watchdog(self) -> None:
        """The request timeouts of the lean client's calls (see :meth:`Storage.watchdog`)."""
        await self._transport.watchdog()

    def _call_token(self) -> str:
        self._call_seq += 1
        return f"{self._call_prefix}{self._call_seq:x}"

    # -- producers (enqueue, debounce: RedisEnqueue) --------------------------------

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        reply = await self._run("cancel", queue, [job_id])
        if isinstance(reply, list):  # a job of a tree: its tree next
            await self._tree_act(queue)
            reply = reply[0]
        return CancelStatus(_text(reply))

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._run("get_job", queue, [job_id])
        return None if r is None else _job_record(queue, job_id, r)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not job_ids:
            return []
        replies = await self._run("get_jobs", queue, list(job_ids))  # one script: one round trip
        return [None if r is None else _job_record(queue, jid, r) for jid, r in zip(job_ids, replies, strict=True)]

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._run("get_envelope", queue, [job_id])
        return None if r is None else bytes(r)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        return UpdateTTLStatus(_text(await self._run("update_ttl", queue, [job_id, str(_ms(ttl))])))

    # -- consumers ---------------------------------------------------------------------

    def _claim_args(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        lease: float,
        moved: bytes,
        start: int,
        limits: ClaimLimits | None = None,
    ) -> list[Any]:
        reconcile = b"1" if (queue, worker_id) in self._unclaimed_moves else b"0"
        args = [worker_id, str(max_jobs), str(_ms(lease)), moved, reconcile, str(start)]
        if limits is not None:
            args += [str(limits.rate), str(_ms(limits.per)), str(limits.concurrency), str(limits.group_concurrency)]
            args += [str(limits.group_rate), str(_ms(limits.group_per))]
        return args

    def _claimed(
        self, queue: str, worker_id: str, args: list[Any], reply: Any
    ) -> tuple[list[Claim], float | None, bytes | None]:
        """``(claims, next due time, control-stream id when paused)`` from a claim reply."""
        key = (queue, worker_id)
        if args[4] == b"1":
            self._unclaimed_moves.discard(key)
        flat = reply[0]  # five entries a claim: id, envelope, attempts, claim token, started
        claims = [
            Claim(_text(flat[k]), flat[k + 1], int(flat[k + 2]), _text(flat[k + 3]), bool(int(flat[k + 4])))
            for k in range(0, len(flat), 5)
        ]
        next_due = float(reply[1]) / 1000 if reply[1] is not None else None
        paused = reply[3] if len(reply) > 3 and reply[3] is not None else None
        if next_due is None and not reply[2] and paused is None:
            self._drained.add(key)  # nothing left or pending: the next dequeue blocks at once
        else:
            self._drained.discard(key)
        return claims, next_due, paused

    async def _claim(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        lease: float,
        moved: bytes,
        start: int,
        limits: ClaimLimits | None = None,
    ) -> tuple[list[Claim], float | None, bytes | None]:
        args = self._claim_args(queue, worker_id, max_jobs, lease, moved, start, limits)
        reply = await self._run_shielded("claim", queue, args, worker_id)
        return self._claimed(queue, worker_id, args, reply)

    async def dequeue(
        self,
        queue: str,
        worker_id: str,
        max_jobs: int,
        timeout: float,
        lease: float,
        start: int | None = None,
        limits: ClaimLimits | None = None,
    ) -> list[Claim]:
        await trio.lowlevel.checkpoint_if_cancelled()
        start = max_jobs if start is None else start
        give_up = trio.current_time() + timeout
        key = (queue, worker_id)
        next_due: float | None = None
        paused: bytes | None = None
        # When the last claim drained the list and no retry was pending, go straight to the
        # blocking move (it returns at once if a job arrived meanwhile): that saves a round
        # trip on the idle path, which is the latency path.
        if key not in self._drained or timeout <= 0:
            claims, next_due, paused = await self._claim(queue, worker_id, max_jobs, lease, b"", start, limits)
            if claims or timeout <= 0:
                return claims  # no cancellable checkpoint: claims are never dropped after the fact
        base = self._base(queue)
        src, dst = _keys.queue_key(base, "queue"), self._plist(queue, worker_id)
        backoff = 0.05
        while True:
            remaining = give_up - trio.current_time()
            if remaining <= 0:
                return []
            block = min(self._block_chunk, remaining)
            if next_due is not None:
                block = min(block, max(next_due - time.time(), 0.0) + 0.002)
            if paused is not None:
                # Paused: wait for a resume notice on the control stream (no blocking move,
                # which would only take jobs to put them back), then claim again.
                try:
                    await self._transport.blocking_call(
                        ["XREAD", "BLOCK", str(max(1, _ms(block))), "STREAMS", _keys.queue_key(base, "ctl"), _text(paused)], block
                    )
                except Exception:  # StorageError: the server is away; retry within the timeout
                    await trio.sleep(min(backoff, max(give_up - trio.current_time(), 0)))
                    backoff = min(backoff * 2, 1.0)
                claims, next_due, paused = await self._claim(queue, worker_id, max_jobs, lease, b"", start, limits)
                if claims:
                    return claims
                continue
            # The claim script rides behind the blocking move on the same connection, so
            # the server claims the moved job (and more) with no extra round trip.
            args = self._claim_args(queue, worker_id, max_jobs, lease, b"*", start, limits)
            try:
                moved, reply = await self._transport.blocking_move_then(
                    src, dst, block, self._scripts["claim"], self._script_keys("claim", queue, worker_id), args
                )
                backoff = 0.05
            except Exception:  # StorageError: the server is away; retry within the timeout
                self._unclaimed_moves.add(key)
                await trio.sleep(min(backoff, max(give_up - trio.current_time(), 0)))
                backoff = min(backoff * 2, 1.0)
                claims, next_due, paused = await self._claim(queue, worker_id, max_jobs, lease, b"", start, limits)
            except BaseException:  # cancelled: the move (and the claim) may still have happened
                self._unclaimed_moves.add(key)
                raise
            else:
                if isinstance(reply, Exception):  # e.g. NOSCRIPT, Function not found: claim the ordinary way
                    claims, next_due, paused = await self._claim(
                        queue, worker_id, max_jobs, lease, moved or b"", start, limits
                    )
                else:
                    claims, next_due, paused = self._claimed(queue, worker_id, args, reply)
            if claims:
                return claims

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not settlements:
            return []
        args: list[Any] = [worker_id, self._call_token()]
        metas: dict[tuple[SettleKind, float, float, int | None], str] = {}  # a batch shares a few TTLs
        for s in settlements:
            meta = metas.get((s.kind, s.ttl, s.delay, s.keep))
            if meta is None:
                keep = "" if s.keep is None else s.keep
                meta = metas[s.kind, s.ttl, s.delay, s.keep] = f"{_KIND_CODE[s.kind]}:{_ms(s.ttl)}:{_ms(s.delay)}:{keep}"
            args += [s.id, s.data, meta, s.token]
        reply = await self._run_shielded("settle", queue, args, worker_id)
        if len(reply) > len(settlements):
            extra = reply[len(settlements) :]
            reply = reply[: len(settlements)]
            if not isinstance(extra[0], list):  # 'tree': a job of a tree ended or waits: its tree next
                await self._tree_act(queue)
            if isinstance(extra[-1], list):  # groups whose slot was freed while full: back in the rings
                await self._run_shielded("group_requeue", queue, extra[-1])
        return [bool(x) for x in reply]

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not job_ids:
            return 0
        args = [worker_id, b"1" if refund else b"0", *job_ids]
        reply = await self._run_shielded("release", queue, args, worker_id)
        if isinstance(reply, list):  # a job of a tree ended (cancelled): its tree next
            await self._tree_act(queue)
            reply = reply[0]
        return int(reply)

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not claims:
            return []
        args: list[Any] = [worker_id]
        for job_id, token in claims:
            args += [job_id, token]
        reply = await self._run_shielded("start", queue, args, worker_id)
        if len(reply) > len(claims):  # a job of a tree ended (cancelled): its tree next
            await self._tree_act(queue)
            reply = reply[: len(claims)]
        return [bool(x) for x in reply]

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        entries = await self._transport.command(["LRANGE", self._plist(queue, worker_id), "0", "-1"])
        seen: dict[str, None] = {}
        for e in entries or ():
            _, sep, job_id = e.partition(b":")
            if sep:
                seen.setdefault(job_id.decode(), None)
        return list(seen)

    async def heartbeat(
        self, queue: str, worker_id: str, ttl: float, claims: Sequence[tuple[str, str]], lease: float
    ) -> HeartbeatReply:
        await trio.lowlevel.checkpoint_if_cancelled()
        args: list[Any] = [worker_id, str(_ms(ttl)), str(_ms(lease))]
        for job_id, token in claims:
            args += [job_id, token]
        requested, lost = await self._run("heartbeat", queue, args)
        return HeartbeatReply(
            [_text(x) for x in requested or ()],
            [LostClaim(_text(lost[i]), _text(lost[i + 1]), _text(lost[i + 2])) for i in range(0, len(lost or ()), 3)],
        )

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        base = self._base(queue)
        # The workers whose processing lists the script may touch: declared in KEYS.
        procs, dead = await self._transport.commands(
            [["SMEMBERS", _keys.queue_key(base, "procs")], ["ZRANGEBYSCORE", _keys.queue_key(base, "workers"), "-inf", f"{time.time() * 1000:.0f}"]]
        )
        workers = sorted({_text(w) for w in (*(procs or ()), *(dead or ()))})
        keys = self._keys("recover", queue, *(self._plist(queue, w) for w in workers), *self._flow_keys(queue))
        rec, nd, notes = await self._transport.script(self._scripts["recover"], keys, workers)
        if int(notes):  # notes of trees: of this pass, or left by a crash after a settle
            await self._tree_act(queue)
        # Forget expired terminal jobs, a bounded slice per call, until none is due.
        while int(await self._run("sweep", queue, [str(_SWEEP_SLICE)])) >= _SWEEP_SLICE:
            pass
        return [(_text(i), _text(s)) for i, s in rec], (float(nd) / 1000 if nd is not None else None)

    def _lock_key(self, name: str) -> str:
        return _keys.lock_key(self.prefix, name)

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._transport.script(self._scripts["lock_acquire"], [self._lock_key(name)], [owner, str(max(1, _ms(ttl)))])
        return bool(r)

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._transport.script(self._scripts["lock_release"], [self._lock_key(name)], [owner])
        return bool(r)


def _job_record(queue: str, job_id: str, r: Sequence[Any]) -> JobRecord:
    """A record from the reply of the ``get_job`` script (or one item of ``get_jobs``'s)."""
    state, created, attempts, max_attempts, result, error, token, progress, priority, group, *rest = r
    tree = json.loads(rest[0]) if rest and rest[0] else {}
    return JobRecord(
        job_id,
        _text(state),
        int(float(created)),
        int(float(attempts)),
        int(float(max_attempts)),
        result,
        error,
        None if token is None else _text(token),
        progress,
        int(priority),
        None if "pa" not in tree else (str(tree.get("pq", queue)), str(tree["pa"])),
        len(tree.get("ch", ())),
        None if not group else _text(group),
    )
