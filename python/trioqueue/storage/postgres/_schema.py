"""The PostgresStorage schema: versioned migrations, run under an advisory lock.

Every table lives in one PostgreSQL schema (``trioqueue`` by default; the ``schema=``
option of :class:`~trioqueue.storage.postgres.PostgresStorage` and of
:func:`migrate`), so that several independent deployments share a database without
sharing jobs. ``<schema>.version`` records the migrations applied (one row each).

:func:`migrate` takes a session-level advisory lock (keyed by the schema name) for its
whole run: two processes starting together (two workers, a worker and ``trioqueue
migrate``) serialize, the second finds the work done. Each migration runs in its own
transaction together with the row recording it, so a failed migration leaves nothing
half-applied.
"""

from __future__ import annotations

import re

import trio

from ..._drivers.libpq import Connection, PostgresError
from ._sql import MIGRATION_TEXTS, statements

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema_name", "migrate", "schema_version"]

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# (version, SQL) in order, from ``sql/migrations/<version>.sql`` (``str.format``
# templates of ``{s}``, the quoted schema name: literal braces doubled). Never edit a
# released migration: add the next file.
MIGRATIONS: list[tuple[int, str]] = sorted((int(name), text) for name, text in MIGRATION_TEXTS.items())
SCHEMA_VERSION = MIGRATIONS[-1][0]


def check_schema_name(schema: str) -> str:
    """``schema`` if it is a plain lower-case identifier (``ValueError`` naming it
    otherwise): it is spliced into SQL and into channel names."""
    if not isinstance(schema, str) or not _NAME.fullmatch(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63), got {schema!r}")
    return schema


async def schema_version(conn: Connection, schema: str) -> int:
    """The latest migration applied to ``schema`` (0: none, or no such schema)."""
    check_schema_name(schema)
    sql = statements(schema)
    exists = await conn.fetchval(sql["version_table_exists"], f'"{schema}".version')
    if not exists:
        return 0
    return int(await conn.fetchval(sql["schema_version"]))


async def migrate(conn: Connection, schema: str = "trioqueue") -> list[int]:
    """Apply the migrations ``schema`` lacks, under the schema's advisory lock; returns
    the versions applied (``[]``: it was up to date). Raises :class:`PostgresError` when
    the database has a newer schema than this trioqueue knows (upgrade trioqueue).

    Cancellation: a migration interrupted by a cancel is rolled back as a whole (its
    transaction never commits); the lock is released (shielded) on the way out."""
    check_schema_name(schema)
    quoted = f'"{schema}"'
    sql = statements(schema)
    await conn.execute(sql["migrate_lock"], f"trioqueue.migrate:{schema}")
    applied: list[int] = []
    try:
        current = await schema_version(conn, schema)
        if current > SCHEMA_VERSION:
            raise PostgresError(
                f"schema {schema!r} is at version {current}, newer than this trioqueue knows ({SCHEMA_VERSION}): upgrade trioqueue"
            )
        for version, migration in MIGRATIONS:
            if version <= current:
                continue
            await conn.execute("BEGIN")
            try:
                if version == 1:
                    await conn.execute_script(sql["create_schema"])
                await conn.execute_script(migration.format(s=quoted))
                await conn.execute(sql["record_migration"], version)
                await conn.execute("COMMIT")
            except BaseException:
                with trio.CancelScope(shield=True):
                    if not conn.closed:
                        await conn.execute("ROLLBACK")
                raise
            applied.append(version)
    finally:
        with trio.CancelScope(shield=True):
            if not conn.closed:
                await conn.execute(sql["migrate_unlock"], f"trioqueue.migrate:{schema}")
    return applied
