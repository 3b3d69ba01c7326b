"""What PostgresStorage adds to the conformance suite: transactional enqueue, URLs and the
migrate command, and the loss of its connections (they come back; listeners get resync)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1, job
from postgres_server import orders_table
from trioqueue import MemoryStorage, Queue, ValidationError
from trioqueue.storage import StorageEvent, from_url
from trioqueue.storage.postgres import Connection, ConnectionLost, PostgresStorage

TRIOQUEUE = str(Path(sys.executable).parent / "trioqueue")


async def _next_events(receive: trio.MemoryReceiveChannel[list[StorageEvent]]) -> list[tuple[str, str]]:
    with trio.fail_after(10):
        return [(e.kind, e.job_id) for e in await receive.receive()]


async def test_transactional_enqueue_commits_with_the_application_rows(pg: PostgresStorage, queue_name: str) -> None:
    table = await orders_table(pg)
    got: list[str] = []

    async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(c.id for c in await pg.dequeue(queue_name, W1, 5, 30.0, LEASE))

    async with Queue(pg, name=queue_name, reaper=False) as q, pg.subscribe(queue_name, ["enqueued"]) as events:
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:
                await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 7, 12.5)
                result = await q.enqueue("ship-7", {"order": 7}, transaction=tx)
                assert result.status.value == "queued"
                # inside the open transaction: not visible, not claimable, nothing notified
                assert await pg.get_job(queue_name, "ship-7") is None
                assert await pg.dequeue(queue_name, "other", 5, 0.05, LEASE) == []
                await q.enqueue("marker", 0)  # committed on its own: its event is the first
                assert await _next_events(events) == [("enqueued", "marker")]
                assert [c.id for c in await pg.dequeue(queue_name, "other", 5, 0.05, LEASE)] == ["marker"]
                await nursery.start(blocked_claim)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []
            # committed: the event is delivered and the waiting claim wakes and takes the job
            assert await _next_events(events) == [("enqueued", "ship-7")]
        assert got == ["ship-7"]
    async with pg.pool.connection() as conn:
        assert await conn.fetch(f"SELECT id FROM {table}") == [(7,)]


async def test_transactional_enqueue_rolls_back_with_the_application(pg: PostgresStorage, queue_name: str) -> None:
    table = await orders_table(pg)
    async with Queue(pg, name=queue_name, reaper=False) as q:
        with pytest.raises(RuntimeError, match="payment declined"):
            async with pg.transaction() as tx:
                await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 8, 3)
                await q.enqueue_many([("ship-8", 8), ("mail-8", 8)], transaction=tx)
                raise RuntimeError("payment declined")
        assert await pg.get_job(queue_name, "ship-8") is None and await pg.get_job(queue_name, "mail-8") is None
        assert await pg.dequeue(queue_name, W1, 5, 0.05, LEASE) == []
        # a cancelled block rolls back too
        with trio.move_on_after(0.5):
            async with pg.transaction() as tx:
                await q.enqueue("ship-9", 9, transaction=tx)
                await tx.execute("SELECT pg_sleep(5)")
        assert await pg.get_job(queue_name, "ship-9") is None
        async with pg.pool.connection() as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
        # enqueue_many commits all of them, in order
        async with pg.transaction() as tx:
            out = await q.enqueue_many([("a", 1), ("b", 2), ("a", 3)], transaction=tx)
        assert [r.status.value for r in out] == ["queued", "queued", "duplicate"]
        assert [c.id for c in await pg.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["a", "b"]


async def test_transaction_misuse_is_refused_naming_the_job(pg: PostgresStorage, postgres_url: str, queue_name: str) -> None:
    async with PostgresStorage(postgres_url, schema=pg.schema) as other, Queue(pg, name=queue_name, reaper=False) as q:
        async with other.transaction() as foreign:
            with pytest.raises(ValidationError, match=r"job 'x'.*this storage's transaction"):
                await q.enqueue("x", 1, transaction=foreign)
        async with pg.transaction() as tx:
            pass
        with pytest.raises(ValidationError, match=r"job 'y'.*has ended"):
            await q.enqueue("y", 1, transaction=tx)
        assert await pg.get_job(queue_name, "x") is None and await pg.get_job(queue_name, "y") is None
    async with Queue(MemoryStorage(), name=queue_name, reaper=False) as mq:
        with pytest.raises(ValidationError, match=r"job 'z'.*needs a storage with transactions"):
            await mq.enqueue("z", 1, transaction=object())


def test_from_url_postgres_forms() -> None:
    st = from_url("postgresql://u:p@db.example:5433/jobs?schema=jobs_a&sslmode=disable")
    assert isinstance(st, PostgresStorage) and st.schema == "jobs_a"
    assert st.url == "postgresql://u:p@db.example:5433/jobs?sslmode=disable"
    assert isinstance(from_url("postgres://u@h/db"), PostgresStorage)
    assert from_url("postgres://u@h/db", schema="s2").schema == "s2"  # type: ignore[attr-defined]
    fast = from_url("postgresql://u@h/db?synchronous_commit=off&application_name=x")
    assert fast.synchronous_commit is False and fast.url == "postgresql://u@h/db?application_name=x"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="synchronous_commit must be on or off"):
        from_url("postgresql://u@h/db?synchronous_commit=maybe")
    assert from_url("postgresql://u@h/db?call_timeout=2.5").call_timeout == 2.5  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="call_timeout must be a number of seconds, got 'soon'"):
        from_url("postgresql://u@h/db?call_timeout=soon")
    with pytest.raises(ValidationError, match="call_timeout must be a positive number of seconds"):
        from_url("postgresql://u@h/db?call_timeout=0")
    with pytest.raises(ValidationError, match="schema must be.*Bad-1"):
        from_url("postgresql://u@h/db?schema=Bad-1")


async def test_migrate_command(postgres_url: str) -> None:
    schema = f"m_{uuid.uuid4().hex[:10]}"

    async def run(*args: str) -> Any:
        cmd = [TRIOQUEUE, "migrate", "--storage", f"{postgres_url}?schema={schema}", "--json", *args]
        with trio.fail_after(60):
            proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        return json.loads(proc.stdout)

    first = await run()
    assert first["schema"] == schema and first["applied"] and first["version"] == first["applied"][-1]
    assert (await run())["applied"] == []
    # a storage opened with migrate=False uses the schema as the command left it
    async with PostgresStorage(postgres_url, schema=schema, migrate=False) as st:
        await st.enqueue("q", [job("a")])
        assert await st.schema_version() == first["version"]


async def _terminate_others(postgres_url: str, application_name: str | None = None) -> int:
    async with await Connection.connect(postgres_url) as admin:
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND application_name = $1",
                application_name or "",
            )
        )


async def test_connection_loss_mid_listen_resyncs_and_recovers(postgres_url: str, queue_name: str) -> None:
    app = f"tq-{uuid.uuid4().hex[:8]}"
    url = f"{postgres_url}?application_name={app}"
    async with PostgresStorage(url, schema=f"t_{uuid.uuid4().hex[:12]}") as st:
        async with st.subscribe(queue_name) as events:
            await st.enqueue(queue_name, [job("before")])
            assert await _next_events(events) == [("enqueued", "before")]
            assert await _terminate_others(postgres_url, app) >= 2  # the listener and a pooled one
            # the listener reconnects: a resync, then events flow again
            assert await _next_events(events) == [("resync", "")]
            await st.enqueue(queue_name, [job("after")])  # (its pooled connection was dropped too)
            assert await _next_events(events) == [("enqueued", "after")]

        # a claim blocked across the loss of the listening connection still wakes
        got: list[str] = []

        async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            got.extend(c.id for c in await st.dequeue(queue_name, W1, 5, 30.0, LEASE) if c.id == "late")

        claimed = await st.dequeue(queue_name, W1, 5, 0.05, LEASE)
        assert sorted(c.id for c in claimed) == ["after", "before"]
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(blocked_claim)
                await trio.testing.wait_all_tasks_blocked()
                await _terminate_others(postgres_url, app)
                await st.enqueue(queue_name, [job("late")])
        assert got == ["late"]
        # the claims made before the losses are intact, and settle
        held = dict.fromkeys(await st.held_jobs(queue_name, W1))
        assert set(held) == {"before", "after", "late"}


async def test_synchronous_commit_off_spares_the_application_transactions(postgres_url: str, queue_name: str) -> None:
    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}", synchronous_commit=False) as st:
        async with st.pool.connection() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
        async with st.transaction() as tx:
            assert await tx.fetchval("SHOW synchronous_commit") == "on"
        await st.enqueue(queue_name, [job("a")])
        assert [c.id for c in await st.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["a"]


async def test_worker_survives_repeated_connection_loss_and_loses_nothing(postgres_url: str, queue_name: str) -> None:
    """Every connection of the storage (the listener, pooled ones mid-claim and
    mid-settle) terminated again and again while a worker runs: every job completes
    (the event stream may lose events meanwhile, resync says so: the test counts in the
    table)."""
    from trioqueue import Job

    app = f"tq-{uuid.uuid4().hex[:8]}"
    storage = PostgresStorage(f"{postgres_url}?application_name={app}", schema=f"t_{uuid.uuid4().hex[:12]}")

    async def handler(job: Job[int]) -> int:
        await trio.sleep(0.002)
        return job.payload * 2

    async with Queue(storage, name=queue_name, handler=handler, concurrency=20, block_timeout=0.5) as q:
        terminated = 0
        await q.enqueue_many([(f"j{i}", i) for i in range(300)])
        with trio.fail_after(120):
            while True:
                terminated += await _terminate_others(postgres_url, app)
                try:
                    counts = await storage.counts(queue_name)
                except ConnectionLost:
                    continue  # (terminated under our own call)
                if counts["completed"] == 300:
                    break
                await trio.sleep(0.05)  # a little work between two terminations
        assert terminated >= 3
        for i in (0, 150, 299):
            status = await q.get_status(f"j{i}")
            assert status is not None and status.state.value == "completed" and status.result == 2 * i


async def test_one_job_enqueue_notifies_and_wakes(pg: PostgresStorage, queue_name: str) -> None:
    """The one-statement enqueue (one job, ready now, a queue this storage has seen)
    sends its event and its wake-up like the general path."""
    await pg.enqueue(queue_name, [job("first")])  # (the general path: the queue's row)
    assert [c.id for c in await pg.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["first"]
    got: list[str] = []

    async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(c.id for c in await pg.dequeue(queue_name, W1, 5, 30.0, LEASE))

    async with pg.subscribe(queue_name, ["enqueued"]) as events:
        with trio.fail_after(2):  # well before the 5 s polling fallback
            async with trio.open_nursery() as nursery:
                await nursery.start(blocked_claim)
                await trio.testing.wait_all_tasks_blocked()
                [out] = await pg.enqueue(queue_name, [job("second")])
                assert out.status.value == "queued"
        assert await _next_events(events) == [("enqueued", "second")]
    assert got == ["second"]
    [dup] = await pg.enqueue(queue_name, [job("second")])
    assert dup.status.value == "duplicate" and dup.token == "t-second"


@pytest.mark.parametrize("phase", ["waiting", "listening", "claiming"])
async def test_closing_the_storage_ends_a_blocked_claim(postgres_url: str, queue_name: str, phase: str) -> None:
    """Whatever phase of the claim the close lands in, the claim ends with the storage's
    "not open" error, never the closed connection's ``ConnectionLost``: wherever the claim
    first blocks (mostly its wait for a wake-up), with its ``LISTEN`` in flight, or with
    its claim statement in flight (those two held in flight by a black-holed network, so
    the close lands there every time)."""
    from urllib.parse import urlsplit

    from tcp_proxy import BlackHoleProxy

    target = urlsplit(postgres_url)
    proxy = BlackHoleProxy(target.hostname or "127.0.0.1", target.port or 5432)
    outcome: list[str] = []
    async with trio.open_nursery() as servers:
        await servers.start(proxy.serve)
        proxied = target._replace(netloc=f"{target.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
        storage = PostgresStorage(postgres_url if phase == "waiting" else proxied, schema=f"t_{uuid.uuid4().hex[:12]}")
        await storage.open()
        # the listening connection is open; "claiming": this queue's LISTEN is in force too
        await storage.dequeue(queue_name if phase == "claiming" else "other", W1, 1, 0, LEASE)
        if phase != "waiting":
            proxy.black_hole()

        async def claimer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            try:
                await storage.dequeue(queue_name, W1, 1, 30.0, LEASE)
            except RuntimeError as exc:
                outcome.append(str(exc))

        with trio.fail_after(10):  # not the claim's 30 s
            async with trio.open_nursery() as nursery:
                await nursery.start(claimer)
                await trio.testing.wait_all_tasks_blocked()
                await storage.aclose()
        servers.cancel_scope.cancel()
    assert outcome == ["PostgresStorage is not open: use `async with storage:`"]


async def test_large_results_and_long_ids_fit_in_notifications(pg: PostgresStorage, queue_name: str) -> None:
    """A completion's event carries its result while the payload fits NOTIFY's 8000
    bytes; a larger one is left out of the event (it stays in the record); with ids
    (and tokens) so long that even that does not fit, the event is a ``resync``."""
    from trioqueue.storage import Settlement, SettleKind

    long_id = '"' * 1024
    worker = "\\" * 1024
    await pg.enqueue(queue_name, [job("small"), job(long_id), job("big")])
    claims = {c.id: c for c in await pg.dequeue(queue_name, worker, 5, 0.05, LEASE)}
    edge, big = b"\xff" * 1000, b"x" * 100_000
    async with pg.subscribe(queue_name, ["completed"]) as events:
        out = await pg.settle(
            queue_name,
            worker,
            [
                Settlement(SettleKind.COMPLETE, "small", b"42", 60, token=claims["small"].token),
                Settlement(SettleKind.COMPLETE, long_id, edge, 60, token=claims[long_id].token),
                Settlement(SettleKind.COMPLETE, "big", big, 60, token=claims["big"].token),
            ],
        )
        assert out == [True, True, True]
        seen: list[StorageEvent] = []
        with trio.fail_after(10):
            while len(seen) < 3:
                seen += await events.receive()
    by_id = {e.job_id: e for e in seen}
    assert by_id["small"].result == b"42" and by_id[long_id].result == edge and by_id["big"].result is None
    assert by_id[long_id].worker_id == worker
    rec = await pg.get_job(queue_name, "big")
    assert rec is not None and rec.result == big
    # an id, a worker id and a token each of 1024 escaped characters: no room left
    huge = "\x01" * 1024
    await pg.enqueue(queue_name, [job(huge)])
    [c] = await pg.dequeue(queue_name, worker, 1, 0.05, LEASE)
    async with pg.subscribe(queue_name, ["completed"]) as events:
        assert await pg.settle(queue_name, worker, [Settlement(SettleKind.COMPLETE, huge, b"1", 60, token=c.token)]) == [True]
        with trio.fail_after(10):
            assert [(e.kind, e.job_id) for e in await events.receive()] == [("resync", "")]
    rec = await pg.get_job(queue_name, huge)
    assert rec is not None and rec.result == b"1"


async def test_completions_settled_together_are_packed_in_order_into_few_notifications(
    pg: PostgresStorage, queue_name: str
) -> None:
    """One settlement of 300 jobs sends their events several to a NOTIFY payload (each
    under 8000 bytes), in the order settled, each with its result; with one result over
    half a payload among them, one event a payload, in order still."""
    from trioqueue.storage import Settlement, SettleKind

    for rnd, big in enumerate((None, 150)):
        ids = [f"r{rnd}-{i}" for i in range(300)]
        await pg.enqueue(queue_name, [job(i) for i in ids])
        claims = {c.id: c for c in await pg.dequeue(queue_name, W1, 300, 0.05, LEASE)}
        results = {i: (b"y" * 2900 if n == big else b'"%d"' % n) for n, i in enumerate(ids)}
        async with pg.subscribe(queue_name, ["completed"]) as events:
            done = [Settlement(SettleKind.COMPLETE, i, results[i], 60, token=claims[i].token) for i in ids]
            assert await pg.settle(queue_name, W1, done) == [True] * 300
            notes: list[list[StorageEvent]] = []
            with trio.fail_after(10):
                while sum(map(len, notes)) < 300:
                    notes.append(await events.receive())
        assert [e.job_id for n in notes for e in n] == ids
        assert all(e.result == results[e.job_id] for n in notes for e in n)
        assert len(notes) == (300 if big is not None else pytest.approx(10, abs=8))


async def test_children_ending_together_queue_their_parent_exactly_once(pg: PostgresStorage, queue_name: str) -> None:
    """Children of one parent settled concurrently (each its own transaction, on its own
    connection) serialise on the parent row: the count reaches zero once, the parent is
    queued once, and a failed child under ``continue`` is counted like the others."""
    from trioqueue.storage import SettleKind, Settlement
    from trioqueue.storage._base import FlowJob

    kids = [f"kid-{i}" for i in range(12)]
    tree = [FlowJob(queue_name, job("root"), None, "continue")]
    tree += [FlowJob(queue_name, job(k), (queue_name, "root")) for k in kids]
    await pg.enqueue_flow(tree)
    assert (await pg.get_job(queue_name, "root")).state.startswith("waiting_children:")  # type: ignore[union-attr]
    claims = await pg.dequeue(queue_name, W1, 20, 0.1, LEASE)
    assert sorted(c.id for c in claims) == sorted(kids)

    async def settle(i: int) -> None:
        c = claims[i]
        kind = SettleKind.FAIL if i == 3 else SettleKind.COMPLETE
        assert await pg.settle(queue_name, W1, [Settlement(kind, c.id, b"x", 60, token=c.token)]) == [True]

    async with pg.subscribe(queue_name, ["promoted"]) as events:
        async with trio.open_nursery() as nursery:
            for i in range(len(claims)):
                nursery.start_soon(settle, i)
        assert await _next_events(events) == [("promoted", "root")]
    [parent] = await pg.dequeue(queue_name, W1, 5, 0.1, LEASE)
    assert parent.id == "root"
    assert [c.id for _, c in await pg.get_children(queue_name, "root")] == [k for k in kids]
    async with pg.pool.connection() as conn:
        assert await conn.fetchval(f"SELECT pending FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'root'", queue_name) == 0
        # kept while the parent may read them
        assert await conn.fetchval(
            f"SELECT count(*) FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND parent_id = 'root' AND expires_ms IS NULL",
            queue_name,
        ) == len(kids)


@pytest.mark.parametrize("where", ["refused", "unknown-host"])
async def test_a_missing_server_is_reported_at_once_naming_host_and_port(where: str) -> None:
    """A port nobody listens on, or a host name that does not resolve: opening a Queue on
    it raises one ConnectionLost naming the server (the SQLSTATE once), without the 30 s
    of reconnect retries meant for a server lost while running (the guard only stops a
    hang)."""
    from postgres_server import free_port

    host, port = ("127.0.0.1", free_port()) if where == "refused" else ("no-such-host.invalid", 5432)
    storage = PostgresStorage(f"postgresql://u@{host}:{port}/db", schema="t_missing")
    with trio.fail_after(15), pytest.raises(Exception) as info:
        async with Queue(storage, name="jobs"):
            pass
    exc = info.value
    assert isinstance(exc, ConnectionLost), repr(exc)
    message = str(exc)
    assert message.startswith(f"cannot connect to PostgreSQL at {host}:{port}: "), message
    assert message.count("SQLSTATE") == 1, message
    assert ("refused" if where == "refused" else "resolve") in message, message
