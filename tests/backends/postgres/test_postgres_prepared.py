"""The driver prepares a statement with parameters the second time it runs on a
connection (the server then parses and plans it once): same results, a statement per
distinct set of parameter types, healing after DDL changes a prepared result's shape,
and ``prepare = False`` for poolers that do not keep prepared statements."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from trioqueue.storage.postgres import Connection, PostgresError

_COUNT = "SELECT count(*) FROM pg_prepared_statements"


async def test_a_repeated_statement_is_prepared_once_and_gives_the_same_results(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(_COUNT) == 0
        sql = "SELECT $1::bigint + 1, $2::text"
        got = [await conn.fetchrow(sql, i, f"v{i}") for i in range(5)]
        assert got == [(i + 1, f"v{i}") for i in range(5)]
        assert await conn.fetchval(_COUNT) == 1  # prepared at its second run, reused since
        # a value whose binary type differs (a big int: int8, not int2) is another statement
        assert await conn.fetchrow(sql, 2**40, "big") == (2**40 + 1, "big")
        assert await conn.fetchrow(sql, 2**40, "big") == (2**40 + 1, "big")
        assert await conn.fetchval(_COUNT) == 2
        assert await conn.fetchrow(sql, 7, None) == (8, None)  # (None: a type of its own too)


async def test_errors_of_a_prepared_statement_leave_the_connection_usable(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        for _ in range(3):
            with pytest.raises(PostgresError) as info:
                await conn.fetchval("SELECT 1 / $1::int", 0)
            assert info.value.sqlstate == "22012"
        assert await conn.fetchval("SELECT 1 / $1::int", 1) == 1
        with pytest.raises(PostgresError):  # a statement that cannot be prepared fails as it would unprepared
            for _ in range(2):
                await conn.fetchval("SELECT * FROM no_such_table WHERE id = $1", 1)
        assert await conn.fetchval("SELECT $1::int", 3) == 3


async def test_a_prepared_statement_heals_after_ddl_changes_its_result(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute("CREATE TEMP TABLE shape (id int PRIMARY KEY, a text)")
        await conn.execute("INSERT INTO shape VALUES ($1, $2)", 1, "x")
        for _ in range(3):
            assert await conn.fetch("SELECT * FROM shape WHERE id = $1", 1) == [(1, "x")]
        await conn.execute("ALTER TABLE shape ADD COLUMN b int DEFAULT 5")
        try:
            rows = await conn.fetch("SELECT * FROM shape WHERE id = $1", 1)
        except PostgresError as exc:  # once, as with any client's prepared statements
            assert exc.sqlstate == "0A000"
            rows = await conn.fetch("SELECT * FROM shape WHERE id = $1", 1)
        assert rows == [(1, "x", 5)]


async def test_prepare_false_never_prepares(postgres_url: str) -> None:
    async with await Connection.connect(postgres_url) as conn:
        conn.prepare = False
        for i in range(4):
            assert await conn.fetchval("SELECT $1::int", i) == i
        assert await conn.fetchval(_COUNT) == 0


async def test_the_storage_option_reaches_every_connection(postgres_url: str) -> None:
    from trioqueue.storage import from_url

    assert from_url("postgresql://u@h/db").prepared_statements is True  # type: ignore[attr-defined]
    off = from_url(f"{postgres_url}?prepared_statements=off&schema=t_prep_off")
    assert off.prepared_statements is False  # type: ignore[attr-defined]
    async with off, off.pool.connection() as conn:  # type: ignore[attr-defined]
        assert conn.prepare is False
    with pytest.raises(ValueError, match="prepared_statements must be on or off"):
        from_url("postgresql://u@h/db?prepared_statements=maybe")


async def test_a_statement_with_a_long_array_runs_unprepared(postgres_url: str) -> None:
    """A batch (an array parameter of more than a few items) is planned for its size."""
    async with await Connection.connect(postgres_url) as conn:
        sql = "SELECT cardinality($1::int[])"
        for _ in range(3):
            assert await conn.fetchval(sql, list(range(20))) == 20
        assert await conn.fetchval(_COUNT) == 0
        for _ in range(3):
            assert await conn.fetchval(sql, [1, 2]) == 2
        assert await conn.fetchval(_COUNT) == 1
        assert await conn.fetchval(sql, list(range(20))) == 20  # (still unprepared: its own plan)
