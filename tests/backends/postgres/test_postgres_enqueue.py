"""PostgresStorage's enqueues of jobs ready now: one statement a batch, its events packed
in SQL, and single enqueues running together written together (see ``_jobs``): the
outcomes, events and wake-ups are those of enqueues written one by one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
import trio.testing

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1, job
from trioqueue.storage import StorageEvent
from trioqueue.storage.postgres import Connection, PostgresStorage


@pytest.fixture
def count_statements() -> Iterator[Callable[[PostgresStorage, str], list[int]]]:
    """``count(pg, name)``: a list whose item counts the runs of the statement ``name`` of
    ``sql/`` on ``pg``'s connections from then on (till the test ends)."""
    original = Connection.fetch

    def count(pg: PostgresStorage, name: str) -> list[int]:
        runs = [0]
        text = pg._db.sql[name]

        async def counted(self: Connection, sql: str, *params: Any) -> Any:
            if sql == text:
                runs[0] += 1
            return await original(self, sql, *params)

        Connection.fetch = counted  # type: ignore[method-assign]
        return runs

    yield count
    Connection.fetch = original  # type: ignore[method-assign]


async def _events(receive: trio.MemoryReceiveChannel[list[StorageEvent]], n: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with trio.fail_after(10):
        while len(out) < n:
            out += [(e.kind, e.job_id) for e in await receive.receive()]
    return out


async def test_single_enqueues_running_together_go_in_few_statements_with_the_outcomes_of_one_by_one(
    pg: PostgresStorage, queue_name: str, count_statements: Callable[[PostgresStorage, str], list[int]]
) -> None:
    await pg.enqueue(queue_name, [job("live")])  # a live job: its id again is a duplicate of it
    statements = count_statements(pg, "enqueue_batch")
    outcomes: dict[int, Any] = {}

    async def one(k: int, job_id: str) -> None:
        [outcomes[k]] = await pg.enqueue(queue_name, [job(job_id, token=f"t-{job_id}-{k}")])

    ids = [f"j{k}" for k in range(60)] + ["j3", "j3", "live"]
    async with pg.subscribe(queue_name, ["enqueued"]) as events:
        async with trio.open_nursery() as nursery:
            for k, job_id in enumerate(ids):
                nursery.start_soon(one, k, job_id)
        seen = await _events(events, 60)
    assert statements[0] < 10  # (the calls gathered: 63 calls, a few statements)
    assert [outcomes[k].status.value for k in range(60) if k != 3] == ["queued"] * 59
    # the same id three times (in one statement or in several, in the order the tasks ran):
    # the first written, the others duplicates of it
    [first] = [k for k in (3, 60, 61) if outcomes[k].status.value == "queued"]
    for k in {3, 60, 61} - {first}:
        assert outcomes[k].status.value == "duplicate" and outcomes[k].token == f"t-j3-{first}"
    assert outcomes[62].status.value == "duplicate" and outcomes[62].token == "t-live"
    assert sorted(seen) == sorted(("enqueued", f"j{k}") for k in range(60))
    claimed = [c.id for c in await pg.dequeue(queue_name, W1, 100, 0.05, LEASE)]
    assert sorted(claimed) == sorted(["live", *(f"j{k}" for k in range(60))])
    # each job's row is its first enqueue's
    assert (await pg.get_job(queue_name, "j3")).token == f"t-j3-{first}"  # type: ignore[union-attr]


async def test_a_waiting_single_enqueue_cancelled_is_not_written_and_the_others_are(
    pg: PostgresStorage, queue_name: str
) -> None:
    await pg.enqueue(queue_name, [job("first")])
    done: list[str] = []
    scopes: dict[str, trio.CancelScope] = {}

    async def one(job_id: str) -> None:
        with trio.CancelScope() as scopes[job_id]:
            await pg.enqueue(queue_name, [job(job_id)])
            done.append(job_id)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:  # inserts wait for this lock: the statements stay in flight
                await tx.execute(f'LOCK TABLE "{pg.schema}".jobs IN SHARE MODE')
                for job_id in "ab":  # each leads a statement
                    nursery.start_soon(one, job_id)
                await trio.testing.wait_all_tasks_blocked()
                for job_id in "cd":  # two statements in flight: these wait for one of them
                    nursery.start_soon(one, job_id)
                await trio.testing.wait_all_tasks_blocked()
                assert sorted(w.job.id for w in pg._jobs._gatherings[queue_name].waiting) == ["c", "d"]
                scopes["c"].cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert [w.job.id for w in pg._jobs._gatherings[queue_name].waiting] == ["d"]
    assert sorted(done) == ["a", "b", "d"]
    assert await pg.get_job(queue_name, "c") is None
    assert pg._jobs._gatherings[queue_name].in_flight == 0 and not pg._jobs._gatherings[queue_name].waiting


async def test_a_bad_job_among_gathered_enqueues_fails_its_own_call_only(pg: PostgresStorage, queue_name: str) -> None:
    await pg.enqueue(queue_name, [job("first")])
    outcomes: dict[str, Any] = {}

    async def one(job_id: str) -> None:
        try:
            [outcomes[job_id]] = await pg.enqueue(queue_name, [job(job_id)])
        except Exception as exc:  # noqa: BLE001 - (the bad id's call: its own error)
            outcomes[job_id] = exc

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:  # the first two statements wait: the rest gather
                await tx.execute(f'LOCK TABLE "{pg.schema}".jobs IN SHARE MODE')
                for job_id in "ab":
                    nursery.start_soon(one, job_id)
                await trio.testing.wait_all_tasks_blocked()
                for job_id in ("c", "bad\0id", "d"):
                    nursery.start_soon(one, job_id)
                await trio.testing.wait_all_tasks_blocked()
                assert len(pg._jobs._gatherings[queue_name].waiting) == 3
    assert isinstance(outcomes.pop("bad\0id"), Exception)
    assert {k: o.status.value for k, o in outcomes.items()} == {k: "queued" for k in "abcd"}
    assert sorted(c.id for c in await pg.dequeue(queue_name, W1, 10, 0.05, LEASE)) == ["a", "b", "c", "d", "first"]


async def test_a_batch_s_events_are_packed_and_long_ids_still_reach_subscribers(pg: PostgresStorage, queue_name: str) -> None:
    await pg.enqueue(queue_name, [job("first")])
    short = [f"s{k}" for k in range(300)]
    long = ["L" * 3900, "M" * 1000]
    huge = "H" * 8000  # an event past NOTIFY's 8000 bytes: a resync
    async with pg.subscribe(queue_name) as events:
        out = await pg.enqueue(queue_name, [job(i) for i in [*short, *long, huge, "last"]])
        assert all(o.status.value == "queued" for o in out)
        seen = await _events(events, 304)
    enqueued = [(k, i) for k, i in seen if k == "enqueued"]
    assert [i for _, i in enqueued] == [*short, *long, "last"]
    assert ("resync", "") in seen
