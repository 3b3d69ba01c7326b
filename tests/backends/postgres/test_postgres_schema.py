"""PostgresStorage's schema migrations: versioned, under an advisory lock, per schema."""

from __future__ import annotations

import uuid

import pytest
import trio

pytest.importorskip("psycopg")

import trio.lowlevel
from trioqueue.storage.postgres import Connection, PostgresError
from trioqueue.storage.postgres._schema import SCHEMA_VERSION, migrate, schema_version


def _schema() -> str:
    return f"tq_{uuid.uuid4().hex[:10]}"


# Later migrations that only add columns (idempotently, ``IF NOT EXISTS``) which today's
# statements name: 6, the steps of durable jobs; 7, the signals' (it also widens the state
# check and the delayed set's index, idempotently too).
_ADD_COLUMNS = (6, 7)


def _migrations_up_to(migrations: list[tuple[int, str]], version: int) -> list[tuple[int, str]]:
    """The migrations up to ``version``, the last one followed by the later ones that only
    add columns: a schema at that version that today's statements can run on (a test of
    an upgrade enqueues with them before upgrading)."""
    kept = [mig for mig in migrations if mig[0] <= version]
    later = "".join("\n" + text for v, text in migrations if v > version and v in _ADD_COLUMNS)
    return [*kept[:-1], (kept[-1][0], kept[-1][1] + later)]


async def test_migrate_creates_versioned_schema_once(postgres_url: str) -> None:
    schema = _schema()
    async with await Connection.connect(postgres_url) as conn:
        assert await schema_version(conn, schema) == 0
        assert await migrate(conn, schema) == list(range(1, SCHEMA_VERSION + 1))
        assert await schema_version(conn, schema) == SCHEMA_VERSION
        assert await migrate(conn, schema) == []  # up to date: nothing to do
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1", schema
        )
        assert {t for (t,) in tables} >= {"jobs", "queues", "workers", "locks", "schedules", "version"}
        assert not conn.in_transaction


async def test_two_concurrent_migrators_one_schema(postgres_url: str) -> None:
    schema = _schema()
    results: list[list[int]] = []
    async with await Connection.connect(postgres_url) as a, await Connection.connect(postgres_url) as b:
        # b holds the advisory lock, so that both migrators surely overlap; a waits for it
        await b.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", f"trioqueue.migrate:{schema}")

        async def run(conn: Connection) -> None:
            results.append(await migrate(conn, schema))

        with trio.fail_after(10):  # (without the lock, a would never wait: this fails)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, a)
                nursery.start_soon(run, b)  # b re-enters its own lock (session locks stack)
                # a is blocked on the lock, as the server sees it
                while not await _waiting_for_lock(postgres_url, a.backend_pid):
                    await trio.sleep(0.01)
                await trio.lowlevel.checkpoint()  # (b's migrate runs; a still waits)
                await b.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", f"trioqueue.migrate:{schema}")
        assert sorted(results, key=len) == [[], list(range(1, SCHEMA_VERSION + 1))]
        assert await a.fetchval(f'SELECT count(*) FROM "{schema}".version') == SCHEMA_VERSION


async def _waiting_for_lock(url: str, pid: int) -> bool:
    async with await Connection.connect(url) as probe:
        return bool(
            await probe.fetchval("SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted", pid)
        )


async def test_many_concurrent_migrators(postgres_url: str) -> None:
    schema = _schema()
    results: list[list[int]] = []

    async def run() -> None:
        async with await Connection.connect(postgres_url) as conn:
            results.append(await migrate(conn, schema))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(run)
    assert sorted(map(len, results)) == [0, 0, 0, 0, SCHEMA_VERSION]


async def test_schemas_are_independent_and_names_checked(postgres_url: str) -> None:
    one, two = _schema(), _schema()
    async with await Connection.connect(postgres_url) as conn:
        await migrate(conn, one)
        assert await schema_version(conn, two) == 0
        await migrate(conn, two)
        await conn.execute(
            f'INSERT INTO "{one}".locks (name, owner, expires_ms) VALUES ($1, $2, $3)', "l", "o", 1
        )
        assert await conn.fetchval(f'SELECT count(*) FROM "{two}".locks') == 0
        for bad in ("Upper", "a-b", "x; DROP TABLE y", "", "1abc"):
            with pytest.raises(ValueError, match="schema must be"):
                await migrate(conn, bad)


