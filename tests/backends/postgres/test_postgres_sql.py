"""PostgresStorage's SQL lives in named files (``storage/postgres/sql/<name>.sql``, one
statement each; ``sql/migrations/<version>.sql``, one migration each), loaded once at
import: every file is used, every name the code uses has its file, and each loads whole
for a schema (no placeholder left)."""

from __future__ import annotations

import ast
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")

from trioqueue.storage.postgres import _common, _schema, _sql  # noqa: E402

PACKAGE = Path(_sql.__file__).parent


def _names(node: ast.expr, loops: dict[str, list[str]]) -> list[str]:
    """The statement names a subscript's key can take: a string, either branch of a
    conditional, or a loop variable over a tuple of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _names(node.body, loops) + _names(node.orelse, loops)
    if isinstance(node, ast.Name) and node.id in loops:
        return loops[node.id]
    raise AssertionError(f"a statement chosen at run time: {ast.unparse(node)!r} (name it in the code)")


def _used() -> dict[str, list[str]]:
    """statement name -> the modules that use it (``self._sql[...]``, ``sql[...]``)."""
    used: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.glob("_*.py")):
        tree = ast.parse(path.read_text())
        loops = {
            loop.target.id: [e.value for e in loop.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for loop in ast.walk(tree)
            if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and isinstance(loop.iter, ast.Tuple)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Subscript):
                continue
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
            if name in ("_sql", "sql"):
                for statement in _names(node.slice, loops):
                    used.setdefault(statement, []).append(path.name)
    return used


def test_every_statement_file_is_used_and_every_statement_used_has_its_file() -> None:
    used = _used()
    files = set(_sql.STATEMENTS)
    assert not set(used) - files, f"used without a file in sql/: {sorted(set(used) - files)}"
    assert not files - set(used), f"files in sql/ no code uses: {sorted(files - set(used))}"


def test_the_statements_load_from_the_package_for_a_schema() -> None:
    folder = resources.files("trioqueue.storage.postgres").joinpath("sql")
    on_disk = {p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql")}
    assert on_disk == set(_sql.STATEMENTS) and len(on_disk) > 100
    texts = _sql.statements("some_schema")
    assert set(texts) == on_disk
    for name, text in texts.items():
        assert text.strip() and not text.startswith("--"), name  # (the notes are not sent)
        assert "{s}" not in text and "{schema}" not in text, name
        assert ("{notify}" in text) == (name == "enqueue_one"), name  # (filled in by the call)
    assert _sql.statements("some_schema") is texts  # (made once a schema)


def test_statements_read_jobs_in_the_order_records_are_built_from() -> None:
    """A statement reading job rows names JOB_COLUMNS as record() reads them."""
    first = _common.JOB_COLUMNS.split(",")[0:4]
    head = ", ".join(c.strip() for c in first)
    readers = [n for n, t in _sql.STATEMENTS.items() if f"SELECT {head}" in " ".join(t.split())]
    assert len(readers) >= 5
    for name in readers:
        assert _common.JOB_COLUMNS in _sql.STATEMENTS[name], name


def test_the_migrations_are_one_file_each_in_version_order() -> None:
    versions = [v for v, _ in _schema.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1)) and _schema.SCHEMA_VERSION == versions[-1]
    for version, text in _schema.MIGRATIONS:
        assert "{s}" in text, version
        text.format(s='"x"')  # (a str.format template: literal braces doubled)


_STATE_READS = {  # name: the parameters' types and values (a terminal state's read)
    "oldest": ("text, text", "'q', 'completed'"),
    "list_jobs": ("text, int8, text, int8", "'q', 0, 'completed', 10"),
    "list_jobs_after": ("text, int8, text, int8, int8, text", "'q', 0, 'completed', 10, 0, ''"),
    "trim_retained": ("text, text, int8, int8, int8, int8", "'q', 'completed', 10, 0, 0, 0"),
    "purge": ("text, text, int8", "'q', 'completed', 0"),
}


@pytest.mark.parametrize("name", sorted(_STATE_READS))
async def test_the_reads_of_a_state_use_jobs_by_state_under_a_generic_plan(postgres_url: str, name: str) -> None:
    """jobs_by_state leaves out the processing jobs: a statement naming its state as a
    parameter still reads a state's jobs on it once prepared (a generic plan cannot prove
    the index's condition from ``state = $n``: each says it in a constant)."""
    from trioqueue.storage.postgres import Connection, PostgresStorage

    schema = "tq_generic_" + name
    types, values = _STATE_READS[name]
    async with PostgresStorage(postgres_url, schema=schema):
        pass  # (migrated)
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute("SET enable_seqscan = off")  # (an empty table: any index over a scan)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute_script(f"PREPARE read_state ({types}) AS {_sql.statements(schema)[name]}")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE read_state ({values})"))
    assert "jobs_by_state" in plan, plan


