"""A whole PostgreSQL server restarted (same data directory, same port) under a running
worker and a producer: the worker carries on by itself once the server is back, nothing
acknowledged is lost (every job enqueued ends completed, exactly the set enqueued, each
run to completion once it was acknowledged), and listeners get ``resync``.

Each test runs a server of its own (``private_postgres``): the suite's shared server is
never stopped."""

from __future__ import annotations

import uuid

import pytest
import trio

pytest.importorskip("psycopg")

from postgres_server import PostgresServer
from trioqueue import Job, Queue, StorageError
from trioqueue.storage.postgres import Connection, PostgresStorage

JOBS = 200


async def _jobs_table(url: str, schema: str, queue: str) -> dict[str, str]:
    async with await Connection.connect(url) as conn:
        rows = await conn.fetch(f'SELECT id, state FROM "{schema}".jobs WHERE queue = $1', queue)
    return dict(rows)


@pytest.mark.parametrize(
    ("immediate", "down", "call_timeout"),
    [(False, 1.0, 10.0), (True, 1.0, 10.0), (False, 4.0, 1.0)],
    ids=["fast-shutdown", "immediate-shutdown", "down-longer-than-call-timeout"],
)
async def test_a_worker_rides_out_a_server_restart_and_loses_nothing(
    private_postgres: PostgresServer, queue_name: str, immediate: bool, down: float, call_timeout: float
) -> None:
    """The server stops (fast: a checkpoint; immediate: as a crash, recovered from the
    WAL at the next start) while a worker runs jobs and a producer enqueues, and starts
    again on the same port ``down`` seconds later: the producer's enqueues that raised
    meanwhile are retried (same id: idempotent), the worker resumes on its own (also
    after an outage longer than its calls' limit, when every call and reconnect fails
    for a while), every job completes, and the queue's listeners get ``resync``."""
    server = private_postgres
    schema = f"t_{uuid.uuid4().hex[:12]}"
    storage = PostgresStorage(server.url, schema=schema, reconnect_timeout=60.0, call_timeout=call_timeout)
    ran: set[str] = set()
    resynced = trio.Event()
    halfway = trio.Event()

    async def handler(job: Job[int]) -> int:
        ran.add(job.id)
        if len(ran) >= JOBS // 4:
            halfway.set()
        await trio.sleep(0.005)
        return job.payload

    async def produce() -> None:
        for i in range(JOBS):
            while True:  # an enqueue that raised may or may not have landed: the same id again
                try:
                    await q.enqueue(f"j{i}", i)
                    break
                except StorageError:
                    await trio.sleep(0.05)
            if i % 10 == 0:
                await trio.sleep(0.01)  # a steady trickle, across the restart

    async with Queue(storage, name=queue_name, handler=handler, concurrency=10, block_timeout=0.5) as q:
        q.on("resync", lambda _event: resynced.set())
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                await halfway.wait()
                await trio.to_thread.run_sync(lambda: server.stop(immediate=immediate))
                await trio.sleep(down)  # down for a while: calls fail, reconnects back off
                await trio.to_thread.run_sync(server.start)
            # every job completes: bounded poll of the table (the event stream may lose
            # events across the restart; resync says so)
            while True:
                try:
                    counts = await storage.counts(queue_name)
                except StorageError:
                    counts = {}
                if counts.get("completed") == JOBS:
                    break
                await trio.sleep(0.05)
            # the listener reconnects on its own schedule (its backoff), maybe after the last job
            await resynced.wait()
    table = await _jobs_table(server.url, schema, queue_name)
    assert set(table) == {f"j{i}" for i in range(JOBS)}
    assert set(table.values()) == {"completed"}
    assert ran == set(table)
