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

Events are published by the scripts.

The class is the list of what the backend does. Its core (enqueue, claims, settlements,
leases, recovery) is written here; the rest delegates to parts it builds in
``__init__``, each handed what it needs: the :class:`~._runner.ScriptRunner` (transport,
key layout, scripts) and the :class:`~._runner.RedisSettings`. The parts:
:class:`~._events.RedisEvents` (subscriptions), :class:`~._flows.RedisTrees` (trees of
jobs), :class:`~._admin.RedisAdmin` (registry queries and administration).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from ..._drivers.resp import ConnParams, Transport, parse_url, sentinel_url
from ..._model._errors import StorageError, ValidationError
from ..._model._types import CancelStatus, UpdateTTLStatus
from .._base import (
    Claim,
    ClaimLimits,
    EnqueueOutcome,
    FlowJob,
    HeartbeatReply,
    JobRecord,
    LostClaim,
    NewJob,
    Settlement,
    SettleKind,
    StorageEvent,
)
from .._capabilities import Administration, Debounce, Groups, Schedules, Signals, Trees
from .._coalesce import Coalescer, Slot
from .._steps import decode_signals, decode_steps, encode_step
from ._admin import RedisAdmin
from ._enqueue import enqueue_args, flush, outcome
from ._events import RedisEvents
from ._keys import SIGNAL_FIELD, STEP_FIELD
from ._flows import RedisTrees
from ._runner import RedisSettings, ScriptRunner, ms, open_transport, text

__all__ = ["RedisStorage", "open_transport"]

_KIND_CODE = {
    SettleKind.COMPLETE: "c",
    SettleKind.FAIL: "f",
    SettleKind.RETRY: "r",
    SettleKind.CANCEL: "x",
    SettleKind.RATE_LIMITED: "l",
    SettleKind.WAIT_CHILDREN: "w",
    SettleKind.SLEEP: "s",
    SettleKind.WAIT_SIGNAL: "g",
}
_MAKE_CLAIM = functools.partial(tuple.__new__, Claim)  # Claim of a tuple of its fields, as Claim._make does
_SWEEP_SLICE = 500  # expired jobs forgotten per script call (repeated while work remains)