def _read_by(node: dict[str, Any], relation: str, *, with_ctes: bool = False) -> int:
    """Rows the scans of ``relation`` in ``node``'s own tree returned (actual rows times
    loops), leaving out its InitPlans and SubPlans (the CTEs it reads) unless ``with_ctes``."""
    own = 0
    if node.get("Relation Name") == relation and "Scan" in str(node.get("Node Type")):
        own = int(float(node["Actual Rows"]) * int(node["Actual Loops"]))
    children = [
        c for c in node.get("Plans", []) if with_ctes or c.get("Parent Relationship") not in ("InitPlan", "SubPlan")
    ]
    return own + sum(_read_by(c, relation, with_ctes=with_ctes) for c in children)


def _modify_table(node: dict[str, Any]) -> dict[str, Any] | None:
    if node.get("Node Type") == "ModifyTable":
        return node
    for child in node.get("Plans", []):
        found = _modify_table(child)
        if found is not None:
            return found
    return None


async def _unseen_queue(postgres_url: str, schema: str, *, groups: int = 0) -> None:
    """Schema ``schema`` with queue "seen" (2,000 jobs) in the table's statistics and
    queue "new" (1,000 ready jobs, in ``groups`` groups if any) filled after the ANALYZE:
    estimated at about one row."""
    from trioqueue import Queue
    from trioqueue.storage.postgres import Connection, PostgresStorage

    async with PostgresStorage(postgres_url, schema=schema) as storage:
        async with Queue[int, None](storage, name="seen") as seen:
            await seen.enqueue_many([(f"s{i}", i) for i in range(2000)])
        async with await Connection.connect(postgres_url) as conn:
            await conn.execute(f'ANALYZE "{schema}".jobs')
        async with Queue[int, None](storage, name="new") as new:
            if not groups:
                await new.enqueue_many([(f"n{i}", i) for i in range(1000)])
            for i in range(1000 if groups else 0):
                await new.enqueue(f"n{i}", i, group=f"g{i % groups}")


def _update_of(doc: Any) -> dict[str, Any]:
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    update = _modify_table(plan)
    assert update is not None, plan
    return update


@pytest.mark.parametrize("name", ["claim_fast_plain", "claim_plain"])
async def test_a_claim_updates_its_jobs_by_key_when_the_statistics_have_not_seen_the_queue(
    postgres_url: str, name: str
) -> None:
    """A queue the table's statistics have not seen yet (a new one, or one filled since the
    last ANALYZE) is estimated at about one row: the claim's UPDATE must still find each
    job it picked by its key, not read every job of the queue once per picked job (a
    nested loop that made a 5,000-job drain take 10 s: each claim of 100 read 500,000
    rows); and its pick reads the ready jobs in order up to the batch (jobs_ready_plain),
    not all of them to sort."""
    from trioqueue.storage.postgres import Connection

    schema = "tq_claim_plan_" + name
    await _unseen_queue(postgres_url, schema)
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute_script(
            f"PREPARE claim (text, int8, int8, text, int8, int8) AS {_sql.statements(schema)[name]}"
        )
        await conn.execute("BEGIN")
        rows = await conn.fetch("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim ('new', 0, 100, 'w', 60000, 100)")
        await conn.execute("ROLLBACK")
    update = _update_of(rows[0][0])
    assert _read_by(update, "jobs") <= 100, json.dumps(update, indent=1)
    plan = (json.loads(rows[0][0]) if isinstance(rows[0][0], str) else rows[0][0])[0]["Plan"]
    assert _read_by(plan, "jobs", with_ctes=True) <= 200, json.dumps(plan, indent=1)  # (picked, then updated)


