"""RedisStorage on a Redis Sentinel service, against real servers the test starts (one
primary, one replica, three sentinels: ``redis_sentinel.SentinelSet``): the primary is
found through the sentinels (also when the first one is down), a malformed Sentinel URL is
named as such, and a primary SIGKILLed under load is followed to the promoted replica.
With acknowledged writes (``replica_ack_timeout``) no acknowledged job is lost; without,
the jobs lost are counted and printed (asynchronous replication may lose some)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from redis_sentinel import SentinelSet
from redis_server import free_port
from trioqueue import Job, JobState, Queue, StorageError, ValidationError
from trioqueue.storage import from_url
from trioqueue.storage.redis import RedisStorage


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelSet]:
    """One deployment for the tests that do not fail it over."""
    with SentinelSet() as dep:
        yield dep


def _prefix() -> str:
    return f"st-{uuid.uuid4().hex[:10]}"


def _connected_port(storage: RedisStorage) -> int:
    conn = storage._transport._client._conn  # type: ignore[attr-defined]
    assert conn is not None and conn.address is not None
    return int(conn.address[1])


async def _round_trip(storage: RedisStorage) -> None:
    """A whole job through a Queue: commands, a blocking claim, pub/sub."""

    async def handler(job: Job[Any]) -> str:
        return f"hello {job.payload}"

    async with Queue(storage, handler=handler, block_timeout=0.5) as q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("greet", "sentinel") == "hello sentinel"


async def test_from_url_finds_the_primary_through_the_sentinels(deployment: SentinelSet) -> None:
    storage = from_url(deployment.url, prefix=_prefix())
    assert isinstance(storage, RedisStorage)
    await _round_trip(storage)
    async with storage:
        await storage.enqueue("q", [])
        assert _connected_port(storage) == deployment.primary.port
    assert "redis+sentinel://" in repr(storage) and "mymaster" in repr(storage)


async def test_a_sentinel_list_whose_first_sentinel_is_down_still_finds_the_primary(deployment: SentinelSet) -> None:
    dead = ("127.0.0.1", free_port())  # nobody listens there
    storage = RedisStorage.from_sentinels([dead, *deployment.addresses], service="mymaster", db=0, prefix=_prefix())
    await _round_trip(storage)
    async with storage:
        await storage.enqueue("q", [])
        assert _connected_port(storage) == deployment.primary.port


async def test_no_sentinel_that_answers_is_reported_at_once() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/mymaster/0"
    with trio.fail_after(10), pytest.raises(StorageError) as info:
        async with RedisStorage(url, prefix=_prefix()):
            pass
    assert "no sentinel named the primary of 'mymaster'" in str(info.value)


async def test_an_unknown_service_is_named(deployment: SentinelSet) -> None:
    storage = RedisStorage.from_sentinels(deployment.addresses[:1], service="nosuch", prefix=_prefix())
    with trio.fail_after(10), pytest.raises(StorageError, match="does not monitor 'nosuch'"):
        async with storage:
            pass


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379,h2:26379", "without a service name"),
        ("redis+sentinel://h1:26379,,h2/mymaster", "empty sentinel address"),
        ("redis+sentinel://h1:port/mymaster", "bad sentinel port 'port'"),
        ("redis+sentinel://h1/mymaster/zero", "database must be a number"),
        ("redis+sentinel://h1/mymaster/0/extra", "unexpected path"),
        ("redis+sentinel://h1/mymaster?replica_ack_timeout=soon", "replica_ack_timeout must be a number"),
        ("redis+sentinel://h1/mymaster?replica_ack_timeout=30", "less than request_timeout"),
    ],
)
def test_a_malformed_sentinel_url_names_the_problem(url: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        from_url(url)


def test_sentinel_options_that_do_not_go_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="no cluster"):
        RedisStorage("redis+sentinel://h1/mymaster", cluster=True)
    with pytest.raises(ValidationError, match="client="):
        RedisStorage("redis+sentinel://h1/mymaster", client=object())
    with pytest.raises(ValidationError, match="list of addresses"):
        RedisStorage.from_sentinels("h1:26379", service="mymaster")  # type: ignore[arg-type]


@pytest.mark.parametrize("ack", [1.0, None], ids=["acked-writes", "async-replication"])
async def test_a_killed_primary_is_followed_to_the_promoted_replica_under_load(ack: float | None) -> None:
    """SIGKILL the primary while a producer enqueues and a worker Queue consumes: claims
    resume on the promoted replica within 10 s. With acknowledged writes every enqueue
    that was acknowledged ends completed (the old primary comes back as a replica of the
    new one, as an operator would bring it back: until then no write can be
    acknowledged, so the producer and the settlements wait); without, the acknowledged
    jobs the promoted replica never received are counted and printed."""
    dep = SentinelSet()
    await trio.to_thread.run_sync(dep.start)
    try:
        await _failover_under_load(dep, ack)
    finally:
        await trio.to_thread.run_sync(dep.close)


async def _failover_under_load(dep: SentinelSet, ack: float | None) -> None:
    prefix = _prefix()
    producer_storage = RedisStorage(dep.url, prefix=prefix, replica_ack_timeout=ack, request_timeout=3.0)
    worker_storage = RedisStorage(dep.url, prefix=prefix, replica_ack_timeout=ack, request_timeout=3.0)
    acked: dict[str, float] = {}  # job id -> when its enqueue was acknowledged
    refused = 0  # enqueues that raised StorageError (not acknowledged: not counted)
    ran: dict[str, float] = {}  # job id -> when its handler first ran
    killed_at: float | None = None
    resumed = trio.Event()  # a job enqueued after the kill ran: claims resumed

    async def handler(job: Job[Any]) -> None:
        now = trio.current_time()
        ran.setdefault(job.id, now)
        if killed_at is not None and acked.get(job.id, 0.0) > killed_at:
            resumed.set()

    async def produce(q: Queue[Any, Any], stop: trio.Event) -> None:
        nonlocal refused
        n = 0
        while not stop.is_set():
            ids = [f"j{n + k}" for k in range(5)]
            n += 5
            try:
                results = await q.enqueue_many([(i, i) for i in ids])
            except StorageError:
                refused += 5
                continue
            now = trio.current_time()
            acked.update((r.id, now) for r in results if r.status == "queued")
            await trio.sleep(0.01)  # a steady trickle, not a flood

    producer = Queue(producer_storage, name="load")
    worker = Queue(worker_storage, name="load", handler=handler, concurrency=4, block_timeout=0.5,
                   visibility_timeout=5.0)  # fmt: skip
    stop = trio.Event()
    async with producer, worker, trio.open_nursery() as nursery:
        nursery.start_soon(produce, producer, stop)
        with trio.fail_after(10):  # load before the kill
            while len(ran) < 100:
                await trio.sleep(0.05)
        old_port = dep.primary.port
        dep.primary.kill()
        killed_at = trio.current_time()
        if ack is not None:
            # The promoted replica has no replica of its own: bring the old primary back
            # as its replica once the sentinels promoted it (polled: another process's state).
            with trio.fail_after(15):
                while (new_port := await trio.to_thread.run_sync(dep.primary_port)) == old_port:
                    await trio.sleep(0.05)
            dep.primary.extra += ["--replicaof", "127.0.0.1", str(new_port)]
            await trio.to_thread.run_sync(dep.primary.start)
        with trio.fail_after(10):
            await resumed.wait()
        resumed_after = trio.current_time() - killed_at
        after = len(acked)
        with trio.fail_after(20):  # load after the failover
            while len(acked) < after + 200:
                await trio.sleep(0.05)
        stop.set()
        new_port = await trio.to_thread.run_sync(dep.primary_port)
        assert new_port != old_port and new_port == dep.replica.port
        assert _connected_port(worker_storage) == new_port

        async def state(job_id: str) -> JobState | None:
            status = await worker.get_status(job_id)
            return None if status is None else status.state

        # every acknowledged job the new primary holds is completed in the end
        with trio.fail_after(20):
            pending = list(acked)
            while pending:
                states = {j: await state(j) for j in pending}
                lost = [j for j, s in states.items() if s is None]
                pending = [j for j, s in states.items() if s is not None and s != JobState.COMPLETED]
                if pending:
                    await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    print(
        f"\nSentinel failover ({'acknowledged writes' if ack else 'asynchronous replication'}):"
        f" claims resumed {resumed_after:.2f} s after the kill; {len(acked)} enqueues acknowledged,"
        f" {len(lost)} of them lost, {refused} refused (not acknowledged)"
    )
    if ack is not None:
        assert lost == [], f"{len(lost)} acknowledged jobs lost with acknowledged writes: {lost[:10]}"
