"""Trees of jobs written in the application's transaction (``queue.enqueue(parent, ...,
children=[...], transaction=tx)`` on PostgresStorage): the whole tree appears with the
COMMIT (invisible and unclaimable before it, workers woken after it), nothing is left
after a ROLLBACK, a refused tree leaves the application's transaction usable."""

from __future__ import annotations


import pytest
import trio
import trio.testing

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1
from postgres_server import orders_table, wait_for_lock_wait
from trioqueue import Child, FlowError, Queue, ValidationError
from trioqueue.storage import StorageEvent
from trioqueue.storage.postgres import PostgresStorage


async def _events(receive: trio.MemoryReceiveChannel[list[StorageEvent]], n: int) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    with trio.fail_after(10):
        while len(seen) < n:
            seen += [(e.kind, e.job_id) for e in await receive.receive()]
    return seen


def _tree(side: str) -> list[Child]:
    return [Child("fetch-a", 1), Child("fetch-b", 2, children=[Child("deep", 3)]), Child("mail", 4, queue=side)]


async def test_a_tree_enqueued_in_a_transaction_appears_with_the_commit_and_wakes_workers(
    pg: PostgresStorage, queue_name: str
) -> None:
    table = await orders_table(pg)
    side = f"{queue_name}-side"
    ids = ["report", "fetch-a", "fetch-b", "deep"]
    got: list[str] = []

    async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(c.id for c in await pg.dequeue(queue_name, W1, 5, 30.0, LEASE))

    async with Queue(pg, name=queue_name, reaper=False) as q, pg.subscribe(queue_name, ["enqueued"]) as events:
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:
                await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 1, 9.5)
                result = await q.enqueue("report", None, children=_tree(side), transaction=tx)
                assert result.status.value == "queued"
                # inside the open transaction: no job of the tree is visible or claimable
                for jid in ids:
                    assert await pg.get_job(queue_name, jid) is None
                assert await pg.get_job(side, "mail") is None
                assert await pg.dequeue(queue_name, "other", 5, 0.05, LEASE) == []
                assert await pg.dequeue(side, "other", 5, 0.05, LEASE) == []
                await q.enqueue("marker", 0)  # committed on its own: its event comes first
                assert await _events(events, 1) == [("enqueued", "marker")]
                assert [c.id for c in await pg.dequeue(queue_name, "other", 5, 0.05, LEASE)] == ["marker"]
                await nursery.start(blocked_claim)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []
            # committed: every job's event, and the blocked claim wakes and takes the leaves
            assert sorted(await _events(events, 4)) == sorted(("enqueued", j) for j in ids)
        assert sorted(got) == ["deep", "fetch-a"]
        assert (await pg.get_job(queue_name, "report")).state.startswith("waiting_children:")  # type: ignore[union-attr]
        assert (await pg.get_job(queue_name, "fetch-b")).state.startswith("waiting_children:")  # type: ignore[union-attr]
        assert [c.id for c in await pg.dequeue(side, W1, 5, 0.05, LEASE)] == ["mail"]
        assert [c.id for _, c in await pg.get_children(queue_name, "report")] == ["fetch-a", "fetch-b", "mail"]
    async with pg.pool.connection() as conn:
        assert await conn.fetch(f"SELECT id FROM {table}") == [(1,)]


async def test_a_tree_enqueued_in_a_transaction_that_rolls_back_leaves_nothing(
    pg: PostgresStorage, queue_name: str
) -> None:
    table = await orders_table(pg)
    side = f"{queue_name}-side"
    async with Queue(pg, name=queue_name, reaper=False) as q:
        with pytest.raises(RuntimeError, match="payment declined"):
            async with pg.transaction() as tx:
                await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 2, 3)
                await q.enqueue("report", None, children=_tree(side), transaction=tx)
                raise RuntimeError("payment declined")
        for jid in ("report", "fetch-a", "fetch-b", "deep"):
            assert await pg.get_job(queue_name, jid) is None
        assert await pg.get_job(side, "mail") is None
        assert await pg.dequeue(queue_name, W1, 5, 0.05, LEASE) == []
        assert await pg.dequeue(side, W1, 5, 0.05, LEASE) == []
        async with pg.pool.connection() as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
        # enqueue_many with children: its tree in the transaction too
        async with pg.transaction() as tx:
            [out] = await q.enqueue_many([("r1", 1)], children=[Child("c", 0)], transaction=tx)
            assert out.status.value == "queued"
            assert await pg.get_job(queue_name, "c") is None
        assert [r.id for r in await pg.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["c"]


async def test_a_refused_tree_in_a_transaction_writes_nothing_and_leaves_the_transaction_usable(
    pg: PostgresStorage, queue_name: str
) -> None:
    """A child id that exists: FlowError naming it, nothing of the tree written, and the
    application's transaction goes on (its own rows commit). A root id that exists is a
    duplicate, as without a transaction."""
    table = await orders_table(pg)
    async with Queue(pg, name=queue_name, reaper=False) as q:
        await q.enqueue("taken", 0)
        async with pg.transaction() as tx:
            await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 3, 1)
            with pytest.raises(FlowError, match="'taken'"):
                await q.enqueue("report", None, children=[Child("fresh", 1), Child("taken", 2)], transaction=tx)
            dup = await q.enqueue("taken", None, children=[Child("other", 1)], transaction=tx)
            assert dup.status.value == "duplicate"
            await tx.execute(f"INSERT INTO {table} (id, total) VALUES ($1, $2)", 4, 1)
        for jid in ("report", "fresh", "other"):
            assert await pg.get_job(queue_name, jid) is None
        async with pg.pool.connection() as conn:
            assert await conn.fetch(f"SELECT id FROM {table} ORDER BY id") == [(3,), (4,)]
        # a transaction of another storage or one that ended: refused, naming the root
        async with pg.transaction() as tx:
            pass
        with pytest.raises(ValidationError, match=r"job 'late'.*has ended"):
            await q.enqueue("late", None, children=[Child("late-c", 1)], transaction=tx)
        assert await pg.get_job(queue_name, "late") is None and await pg.get_job(queue_name, "late-c") is None


