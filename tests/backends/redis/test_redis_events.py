"""RedisStorage-specific tests: events over pub/sub, against real servers. No fakes.

The binary event codec, the channels a producer, a worker and a waiter subscribe to,
events published only while someone listens to every event (the listening key), and a
subscriber that resyncs when that key was gone, or keeps it alive past its TTL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from redis_helpers import _calls, _done, _job, _prefix

from trioqueue.storage import StorageEvent
from trioqueue.storage.redis import RedisStorage
from trioqueue.storage.redis._events import decode_events


@pytest.fixture
async def st(redis_url: str) -> AsyncIterator[RedisStorage]:
    s = RedisStorage(redis_url, prefix=_prefix())
    async with s:
        yield s


def test_event_codec_roundtrip_binary() -> None:
    # fields are length-prefixed: colons, dashes and NULs in results survive
    payload = b"9:completed3:a:b2:w14:-:\x00-" + b"-" + b"3:t:1" + b"6:failed1:x--3:e:--"
    assert decode_events(payload) == [
        StorageEvent("completed", "a:b", "w1", b"-:\x00-", None, "t:1"),
        StorageEvent("failed", "x", None, None, b"e:-", None),
    ]


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
                # switched over: the old connection's unsubscribe reaches the server after
                # the new subscription (the server's own count, polled: it announces nothing)
                await _until_numsub(st, "wire", {"events": 1, "notices": 1})


async def _until_numsub(st: RedisStorage, queue: str, expected: dict[str, int]) -> None:
    with trio.fail_after(10):
        while (counts := await _numsub(st, queue)) != expected:
            assert counts["events"] <= expected["events"], counts  # never more than asked for
            await trio.sleep(0.01)


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
