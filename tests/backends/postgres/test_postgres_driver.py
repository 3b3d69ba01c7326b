"""The Trio-native PostgreSQL driver (``trioqueue.storage.postgres``) on a real server."""

from __future__ import annotations

import datetime as dt

import pytest
import trio
from postgres_server import PostgresServer, free_port

pytest.importorskip("psycopg")

from trioqueue.storage.postgres import (
    Connection,
    ConnectionLost,
    Pool,
    PostgresError,
    QueryCanceled,
    UniqueViolation,
)


async def test_typed_parameters_and_results(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        row = await conn.fetchrow(
            "SELECT $1::bigint, $2::text, $3::bytea, $4::float8, $5::bool, $6::text, $7::text[], $8::timestamptz",
            2**40,
            "héllo",
            b"\x00\xff",
            1.5,
            True,
            None,
            ["a", "b"],
            dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        )
        assert row == (2**40, "héllo", b"\x00\xff", 1.5, True, None, ["a", "b"], dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
        awkward = [b"it's", b'a\\b"\x00{,}', b""]
        assert await conn.fetchval("SELECT $1::bytea[]", awkward) == awkward
        assert await conn.fetchval("SELECT $1::text[]", ["it's", 'a\\b"{,}', ""]) == ["it's", 'a\\b"{,}', ""]
        res = await conn.execute("SELECT g, g * 2 AS twice FROM generate_series(1, 3) g")
        assert res.rows == [(1, 2), (2, 4), (3, 6)] and res.columns == ["g", "twice"] and res.rowcount == 3
        await conn.execute_script("CREATE TEMP TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
        res = await conn.execute("UPDATE t SET id = id + 10 WHERE id > $1", 0)
        assert res.status == "UPDATE 2" and res.rowcount == 2


async def test_array_parameters_keep_every_value(postgres_url: str) -> None:
    """Lists of str, bytes, float and int (the storage's batches, encoded as binary
    arrays; ints as int8, cast by the statement) come back as they went, NULLs, escapes,
    NULs in bytes, non-finite floats and the ends of int2 and int8 too; other lists
    (bools, mixed, empty, ints past int8) still go through psycopg; each in an unnest."""
    texts = ["it's", 'a\\b"{,}', "", None, "héllo ✓", "NULL"]
    blobs = [b"\x00\xff", None, b"", b'{"a":1}' * 300]
    floats = [1.5, None, float("inf"), -0.0, 1e-300]
    async with await Connection.connect(postgres_url) as conn:
        for _ in range(3):  # (the second run prepares the statement)
            row = await conn.fetchrow("SELECT $1::text[], $2::bytea[], $3::float8[], $4::int[], $5::text[]", texts, blobs, floats, [1, None, 2**31 - 1], [])
            assert row == (texts, blobs, floats, [1, None, 2**31 - 1], [])
            ints = await conn.fetchrow("SELECT $1::int2[], $2::int8[], $3::bool[], $4::numeric[]", [-32768, None, 32767], [-(2**63), 2**63 - 1], [True, False], [2**70])
            assert ints == ([-32768, None, 32767], [-(2**63), 2**63 - 1], [True, False], [2**70])
        with pytest.raises(PostgresError):  # past int2: the server's cast says so, the connection stays
            await conn.fetchval("SELECT $1::int2[]", [40000])
        nan = await conn.fetchval("SELECT $1::float8[]", [float("nan")])
        assert nan[0] != nan[0]
        rows = await conn.fetch("SELECT * FROM unnest($1::text[], $2::float8[]) WITH ORDINALITY", ["a", "b"], [0.5, 2.0])
        assert rows == [("a", 0.5, 1), ("b", 2.0, 2)]
        with pytest.raises(PostgresError):  # a str that is not text: the server says so, the connection stays
            await conn.fetchval("SELECT $1::text[]", ["nul\x00byte"])
        assert await conn.fetchval("SELECT $1::text[]", ["ok"]) == ["ok"]


async def test_host_names_resolved_through_trio(postgres_url: str) -> None:
    url = postgres_url.replace("127.0.0.1", "localhost")
    async with await Connection.connect(url) as conn:
        assert await conn.fetchval("SELECT inet_server_addr()::text") in ("127.0.0.1/32", "::1/128")


async def test_errors_carry_sqlstate_and_leave_connection_usable(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        with pytest.raises(PostgresError) as info:
            await conn.execute("SELECT * FROM no_such_table")
        assert info.value.sqlstate == "42P01" and "no_such_table" in str(info.value)
        await conn.execute("CREATE TEMP TABLE u (id int PRIMARY KEY)")
        await conn.execute("INSERT INTO u VALUES ($1)", 1)
        with pytest.raises(UniqueViolation) as dup:
            await conn.execute("INSERT INTO u VALUES ($1)", 1)
        assert dup.value.sqlstate == "23505" and dup.value.detail and "(id)=(1)" in dup.value.detail
        assert await conn.fetchval("SELECT count(*) FROM u") == 1


async def test_cancel_running_query_then_reuse(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        pid = conn.backend_pid
        t0 = trio.current_time()
        with trio.move_on_after(0.2) as scope:
            await conn.execute("SELECT pg_sleep(5)")
        assert scope.cancelled_caught
        assert trio.current_time() - t0 < 2.0  # the server stopped sleeping: cancelled, not waited out
        assert not conn.closed and conn.backend_pid == pid
        assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
        # inside a transaction: the cancel leaves it failed, ROLLBACK makes the session usable
        await conn.execute("BEGIN")
        with trio.move_on_after(0.1):
            await conn.execute("SELECT pg_sleep(5)")
        assert conn.in_transaction
        with pytest.raises(PostgresError) as info:
            await conn.execute("SELECT 1")
        assert info.value.sqlstate == "25P02"  # in failed transaction
        await conn.execute("ROLLBACK")
        assert await conn.fetchval("SELECT 7") == 7


async def test_statement_timeout_is_query_canceled(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute("SET statement_timeout = 50")
        with pytest.raises(QueryCanceled) as info:
            await conn.execute("SELECT pg_sleep(2)")
        assert info.value.sqlstate == "57014"


async def test_listen_notify(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as listener, await Connection.connect(postgres_url) as talker:
        await listener.execute('LISTEN "chan one"')
        got: list[tuple[str, str]] = []

        async def receive(task_status=trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while len(got) < 3:
                got.extend((n.channel, n.payload) for n in await listener.notifications())

        async with trio.open_nursery() as nursery:
            await nursery.start(receive)
            await talker.execute("SELECT pg_notify($1, $2)", "chan one", "a")
            await talker.execute("SELECT pg_notify($1, $2)", "chan one", "b")
            await talker.execute("SELECT pg_notify($1, $2)", "other", "x")
            await talker.execute("SELECT pg_notify($1, $2)", "chan one", "c")
        assert got == [("chan one", "a"), ("chan one", "b"), ("chan one", "c")]
        # a wait for notifications is cancellable and leaves the connection usable
        with trio.move_on_after(0.05):
            await listener.notifications()
        assert await listener.fetchval("SELECT 1") == 1


async def test_connect_failure_is_connection_lost() -> None:

    with pytest.raises(ConnectionLost) as info:
        await Connection.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", timeout=2)
    assert info.value.sqlstate == "08001"


async def test_permanent_connect_errors_are_not_retried(postgres_url: str) -> None:
    """An unknown database (or role, or a wrong password) fails at once, with its
    SQLSTATE, instead of being retried for the pool's reconnect_timeout."""
    bad = postgres_url.rsplit("/", 1)[0] + "/no_such_db"
    with trio.fail_after(5):
        async with Pool(bad, reconnect_timeout=30.0) as pool:
            with pytest.raises(PostgresError) as info:
                async with pool.connection():
                    pass
    assert not isinstance(info.value, ConnectionLost) and info.value.sqlstate == "3D000"
    assert "no_such_db" in str(info.value)


async def test_terminated_backend_raises_then_pool_reconnects(postgres_url: str) -> None:
    async with Pool(postgres_url, size=2) as pool, await Connection.connect(postgres_url) as admin:
        async with pool.connection() as conn:
            pid = conn.backend_pid
            assert await conn.fetchval("SELECT 1") == 1
        assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid) is True  # (waits for the exit)
        # the idle connection is broken: the pool notices when lending it, and reconnects
        async with pool.connection() as conn:
            assert conn.backend_pid != pid and await conn.fetchval("SELECT 2") == 2
        # a connection in hand that breaks says so on its next statement
        async with pool.connection() as conn:
            await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", conn.backend_pid)
            with pytest.raises(ConnectionLost):
                await conn.execute("SELECT 1")
            assert conn.closed
        async with pool.connection() as conn:
            assert await conn.fetchval("SELECT 3") == 3
        assert pool.connects == 3


async def test_terminated_mid_query(postgres_url: str) -> None:
    async with Pool(postgres_url, size=1) as pool, await Connection.connect(postgres_url) as admin:
        async with pool.connection() as conn:
            pid = conn.backend_pid
            async def terminate() -> None:
                while not await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid
                ):
                    await trio.sleep(0.01)
                await admin.execute("SELECT pg_terminate_backend($1)", pid)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(terminate)
                with pytest.raises(ConnectionLost):
                    await conn.execute("SELECT pg_sleep(5)")
            assert conn.closed
        async with pool.connection() as conn:
            assert await conn.fetchval("SELECT 3") == 3


async def test_pool_reconnects_across_server_restart() -> None:
    server = PostgresServer()
    server.start()
    try:
        async with Pool(server.url, size=1, backoff_max=0.2) as pool:
            async with pool.connection() as conn:
                assert await conn.fetchval("SELECT 1") == 1
            await trio.to_thread.run_sync(server.stop)
            # the server is down: the pool drops the dead connection, retries with backoff,
            # and gives up after reconnect_timeout
            pool.reconnect_timeout = 0.5
            with pytest.raises(ConnectionLost, match="cannot connect"):
                async with pool.connection():
                    pass
            pool.reconnect_timeout = 30.0
            # a connection asked for while the server is down waits (with backoff) for it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, server.start)
                async with pool.connection() as conn:
                    assert await conn.fetchval("SELECT 4") == 4
    finally:
        server.close()


async def test_pool_transaction_commit_and_rollback(postgres_url: str) -> None:
    async with Pool(postgres_url, size=2) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS drv_tx (id int PRIMARY KEY)")
            await conn.execute("TRUNCATE drv_tx")
        async with pool.transaction() as tx:
            await tx.execute("INSERT INTO drv_tx VALUES ($1)", 1)
        with pytest.raises(RuntimeError):
            async with pool.transaction() as tx:
                await tx.execute("INSERT INTO drv_tx VALUES ($1)", 2)
                raise RuntimeError("boom")
        with pytest.raises(UniqueViolation):
            async with pool.transaction() as tx:
                await tx.execute("INSERT INTO drv_tx VALUES ($1)", 3)
                await tx.execute("INSERT INTO drv_tx VALUES ($1)", 1)
        async with pool.connection() as conn:
            assert not conn.in_transaction
            assert await conn.fetch("SELECT id FROM drv_tx ORDER BY id") == [(1,)]


async def test_pool_bounds_connections(postgres_url: str) -> None:
    async with Pool(postgres_url, size=2) as pool:
        pids: set[int] = set()

        async def one() -> None:
            async with pool.connection() as conn:
                pids.add(conn.backend_pid)
                await conn.execute("SELECT pg_sleep(0.05)")

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        assert len(pids) == 2 and pool.connects == 2
