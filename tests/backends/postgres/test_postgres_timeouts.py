"""A PostgreSQL server that stops answering (its processes stopped with SIGSTOP): each
call of PostgresStorage ends with ``CallTimeout`` (a ``StorageError``) after its
``call_timeout``, its connection discarded, instead of hanging; once the server answers
again, so do the calls, and a worker carries on by itself."""

from __future__ import annotations

import uuid

import pytest
import trio

pytest.importorskip("psycopg")

from postgres_server import PostgresServer
from storage_helpers import LEASE, W1, job
from trioqueue import Job, Queue, QueueEvent, ValidationError
from trioqueue.storage.postgres import CallTimeout, PostgresStorage

TIMEOUT = 1.0
SLACK = 2.5  # the cancel request a timed-out statement sends waits up to 1 s, and the machine is busy


async def test_calls_to_a_server_that_stops_answering_time_out_and_recover(
    private_postgres: PostgresServer, queue_name: str
) -> None:
    server = private_postgres
    storage = PostgresStorage(server.url, schema=f"t_{uuid.uuid4().hex[:12]}", call_timeout=TIMEOUT)
    async with storage:
        await storage.enqueue(queue_name, [job("a")])
        connects = storage.pool.connects
        calls = [
            ("a statement on an open connection", lambda: storage.counts(queue_name)),
            ("a connect", lambda: storage.get_job(queue_name, "a")),
            ("a transaction", lambda: storage.enqueue(queue_name, [job("b"), job("c")])),
            ("a claim (LISTEN, then the claim)", lambda: storage.dequeue(queue_name, W1, 5, 30.0, LEASE)),
        ]
        server.freeze()
        try:
            for what, call in calls:
                started = trio.current_time()
                with trio.fail_after(TIMEOUT + SLACK), pytest.raises(CallTimeout):
                    await call()
                assert trio.current_time() - started >= TIMEOUT * 0.9, what
            # an application transaction: its BEGIN is bounded too
            with trio.fail_after(TIMEOUT + SLACK), pytest.raises(CallTimeout):
                async with storage.transaction():
                    pass
        finally:
            server.thaw()
        with trio.fail_after(30):
            assert (await storage.counts(queue_name))["queued"] >= 1
            claimed = await storage.dequeue(queue_name, W1, 5, 1.0, LEASE)
            assert "a" in {c.id for c in claimed}
        assert storage.pool.connects > connects  # (the timed-out connections were discarded)


async def test_a_worker_is_not_hung_by_a_server_that_stops_answering(
    private_postgres: PostgresServer, queue_name: str
) -> None:
    """While the server is stopped the worker's calls fail (``error`` events naming the
    timeout) instead of hanging; thawed, it runs every job."""
    server = private_postgres
    storage = PostgresStorage(server.url, schema=f"t_{uuid.uuid4().hex[:12]}", call_timeout=TIMEOUT)
    timed_out = trio.Event()
    halfway = trio.Event()
    ran: set[str] = set()

    def on_error(event: QueueEvent) -> None:
        if isinstance(event.data.get("error"), CallTimeout):  # (a StorageError)
            timed_out.set()

    async def handler(job: Job[int]) -> int:
        ran.add(job.id)
        if len(ran) >= 20:
            halfway.set()
        await trio.sleep(0.01)
        return job.payload

    # (a claim that timed out may still have been served: its jobs come back when their
    # lease runs out, hence a short one)
    async with Queue(
        storage, name=queue_name, handler=handler, concurrency=5, block_timeout=0.5, visibility_timeout=3.0
    ) as q:
        q.on("error", on_error)
        await q.enqueue_many([(f"j{i}", i) for i in range(100)])
        with trio.fail_after(30):
            await halfway.wait()
        server.freeze()
        try:
            with trio.fail_after(TIMEOUT + 10):
                await timed_out.wait()
        finally:
            server.thaw()
        with trio.fail_after(60):
            while (await storage.counts(queue_name))["completed"] < 100:
                await trio.sleep(0.05)  # bounded poll of the table
    assert ran == {f"j{i}" for i in range(100)}


def test_call_timeout_must_be_positive_seconds() -> None:
    for bad in (0, -1.0, float("inf"), "5"):
        with pytest.raises(ValidationError, match="call_timeout must be a positive number of seconds"):
            PostgresStorage("postgresql://u@h/db", call_timeout=bad)  # type: ignore[arg-type]


async def test_a_black_holed_network_is_found_out_and_subscribers_resync(postgres_url: str, queue_name: str) -> None:
    """Every connection of the storage goes through a proxy that black-holes them (bytes
    swallowed, no close, no reset): calls time out instead of hanging; once the network
    is back, the listening connection (dead for good, and silent) is found out by its
    ping, reopened, and the subscriber gets ``resync``, then events again."""
    from urllib.parse import urlsplit

    from tcp_proxy import BlackHoleProxy

    target = urlsplit(postgres_url)
    proxy = BlackHoleProxy(target.hostname or "127.0.0.1", target.port or 5432)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        url = target._replace(netloc=f"{target.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
        storage = PostgresStorage(url, schema=f"t_{uuid.uuid4().hex[:12]}", call_timeout=TIMEOUT, poll_interval=0.5)
        async with storage, storage.subscribe(queue_name) as events:
            await storage.enqueue(queue_name, [job("before")])
            with trio.fail_after(10):
                assert [(e.kind, e.job_id) for e in await events.receive()] == [("enqueued", "before")]
            proxy.black_hole()
            for call in (lambda: storage.counts(queue_name), lambda: storage.enqueue(queue_name, [job("lost")])):
                with trio.fail_after(TIMEOUT + SLACK), pytest.raises(CallTimeout):
                    await call()
            proxy.heal()
            with trio.fail_after(20):  # the ping (every 0.5 s of quiet) times out, the listener reconnects
                seen = [(e.kind, e.job_id) for e in await events.receive()]
            assert seen == [("resync", "")]
            await storage.enqueue(queue_name, [job("after")])
            with trio.fail_after(10):
                assert [(e.kind, e.job_id) for e in await events.receive()] == [("enqueued", "after")]
        nursery.cancel_scope.cancel()