async def test_newer_schema_is_refused(postgres_url: str) -> None:
    schema = _schema()
    async with await Connection.connect(postgres_url) as conn:
        await migrate(conn, schema)
        await conn.execute(f'INSERT INTO "{schema}".version (version) VALUES ($1)', SCHEMA_VERSION + 1)
        with pytest.raises(PostgresError, match="newer than this trioqueue"):
            await migrate(conn, schema)
        # the advisory lock was released: another session can take it at once
        async with await Connection.connect(postgres_url) as other:
            assert await other.fetchval(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", f"trioqueue.migrate:{schema}"
            )



_IDS = ["a0", "a1", "a2", "a3", "b0", "b1", "u0", "h0"]


async def _enqueue_and_claim(url: str, schema: str, n: int, *, enqueue: bool) -> list[str]:
    """(Groups a and b, a job without a group, one of priority 2.) ``n`` claims of one
    job each, through a PostgresStorage that migrates the schema on open."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage.postgres import PostgresStorage

    async with PostgresStorage(url, schema=schema) as storage:
        if enqueue:
            jobs = [job(f"a{i}")._replace(group="a") for i in range(4)]
            jobs += [job(f"b{i}")._replace(group="b") for i in range(2)]
            jobs += [job("u0"), job("h0")._replace(group="b", priority=2)]
            await storage.enqueue("q", jobs)
        return [c.id for _ in range(n) for c in await storage.dequeue("q", W1, 1, 0.0, LEASE)]


async def test_a_version_3_schema_upgrades_and_its_rings_go_on(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 4 (group_pick replaced, jobs_ready dropped) on a schema at version 3 with
    groups in its rings: the claims go on in the same turns as on a schema made at the
    latest version."""
    from trioqueue.storage.postgres import _schema as module

    old, fresh = _schema(), _schema()
    expected = await _enqueue_and_claim(postgres_url, fresh, 8, enqueue=True)
    assert sorted(expected) == sorted(_IDS) and expected[0] == "h0"  # (priority 2 first)
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", _migrations_up_to(module.MIGRATIONS, 3))
        m.setattr(module, "SCHEMA_VERSION", 3)
        before = await _enqueue_and_claim(postgres_url, old, 3, enqueue=True)
        async with await Connection.connect(postgres_url) as conn:
            assert await schema_version(conn, old) == 3
    after = await _enqueue_and_claim(postgres_url, old, 5, enqueue=False)
    assert before + after == expected
    async with await Connection.connect(postgres_url) as conn:
        assert await schema_version(conn, old) == SCHEMA_VERSION
        assert await conn.fetchval("SELECT to_regclass($1) IS NULL", f'"{old}".jobs_ready')