async def test_concurrent_transactions_enqueueing_one_tree_root_write_it_once(
    pg: PostgresStorage, queue_name: str
) -> None:
    """Two application transactions enqueue a tree under the same root id: the second
    waits for the first; once the first commits it is a duplicate and writes nothing of
    its own tree (it does not overwrite the first's root)."""
    async with Queue(pg, name=queue_name, reaper=False) as q:
        second: list[str] = []

        async def late_writer(first_committed: trio.Event) -> None:
            async with pg.transaction() as tx2:
                out = await q.enqueue("root", None, children=[Child("kid-2", 2)], transaction=tx2)
                assert first_committed.is_set()  # (it waited for the first transaction)
                second.append(out.status.value)

        committed = trio.Event()
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                async with pg.transaction() as tx1:
                    await q.enqueue("root", None, children=[Child("kid-1", 1)], transaction=tx1)
                    nursery.start_soon(late_writer, committed)
                    # bounded poll of the server's state: the second transaction waits on the root's row
                    await wait_for_lock_wait(pg)
                committed.set()
        assert second == ["duplicate"]
        assert [c.id for _, c in await pg.get_children(queue_name, "root")] == ["kid-1"]
        assert await pg.get_job(queue_name, "kid-2") is None
        assert [c.id for c in await pg.dequeue(queue_name, W1, 5, 0.05, LEASE)] == ["kid-1"]



async def test_a_job_enqueued_in_an_open_transaction_holds_up_nothing_of_its_group(
    pg: PostgresStorage, queue_name: str
) -> None:
    """While an application transaction that enqueued a job of group G stays open (the
    job invisible), another producer's enqueue of a job of G and a worker's settlement of
    G's running job (which frees G's slot: G back in the rings) go through; once the
    transaction commits, G's jobs are claimed in turn."""
    from storage_helpers import job
    from trioqueue.storage import ClaimLimits, Settlement, SettleKind

    q = queue_name
    one = ClaimLimits(group_concurrency=1)
    await pg.enqueue(q, [job(i)._replace(group="g") for i in ("run", "next")])
    claims = await pg.dequeue(q, W1, 5, 0.05, LEASE, limits=one)  # "run"; g is full: out of the ring
    assert [c.id for c in claims] == ["run"]
    done = Settlement(SettleKind.COMPLETE, "run", b"1", ttl=60.0, token=claims[0].token)
    async with pg.transaction() as tx:
        assert [o.status.value for o in await pg.enqueue_in_transaction(q, [job("tx-job")._replace(group="g")], tx)] == [
            "queued"
        ]
        with trio.fail_after(10):  # (a guard: on the old schema both wait for the transaction)
            assert [o.status.value for o in await pg.enqueue(q, [job("other")._replace(group="g")])] == ["queued"]
            assert await pg.settle(q, W1, [done]) == [True]
        assert await pg.get_job(q, "tx-job") is None
    got = [c.id for _ in range(4) for c in await pg.dequeue(q, W1, 1, 0.05, LEASE, limits=ClaimLimits())]
    assert got == ["next", "tx-job", "other"]


async def test_a_job_of_a_group_queued_while_a_claim_empties_its_ring_entry_is_claimed(
    pg: PostgresStorage, queue_name: str
) -> None:
    """A job of group G becomes queued in a transaction T2 whose ``group_moved`` trigger
    already ran (``SET CONSTRAINTS ALL IMMEDIATE``: as a settlement's retry does in its
    own statement) while T2 is still open; meanwhile a claim runs, which may take G's only
    visible job. Once T2 commits, its job is claimed too. (Found by the model walks, seed
    37 on postgres: a retried job of a group stayed ``queued`` for ever, its group out of
    the rings, removed by a claim of the group's other job that did not see it yet.)"""
    from storage_helpers import job

    q = queue_name
    await pg.enqueue(q, [job("first")._replace(group="g")])  # G in the ring
    got: list[str] = []
    claimed = trio.Event()

    async def claim() -> None:
        got.extend(c.id for c in await pg.dequeue(q, W1, 5, 0.05, LEASE))
        claimed.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:
                await pg.enqueue_in_transaction(q, [job("late")._replace(group="g")], tx)
                await tx.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the trigger runs now: G's entry is there already
                nursery.start_soon(claim)
                # the claim takes "first"; it ends, or waits for this transaction before it
                # removes G's entry (then it sees "late" and keeps it)
                async with pg.pool.connection() as conn:
                    while not claimed.is_set() and not await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    ):
                        await trio.sleep(0.01)
        got += [c.id for c in await pg.dequeue(q, W1, 5, 0.05, LEASE)]
    assert got == ["first", "late"]