class RedisStorage(Trees, Schedules, Groups, Debounce, Administration, Signals):
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
        params: ConnParams = parse_url(
            url,
            cluster=cluster,
            request_timeout=request_timeout,
            client_name=client_name,
            replica_ack_timeout=replica_ack_timeout,
        )
        if params.sentinels and client is not None:
            raise ValidationError("client= cannot be combined with Sentinel: the storage connects to the primary itself")
        self._settings = RedisSettings(
            url, prefix, params, retry_timeout=retry_timeout, lean=lean, block_chunk=block_chunk, watch_interval=watch_interval
        )
        self._transport: Transport = open_transport(
            params, client=client, lean=lean, retry_timeout=retry_timeout, on_fault=self._fault
        )
        # The parts, each handed what it needs: the script runner (the transport, the key
        # layout, the scripts) and the settings.
        self._runner = ScriptRunner(self._transport, prefix)
        self._events = RedisEvents(self._runner, self._settings)
        self._trees = RedisTrees(self._runner, self._settings, enqueue=self.enqueue, get_job=self.get_job)
        self._admin = RedisAdmin(self._runner, self._trees)
        self._coalescers: dict[str, Coalescer] = {}  # per queue: its concurrent enqueue calls
        self._step_coalescers: dict[str, Coalescer] = {}  # per queue: its concurrent step saves
        # (queue, worker) whose blocking move failed or was cancelled: the server may have
        # moved a job into the worker's list anyway; its next claim adopts such entries.
        self._drained: set[tuple[str, str]] = set()
        self._unclaimed_moves: set[tuple[str, str]] = set()

    @property
    def url(self) -> str:
        """The URL the storage connects to."""
        return self._settings.url

    @property
    def prefix(self) -> str:
        """What every key of this storage starts with (in its hash tag)."""
        return self._settings.prefix

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
        p = self._settings.params
        if p.sentinels:
            return f"RedisStorage({p.display()}, prefix={self.prefix!r})"
        return f"RedisStorage({p.host}:{p.port}/{p.db}, prefix={self.prefix!r}, cluster={p.cluster})"

    # -- plumbing ----------------------------------------------------------------------

    def _base(self, queue: str) -> str:
        """What the keys of ``queue`` start with (the tests read keys through it)."""
        return self._runner.base(queue)

    def _plist(self, queue: str, worker_id: str) -> str:
        """The processing list of ``worker_id`` on ``queue`` (the tests read it)."""
        return self._runner.plist(queue, worker_id)

    def _fault(self) -> None:
        """The transport saw a fault (its ``on_fault``): subscriptions resync."""
        self._events.fault()

    async def _connect(self) -> None:
        await self._transport.connect()

    async def _disconnect(self) -> None:
        with trio.CancelScope(shield=True):
            await self._transport.close()

    async def watchdog(self) -> None:
        """The request timeouts of the lean client's calls (see :meth:`Storage.watchdog`)."""
        await self._transport.watchdog()

    # -- producers ---------------------------------------------------------------------

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        """Concurrent calls on one queue share round trips (see :class:`~._coalesce.Coalescer`)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if not jobs:
            return []
        if queue not in self._runner.named:
            await self._runner.register_name(queue)
        co = self._coalescers.get(queue)
        if co is None:
            co = self._coalescers[queue] = Coalescer(functools.partial(flush, self._runner, queue))
        return await co.submit(jobs)

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if queue not in self._runner.named:
            await self._runner.register_name(queue)
        head = [str(int(delay * 1000)), "" if max_wait is None else str(int(max_wait * 1000))]
        outcomes: list[EnqueueOutcome] = []
        for job in jobs:  # one call a job: each takes effect on its own, in order
            [item] = await self._runner.run_shielded(
                "debounce", queue, [*head, self._runner.call_token(), *enqueue_args(job)]
            )
            outcomes.append(outcome(item))
        return outcomes

    # -- jobs ------------------------------------------------------------------------

    async def cancel(self, queue: str, job_id: str) -> CancelStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        reply = await self._runner.run("cancel", queue, [job_id])
        if isinstance(reply, list):  # a job of a tree: its tree next
            await self._trees.act(queue)
            reply = reply[0]
        return CancelStatus(text(reply))

    async def get_job(self, queue: str, job_id: str) -> JobRecord | None:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._runner.run("get_job", queue, [job_id])
        return None if r is None else _job_record(queue, job_id, r)

    async def get_jobs(self, queue: str, job_ids: Sequence[str]) -> list[JobRecord | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not job_ids:
            return []
        replies = await self._runner.run("get_jobs", queue, list(job_ids))  # one script: one round trip
        return [None if r is None else _job_record(queue, jid, r) for jid, r in zip(job_ids, replies, strict=True)]

    async def get_envelope(self, queue: str, job_id: str) -> bytes | None:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._runner.run("get_envelope", queue, [job_id])
        return None if r is None else bytes(r)

    async def update_result_ttl(self, queue: str, job_id: str, ttl: float) -> UpdateTTLStatus:
        await trio.lowlevel.checkpoint_if_cancelled()
        return UpdateTTLStatus(text(await self._runner.run("update_ttl", queue, [job_id, str(ms(ttl))])))

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
        args = [worker_id, str(max_jobs), str(ms(lease)), moved, reconcile, str(start)]
        if limits is not None:
            args += [str(limits.rate), str(ms(limits.per)), str(limits.concurrency), str(limits.group_concurrency)]
            args += [str(limits.group_rate), str(ms(limits.group_per))]
        return args

    def _claimed(
        self, queue: str, worker_id: str, args: list[Any], reply: Any
    ) -> tuple[list[Claim], float | None, bytes | None]:
        """``(claims, next due time, control-stream id when paused)`` from a claim reply."""
        key = (queue, worker_id)
        if args[4] == b"1":
            self._unclaimed_moves.discard(key)
        flat = reply[0]  # five entries a claim: id, envelope, attempts, claim token, started
        # built by C alone (map, zip, tuple.__new__): a claim costs 1.0 µs here, against
        # 2.3 µs for a comprehension calling Claim(...) and the conversions per entry
        claims: list[Claim] = list(map(_MAKE_CLAIM, zip(
            map(bytes.decode, flat[0::5]), flat[1::5], map(int, flat[2::5]), map(bytes.decode, flat[3::5]),
            map(bool, flat[4::5]),
        )))
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
        reply = await self._runner.run_shielded("claim", queue, args, worker_id)
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
        runner = self._runner
        src, dst = runner.key(queue, "queue"), runner.plist(queue, worker_id)
        backoff = 0.05
        while True:
            remaining = give_up - trio.current_time()
            if remaining <= 0:
                return []
            block = min(self._settings.block_chunk, remaining)
            # A job due before the wait would end: a timer wakes the blocked move at its
            # due time (a blocking command's own timeout fires only at the server's next
            # cron tick, up to 100 ms late on an idle server).
            wake_at = next_due if next_due is not None and next_due - time.time() < block else None
            if paused is not None:
                # Paused: wait for a resume notice on the control stream (no blocking move,
                # which would only take jobs to put them back), then claim again; at the
                # latest when the next job is due, or the flow control's hold ends.
                if next_due is not None:
                    block = min(block, max(next_due - time.time(), 0.0) + 0.002)
                try:
                    await self._transport.blocking_call(
                        ["XREAD", "BLOCK", str(max(1, ms(block))), "STREAMS", runner.key(queue, "ctl"), text(paused)], block
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
                moved, reply = await self._move_then_claim(
                    src, dst, block, wake_at, runner.scripts["claim"], runner.script_keys("claim", queue, worker_id), args
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

    async def _move_then_claim(
        self, src: str, dst: str, block: float, wake_at: float | None, script: Any, keys: list[str], args: list[Any]
    ) -> tuple[bytes | None, Any]:
        """The blocking move with the claim pipelined behind it; with ``wake_at`` (a due
        time, seconds since the epoch), a timer pushes a wake-up marker to the ready list
        ``src`` at that time, so the move returns then and the claim promotes and claims
        what became due."""
        if wake_at is None:
            return await self._transport.blocking_move_then(src, dst, block, script, keys, args)
        result: tuple[bytes | None, Any] | None = None
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._wake_at, src, wake_at)
            try:
                result = await self._transport.blocking_move_then(src, dst, block, script, keys, args)
            except BaseException as exc:  # raised as it is below, not in an exception group
                error = exc
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        assert result is not None
        return result

    async def _wake_at(self, src: str, at: float) -> None:
        """At ``at`` (seconds since the epoch), push a marker to the ready list ``src``: it
        wakes a claimer blocked on it, whose claim drops it (a stale entry) and promotes
        the jobs due by then. A failure here only leaves the wait to its block chunk."""
        await trio.sleep(max(at - time.time(), 0.0))
        try:
            await self._transport.command(["RPUSH", src, "~"])
        except Exception:  # noqa: BLE001 - the blocked move ends with its chunk anyway
            pass

    async def settle(self, queue: str, worker_id: str, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not settlements:
            return []
        args: list[Any] = [worker_id, self._runner.call_token()]
        metas: dict[tuple[SettleKind, float, float, int | None], str] = {}  # a batch shares a few TTLs
        for s in settlements:
            meta = metas.get((s.kind, s.ttl, s.delay, s.keep))
            if meta is None:
                keep = "" if s.keep is None else s.keep
                meta = metas[s.kind, s.ttl, s.delay, s.keep] = f"{_KIND_CODE[s.kind]}:{ms(s.ttl)}:{ms(s.delay)}:{keep}"
            args += [s.id, s.data, meta, s.token]
        reply = await self._runner.run_shielded("settle", queue, args, worker_id)
        if len(reply) > len(settlements):
            extra = reply[len(settlements) :]
            reply = reply[: len(settlements)]
            if not isinstance(extra[0], list):  # 'tree': a job of a tree ended or waits: its tree next
                await self._trees.act(queue)
            if isinstance(extra[-1], list):  # groups whose slot was freed while full: back in the rings
                await self._runner.run_shielded("group_requeue", queue, extra[-1])
        return list(map(bool, reply))

    async def release(self, queue: str, worker_id: str, job_ids: Sequence[str], *, refund: bool = False) -> int:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not job_ids:
            return 0
        args = [worker_id, b"1" if refund else b"0", *job_ids]
        reply = await self._runner.run_shielded("release", queue, args, worker_id)
        if isinstance(reply, list):  # a job of a tree ended (cancelled): its tree next
            await self._trees.act(queue)
            reply = reply[0]
        return int(reply)

    async def start(self, queue: str, worker_id: str, claims: Sequence[tuple[str, str]]) -> list[bool]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not claims:
            return []
        args: list[Any] = [worker_id]
        for job_id, token in claims:
            args += [job_id, token]
        reply = await self._runner.run_shielded("start", queue, args, worker_id)
        if len(reply) > len(claims):  # a job of a tree ended (cancelled): its tree next
            await self._trees.act(queue)
            reply = reply[: len(claims)]
        return [bool(x) for x in reply]

    async def held_jobs(self, queue: str, worker_id: str) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        entries = await self._transport.command(["LRANGE", self._runner.plist(queue, worker_id), "0", "-1"])
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
        args: list[Any] = [worker_id, str(ms(ttl)), str(ms(lease))]
        for job_id, token in claims:
            args += [job_id, token]
        requested, lost = await self._runner.run("heartbeat", queue, args)
        return HeartbeatReply(
            [text(x) for x in requested or ()],
            [LostClaim(text(lost[i]), text(lost[i + 1]), text(lost[i + 2])) for i in range(0, len(lost or ()), 3)],
        )

    # -- reaper ------------------------------------------------------------------------

    async def recover_stalled(self, queue: str) -> tuple[list[tuple[str, str]], float | None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        runner = self._runner
        # The workers whose processing lists the script may touch: declared in KEYS.
        procs, dead = await self._transport.commands(
            [["SMEMBERS", runner.key(queue, "procs")], ["ZRANGEBYSCORE", runner.key(queue, "workers"), "-inf", f"{time.time() * 1000:.0f}"]]
        )
        workers = sorted({text(w) for w in (*(procs or ()), *(dead or ()))})
        keys = runner.keys("recover", queue, *(runner.plist(queue, w) for w in workers), *runner.flow_keys(queue))
        rec, nd, notes = await self._transport.script(runner.scripts["recover"], keys, workers)
        if int(notes):  # notes of trees: of this pass, or left by a crash after a settle
            await self._trees.act(queue)
        # Forget expired terminal jobs, a bounded slice per call, until none is due.
        while int(await self._runner.run("sweep", queue, [str(_SWEEP_SLICE)])) >= _SWEEP_SLICE:
            pass
        return [(text(i), text(s)) for i, s in rec], (float(nd) / 1000 if nd is not None else None)

    # -- workers, progress -------------------------------------------------------------

    async def unregister_worker(self, queue: str, worker_id: str) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._runner.run("unregister", queue, [worker_id], worker_id)

    async def workers(self, queue: str, *, include_expired: bool = False) -> dict[str, float]:
        await trio.lowlevel.checkpoint_if_cancelled()
        flat = await self._runner.run("workers", queue, ["1" if include_expired else "0"])
        return {text(flat[i]): float(flat[i + 1]) / 1000 for i in range(0, len(flat), 2)}

    async def set_progress(self, queue: str, worker_id: str, job_id: str, token: str, progress: bytes) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._runner.run("progress", queue, [worker_id, job_id, token, progress]))

    # -- steps -------------------------------------------------------------------------

    async def save_step(self, queue: str, worker_id: str, job_id: str, token: str, name: str, value: bytes) -> bool:
        """One ``step.lua`` call; the concurrent saves of one queue share it (see
        :class:`~trioqueue.storage._coalesce.Coalescer`), each fenced by its own claim."""
        await trio.lowlevel.checkpoint_if_cancelled()
        co = self._step_coalescers.get(queue)
        if co is None:
            co = self._step_coalescers[queue] = Coalescer(functools.partial(self._flush_steps, queue))
        [saved] = await co.submit([(worker_id, job_id, token, encode_step(name, value))])
        return bool(saved)

    async def _flush_steps(self, queue: str, batch: list[Slot]) -> None:
        """Send the step saves of ``batch`` in one script call (shielded: a cancelled
        carrier does not lose the others' outcomes) and hand each its outcome."""
        args = [x for slot in batch for entry in slot.jobs for x in entry]
        try:
            reply = await self._runner.run_shielded("step", queue, args)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            for slot in batch:
                slot.error = exc if not isinstance(exc, trio.Cancelled) else StorageError(
                    "step save interrupted: the server did not answer in time"
                )
                slot.wake()
            if isinstance(exc, trio.Cancelled):
                raise
            return
        for slot, saved in zip(batch, reply, strict=True):
            slot.result = [int(saved)]
            slot.wake()

    async def get_steps(self, queue: str, job_id: str) -> dict[str, bytes]:
        await trio.lowlevel.checkpoint_if_cancelled()
        field = STEP_FIELD + job_id.encode()
        data = await self._runner.transport.command(["HGET", self._runner.key(queue, "progress"), field])
        return decode_steps(data)

    # -- signals -----------------------------------------------------------------------

    async def signal(self, queue: str, job_id: str, name: str, payload: bytes) -> str:
        await trio.lowlevel.checkpoint_if_cancelled()
        outcome = text(await self._runner.run("signal", queue, [job_id, name, encode_step(name, payload)]))
        return "not_found" if outcome == "not_found" else "delivered"

    async def get_signals(self, queue: str, job_id: str) -> list[tuple[str, bytes]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        field = SIGNAL_FIELD + job_id.encode()
        data = await self._runner.transport.command(["HGET", self._runner.key(queue, "progress"), field])
        return decode_signals(data)

    # -- leader locks ------------------------------------------------------------------

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self._runner.lock_key(name)
        r = await self._transport.script(self._runner.scripts["lock_acquire"], [lock], [owner, str(max(1, ms(ttl)))])
        return bool(r)

    async def release_lock(self, name: str, owner: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        r = await self._transport.script(self._runner.scripts["lock_release"], [self._runner.lock_key(name)], [owner])
        return bool(r)

    # -- events (RedisEvents) ------------------------------------------------------------

    def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        """Published by the scripts on the queue's channels (see :class:`~._events.RedisEvents`)."""
        return self._events.subscribe(queue, kinds)

    # -- pause, groups ---------------------------------------------------------------

    async def set_paused(self, queue: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._runner.run("pause", queue, ["1" if paused else "0"]))

    async def is_paused(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._transport.command(["EXISTS", self._runner.key(queue, "paused")]))

    async def set_group_paused(self, queue: str, group: str, paused: bool) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._runner.run("group_pause", queue, [group, "1" if paused else "0"]))

    async def paused_groups(self, queue: str) -> list[str]:
        await trio.lowlevel.checkpoint_if_cancelled()
        names = await self._transport.command(["SMEMBERS", self._runner.key(queue, "gpaused")])
        return sorted(n.decode("utf-8", "surrogatepass") for n in names or ())

    async def group_counts(self, queue: str) -> dict[str, dict[str, int]]:
        return await self._admin.group_counts(queue)

    # -- schedules -------------------------------------------------------------------

    async def put_schedule(self, queue: str, name: str, spec: bytes, expected: bytes | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        check = ["0"] if expected is None else ["1", expected]
        return bool(await self._runner.run("schedule_put", queue, [name, spec, *check]))

    async def remove_schedule(self, queue: str, name: str) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        return bool(await self._runner.run("schedule_remove", queue, [name]))

    async def get_schedules(self, queue: str) -> dict[str, tuple[bytes, float | None]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        specs, ticks = await self._runner.run("schedule_get", queue, [])
        last = {text(ticks[i]): float(ticks[i + 1]) for i in range(0, len(ticks), 2)}
        return {text(specs[i]): (specs[i + 1], last.get(text(specs[i]))) for i in range(0, len(specs), 2)}

    async def tick_schedule(self, queue: str, name: str, tick: float, job: NewJob | None) -> bool:
        await trio.lowlevel.checkpoint_if_cancelled()
        args: list[Any] = [name, repr(float(tick))]
        if job is not None:
            await self._runner.register_name(queue)  # as an enqueue does
            args += [self._runner.call_token(), *enqueue_args(job)]
        return bool(await self._runner.run("schedule_tick", queue, args))

    # -- trees of jobs (RedisTrees) ------------------------------------------------------

    async def enqueue_flow(self, jobs: Sequence[FlowJob]) -> EnqueueOutcome:
        return await self._trees.enqueue_flow(jobs)

    async def add_children(
        self, queue: str, worker_id: str, job_id: str, token: str, children: Sequence[FlowJob], policy: str = "cancel"
    ) -> bool:
        return await self._trees.add_children(queue, worker_id, job_id, token, children, policy)

    async def get_children(self, queue: str, job_id: str) -> list[tuple[str, JobRecord]]:
        return await self._trees.get_children(queue, job_id)

    # -- registry queries and administration (RedisAdmin) ------------------------------

    async def counts(self, queue: str) -> dict[str, int]:
        return await self._admin.counts(queue)

    async def oldest(self, queue: str, state: str) -> float | None:
        return await self._admin.oldest(queue, state)

    async def list_jobs(
        self, queue: str, state: str, *, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        return await self._admin.list_jobs(queue, state, limit=limit, cursor=cursor)

    async def queue_names(self) -> list[str]:
        return await self._admin.queue_names()

    async def retry_job(self, queue: str, job_id: str, token: str, *, reset_steps: bool = False) -> bool:
        return await self._admin.retry_job(queue, job_id, token, reset_steps=reset_steps)

    async def purge(self, queue: str, state: str, *, older_than: float | None = None) -> int:
        return await self._admin.purge(queue, state, older_than=older_than)

    async def remove_job(self, queue: str, job_id: str) -> bool:
        return await self._admin.remove_job(queue, job_id)

    async def clear(self, queue: str, *, schedules: bool = False) -> int:
        return await self._admin.clear(queue, schedules=schedules)

def _job_record(queue: str, job_id: str, r: Sequence[Any]) -> JobRecord:
    """A record from the reply of the ``get_job`` script (or one item of ``get_jobs``'s)."""
    state, created, attempts, max_attempts, result, error, token, progress, priority, group, *rest = r
    tree = json.loads(rest[0]) if rest and rest[0] else {}
    return JobRecord(
        job_id,
        text(state),
        int(float(created)),
        int(float(attempts)),
        int(float(max_attempts)),
        result,
        error,
        None if token is None else text(token),
        progress,
        int(priority),
        None if "pa" not in tree else (str(tree.get("pq", queue)), str(tree["pa"])),
        len(tree.get("ch", ())),
        None if not group else text(group),
    )