async def test_a_version_4_schema_upgrades_and_a_transactional_enqueue_holds_up_nothing_of_its_group(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 5 (the group trigger deferrable) on a schema at version 4 with groups in
    its rings: the rings go on, and a job of a group enqueued in an open application
    transaction does not hold up another producer's enqueue of that group."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", _migrations_up_to(module.MIGRATIONS, 4))
        m.setattr(module, "SCHEMA_VERSION", 4)
        async with PostgresStorage(postgres_url, schema=old) as storage:
            await storage.enqueue("q", [job(f"a{i}")._replace(group="a") for i in range(2)])
            assert await storage.schema_version() == 4
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        async with storage.transaction() as tx:
            await storage.enqueue_in_transaction("q", [job("c0")._replace(group="c")], tx)
            with trio.fail_after(10):  # (a guard: on version 4 it waits for the transaction)
                await storage.enqueue("q", [job("c1")._replace(group="c")])
        got = [c.id for _ in range(5) for c in await storage.dequeue("q", W1, 1, 0.0, LEASE)]
    assert sorted(got) == ["a0", "a1", "c0", "c1"] and got.index("a0") < got.index("a1")


async def test_a_version_5_schema_upgrades_and_its_jobs_store_steps(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 6 (jobs.steps) on a schema at version 5: the column is added, and a job's
    steps are stored and read back."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", [mig for mig in module.MIGRATIONS if mig[0] <= 5])
        m.setattr(module, "SCHEMA_VERSION", 5)
        async with await Connection.connect(postgres_url) as conn:
            assert await migrate(conn, old) == [1, 2, 3, 4, 5]
    column = "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'jobs' AND column_name = 'steps'"
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(column, old) == 0
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        await storage.enqueue("q", [job("j")])
        [claim] = await storage.dequeue("q", W1, 1, 0.0, LEASE)
        assert await storage.save_step("q", W1, "j", claim.token, "a", b"1")
        assert await storage.get_steps("q", "j") == {"a": b"1"}
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(column, old) == 1


async def test_a_version_6_schema_upgrades_and_its_jobs_wait_for_signals(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 7 (jobs.signals, wait_name, wait_count; the state waiting_signal) on a
    schema at version 6: a job parks in waiting_signal and a signal queues it again."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage import Settlement, SettleKind
    from trioqueue.storage._rules import WaitSignal
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", [mig for mig in module.MIGRATIONS if mig[0] <= 6])
        m.setattr(module, "SCHEMA_VERSION", 6)
        async with await Connection.connect(postgres_url) as conn:
            assert await migrate(conn, old) == [1, 2, 3, 4, 5, 6]
    column = "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'jobs' AND column_name = 'signals'"
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(column, old) == 0
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        await storage.enqueue("q", [job("j")])
        [claim] = await storage.dequeue("q", W1, 1, 0.0, LEASE)
        park = Settlement(SettleKind.WAIT_SIGNAL, "j", WaitSignal("go", 1).encode(), token=claim.token)
        assert await storage.settle("q", W1, [park]) == [True]
        assert (await storage.counts("q"))["waiting_signal"] == 1
        assert await storage.signal("q", "j", "go", b"1") == "delivered"
        assert await storage.get_signals("q", "j") == [("go", b"1")]
        [again] = await storage.dequeue("q", W1, 1, 1.0, LEASE)
        assert again.id == "j"
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(column, old) == 1


async def test_a_version_6_schema_upgrades_and_its_jobs_take_dependencies(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 8 (jobs.depended, job_deps) on a schema at version 6: a job enqueued before
    the upgrade can be depended on after it, its dependent waits for it, then is released
    once it completes, and reads it as its child."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage import Settlement, SettleKind
    from trioqueue.storage._records import FlowJob
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", _migrations_up_to(module.MIGRATIONS, 6))  # (+ 7: its columns today's enqueue names)
        m.setattr(module, "SCHEMA_VERSION", 6)
        async with PostgresStorage(postgres_url, schema=old) as storage:
            await storage.enqueue("q", [job("before")])
            assert await storage.schema_version() == 6
    table = "SELECT to_regclass($1) IS NOT NULL"
    async with await Connection.connect(postgres_url) as conn:
        assert not await conn.fetchval(table, f'"{old}".job_deps')
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        await storage.enqueue_flow([FlowJob("q", job("after"), depends_on=(("q", "before"),))])
        record = await storage.get_job("q", "after")
        assert record is not None and record.state.startswith("waiting_children")
        [claim] = await storage.dequeue("q", W1, 5, 0.0, LEASE)
        assert claim.id == "before"
        assert await storage.settle("q", W1, [Settlement(SettleKind.COMPLETE, "before", b'"ok"', 60.0, token=claim.token)]) == [True]
        record = await storage.get_job("q", "after")
        assert record is not None and record.state.startswith("queued")
        assert [r.id for _, r in await storage.get_children("q", "after")] == ["before"]
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval(table, f'"{old}".job_deps')


async def test_a_version_9_schema_upgrades_and_its_held_and_ended_jobs_are_listed_and_recovered(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 10 (jobs_lease dropped, jobs_by_state without the processing jobs, the
    table's fillfactor) on a schema at version 9 with queued, processing and completed
    jobs: they are listed and counted as before, the oldest processing job is found, and
    a claim whose lease ran out is recovered."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage import Settlement, SettleKind
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", [mig for mig in module.MIGRATIONS if mig[0] <= 9])
        m.setattr(module, "SCHEMA_VERSION", 9)
        async with PostgresStorage(postgres_url, schema=old) as storage:
            await storage.enqueue("q", [job(f"j{i}") for i in range(4)])
            first, second = await storage.dequeue("q", W1, 2, 0.0, 0.05)  # (a lease about to run out)
            done = Settlement(SettleKind.COMPLETE, second.id, b'"ok"', 60.0, token=second.token)
            assert await storage.settle("q", W1, [done]) == [True]
            assert await storage.schema_version() == 9
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        assert [r.id for r in (await storage.list_jobs("q", "processing"))[0]] == [first.id]
        assert [r.id for r in (await storage.list_jobs("q", "completed"))[0]] == [second.id]
        assert [r.id for r in (await storage.list_jobs("q", "queued"))[0]] == ["j3", "j2"]
        assert await storage.oldest("q", "processing") is not None
        counts = await storage.counts("q")
        assert (counts["queued"], counts["processing"], counts["completed"]) == (2, 1, 1)
        await trio.sleep(0.1)  # (the lease, set in ms of the wall clock, runs out)
        recovered, _ = await storage.recover_stalled("q")
        assert recovered == [(first.id, "requeued")]
        claims = await storage.dequeue("q", W1, 3, 0.0, LEASE)
        assert sorted(c.id for c in claims) == sorted([first.id, "j2", "j3"])
    async with await Connection.connect(postgres_url) as conn:
        assert await conn.fetchval("SELECT to_regclass($1) IS NULL", f'"{old}".jobs_lease')
        where = await conn.fetchval(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
            f'"{old}".jobs_by_state',
        )
        assert "processing" in where
        assert await conn.fetchval("SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)", f'"{old}".jobs') == [
            "fillfactor=90"
        ]


async def test_a_version_11_schema_upgrades_and_its_grouped_claims_name_a_held_job(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 12 (group_pick and group_claim name a ready job they skipped for being
    held) on a schema at version 11 with groups in its rings: the groups' jobs are
    claimed in turn, and a job another transaction holds is named, not claimed."""
    from storage_helpers import LEASE, W1, job
    from trioqueue.storage.postgres import PostgresStorage
    from trioqueue.storage.postgres import _schema as module

    old = _schema()
    with monkeypatch.context() as m:
        m.setattr(module, "MIGRATIONS", _migrations_up_to(module.MIGRATIONS, 11))
        m.setattr(module, "SCHEMA_VERSION", 11)
        async with PostgresStorage(postgres_url, schema=old) as storage:
            await storage.enqueue("q", [job(f"{g}{i}")._replace(group=g) for g in "ab" for i in range(2)])
            assert await storage.schema_version() == 11
    async with PostgresStorage(postgres_url, schema=old) as storage:
        assert await storage.schema_version() == SCHEMA_VERSION
        async with storage.pool.connection() as locker:
            await locker.execute("BEGIN")
            await locker.execute(f"SELECT 1 FROM \"{old}\".jobs WHERE queue = 'q' AND id = 'b1' FOR UPDATE")
            got = [c.id for _ in range(4) for c in await storage.dequeue("q", W1, 1, 0.0, LEASE)]
            assert sorted(got) == ["a0", "a1", "b0"]
            async with storage.pool.connection() as conn:
                rows = await conn.fetch(
                    f'SELECT rn, id FROM "{old}".group_claim($1, 5, 0, $2, $3, 0, 0, 0, 0)', "q", 0, W1
                )
            assert [tuple(r) for r in rows] == [(0, "b1")]
            await locker.execute("ROLLBACK")
        assert [c.id for c in await storage.dequeue("q", W1, 5, 0.0, LEASE)] == ["b1"]