# Statements that update a batch of jobs named by id, joined with unnest() of their
# parameters: (parameter types, arguments) with {ids} and {claims} the batch's arrays.
_BATCH_UPDATES = {
    "settle_jobs": (
        "text, int8, text[], text[], int4[], bool[], bool[], bytea[], int8[], int8[]",
        "'new', 1, {ids}, array_fill('completed'::text, ARRAY[100]), array_fill(0, ARRAY[100]),"
        " array_fill(true, ARRAY[100]), array_fill(false, ARRAY[100]), array_fill(NULL::bytea, ARRAY[100]),"
        " array_fill(NULL::int8, ARRAY[100]), array_fill(NULL::int8, ARRAY[100])",
    ),
    "settle_final": (
        "text, int8, text[], text[], bytea[], float8[], text[], text, text, text, text",
        "'new', 1, {ids}, {claims}, array_fill(NULL::bytea, ARRAY[100]), array_fill(60::float8, ARRAY[100]),"
        " array_fill('completed'::text, ARRAY[100]), 'w', 'n', 'tq_events', 'tq_slots'",
    ),
    "start_plain": ("text, text[], text[], text", "'new', {ids}, {claims}, 'w'"),
    "save_steps": (
        "text, text[], text[], text[], bytea[]",
        "'new', {ids}, {claims}, array_fill('w'::text, ARRAY[100]), array_fill('\\x00'::bytea, ARRAY[100])",
    ),
    "renew_leases": ("text, int8, text, text[], text[]", "'new', 2, 'w', {ids}, {claims}"),
    "requeue_front": ("text, int8, text[], int8, bool", "'new', 1, {ids}, 0, true"),
    "requeue_stalled": ("text, int8, text[]", "'new', 1, {ids}"),
    "fail_stalled": ("text, int8, text[], bytea[]", "'new', 1, {ids}, array_fill(NULL::bytea, ARRAY[100])"),
}


@pytest.mark.parametrize("name", sorted(_BATCH_UPDATES))
async def test_a_batch_update_reads_its_jobs_by_key_when_the_statistics_have_not_seen_the_queue(
    postgres_url: str, name: str
) -> None:
    """Updating a batch of jobs of a queue the statistics have not seen reads the batch's
    jobs by key, not every job of the queue into a hash joined with the batch (settle_jobs
    read all 5,000 jobs, 1,188 buffers, to settle 100). At most twice the batch: one
    statement (renew_leases) reads it once to lock it and once to update it."""
    from trioqueue.storage.postgres import Connection

    schema = "tq_batch_plan_" + name
    await _unseen_queue(postgres_url, schema)
    statements = _sql.statements(schema)
    types, arguments = _BATCH_UPDATES[name]
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute_script(f"PREPARE claim (text, int8, int8, text, int8, int8) AS {statements['claim_plain']}")
        await conn.execute_script(f"PREPARE batch ({types}) AS {statements[name]}")
        await conn.execute("BEGIN")
        claimed = await conn.fetch("EXECUTE claim ('new', 0, 100, 'w', 60000, 0)")
        ids = "ARRAY[" + ",".join(f"'{row[2]}'" for row in claimed) + "]"
        claims = "ARRAY[" + ",".join(f"'{row[5]}'" for row in claimed) + "]"
        rows = await conn.fetch(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE batch ({arguments.format(ids=ids, claims=claims)})"
        )
        await conn.execute("ROLLBACK")
    update = _update_of(rows[0][0])
    assert _read_by(update, "jobs") <= 2 * len(claimed), json.dumps(update, indent=1)


async def test_a_grouped_claim_reads_its_jobs_by_key_when_the_statistics_have_not_seen_the_queue(
    postgres_url: str,
) -> None:
    """group_claim's UPDATE (in the schema: its plan is not EXPLAINed) finds the picked jobs
    by key on a queue the statistics have not seen: the rows the claim's transaction fetched
    from the table stay bounded by the batch, not by the queue's depth (1,300 to claim 100
    of 1,000 jobs in 200 groups: the whole queue hashed; now 400, as at 5,000)."""
    from trioqueue.storage.postgres import Connection

    schema = "tq_group_claim_plan"
    await _unseen_queue(postgres_url, schema, groups=200)
    fetched = (
        "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0) FROM pg_stat_xact_user_tables"
        f" WHERE schemaname = '{schema}' AND relname = 'jobs'"
    )
    async with await Connection.connect(postgres_url) as conn:
        await conn.execute_script(
            "PREPARE claim (text, int8, int4, text, int8, int4, int4, int4, int8) AS "
            + _sql.statements(schema)["claim_grouped"]
        )
        await conn.execute("BEGIN")
        before = int(await conn.fetchval(fetched))
        claimed = await conn.fetch("EXECUTE claim ('new', 0, 100, 'w', 60000, 0, 1, 0, 0)")
        after = int(await conn.fetchval(fetched))
        await conn.execute("ROLLBACK")
    assert len(claimed) == 100
    assert after - before <= 4 * len(claimed), (before, after)  # (4 a job: the same at 5,000)
