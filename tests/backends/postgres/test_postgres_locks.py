"""PostgresStorage's lock order: every transaction that touches a tree of jobs locks its
rows top-down (ancestors first, root first; siblings in the order they were added), in
one order shared by every transaction (by depth from the root, then queue and id), so
concurrent ends, starts, heartbeats and cancels of one tree, and batches spanning
several trees, wait for each other instead of deadlocking. The races run many times
and fail on the first ``40P01``; the batches across trees are driven step by step. A
rate-limited claim counts from when it holds the queue's flow lock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest
import trio

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1, job
from trioqueue.storage import Claim, ClaimLimits, SettleKind, Settlement
from trioqueue.storage._base import FlowJob
from trioqueue.storage.postgres import PostgresStorage

ROUNDS = 25
KIDS = 8


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[PostgresStorage]:
    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}", pool_size=12) as st:
        yield st


def _settlement(claim: Claim, fail: bool) -> Settlement:
    kind = SettleKind.FAIL if fail else SettleKind.COMPLETE
    return Settlement(kind, claim.id, b"x", 60, token=claim.token)


async def _race(calls: list[Callable[[], Awaitable[object]]]) -> None:
    """Run ``calls`` together, each on its own pooled connection; any exception (a
    ``DeadlockDetected`` above all) fails the test."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(call)


async def test_settles_starts_heartbeats_and_a_cancel_of_one_tree_never_deadlock(
    pg: PostgresStorage, queue_name: str
) -> None:
    """A tree (``cancel`` policy) whose children are claimed but not started (reserved):
    half of them carry a cancel request. Together: ``start`` of those (it cancels them,
    which reaches the parent), failures and completions of the others (a failure fails
    the parent and cancels the siblings), a heartbeat of every claim, and a cancel of the
    parent. Round after round, nothing deadlocks and the tree ends consistent."""
    for rnd in range(ROUNDS):
        q = f"{queue_name}-{rnd}"
        kids = [f"kid-{i}" for i in range(KIDS)]
        await pg.enqueue_flow([FlowJob(q, job("root"), None, "cancel"), *(FlowJob(q, job(k), (q, "root")) for k in kids)])
        claims = await pg.dequeue(q, W1, KIDS, 0.1, LEASE, start=0)
        assert len(claims) == KIDS
        requested, others = claims[1::2], claims[0::2]
        for c in requested:
            await pg.cancel(q, c.id)  # (processing: a cancel request)
        tokens = [(c.id, c.token) for c in claims]

        failing = others[rnd % len(others)].id
        await _race(
            [
                partial(pg.start, q, W1, [(c.id, c.token) for c in reversed(requested)]),
                *(partial(pg.settle, q, W1, [_settlement(c, c.id == failing)]) for c in others),
                partial(pg.heartbeat, q, W1, 30.0, list(reversed(tokens)), LEASE),
                partial(pg.cancel, q, "root"),
            ]
        )
        root = await pg.get_job(q, "root")
        assert root is not None and root.state.split(":")[0] in ("failed", "cancelled")
        states = {c.id: (await pg.get_job(q, c.id)).state.split(":")[0] for c in claims}  # type: ignore[union-attr]
        for c in requested:
            assert states[c.id] == "cancelled", states
        # nothing is left running but the children a cancel request reached (their worker ends them)
        for c in others:
            assert states[c.id] in ("completed", "failed", "processing"), states


async def test_sibling_ends_and_a_cancel_of_their_parent_never_deadlock(pg: PostgresStorage, queue_name: str) -> None:
    """Two levels: root -> mid (``cancel``) -> leaves, all leaves running. Every leaf
    settled at once (failures among them) while ``mid`` and ``root`` are cancelled and
    the reaper runs: no deadlock, and the tree ends."""
    for rnd in range(ROUNDS):
        q = f"{queue_name}-{rnd}"
        leaves = [f"leaf-{i}" for i in range(KIDS)]
        await pg.enqueue_flow(
            [
                FlowJob(q, job("root"), None, "continue"),
                FlowJob(q, job("mid"), (q, "root"), "cancel"),
                *(FlowJob(q, job(k), (q, "mid")) for k in leaves),
            ]
        )
        claims = await pg.dequeue(q, W1, KIDS, 0.1, LEASE)
        assert len(claims) == KIDS

        await _race(
            [
                *(partial(pg.settle, q, W1, [_settlement(c, i % 3 == rnd % 3)]) for i, c in enumerate(claims)),
                partial(pg.cancel, q, "mid"),
                partial(pg.cancel, q, "root"),
                partial(pg.recover_stalled, q),
                partial(pg.heartbeat, q, W1, 30.0, [(c.id, c.token) for c in reversed(claims)], LEASE),
            ]
        )
        for jid in ("root", "mid"):
            rec = await pg.get_job(q, jid)
            assert rec is not None and rec.state.split(":")[0] in ("failed", "cancelled"), (jid, rec)


async def test_a_heartbeat_waits_out_a_locked_claim_and_still_extends_its_lease(
    pg: PostgresStorage, queue_name: str
) -> None:
    """A claim whose row another transaction holds is skipped by the heartbeat's batch
    (which never waits holding rows) and extended on its own once the row is free: it is
    neither reported lost nor left with its old lease."""
    await pg.enqueue(queue_name, [job("a"), job("b")])
    claims = {c.id: c for c in await pg.dequeue(queue_name, W1, 2, 0.1, 5.0)}
    lease_of = f"SELECT lease_ms FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = $2"
    async with pg.pool.connection() as conn:
        before = {jid: await conn.fetchval(lease_of, queue_name, jid) for jid in claims}
    replies = []

    async def beat() -> None:
        replies.append(await pg.heartbeat(queue_name, W1, 30.0, [(c.id, c.token) for c in claims.values()], 600.0))

    async with pg.pool.connection() as locker:
        await locker.execute("BEGIN")
        await locker.execute(f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'a' FOR UPDATE", queue_name)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)
                async with pg.pool.connection() as conn:
                    # bounded poll of the server: the heartbeat's single-row update waits on 'a'
                    while not await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'"
                    ):
                        await trio.sleep(0.01)
                    assert await conn.fetchval(lease_of, queue_name, "b") > before["b"] + 60_000  # (batch committed)
                    assert await conn.fetchval(lease_of, queue_name, "a") == before["a"]
                await locker.execute("COMMIT")
    [reply] = replies
    assert reply.lost == [] and reply.cancel_requested == []
    async with pg.pool.connection() as conn:
        assert await conn.fetchval(lease_of, queue_name, "a") > before["a"] + 60_000


async def _until_waiting(pg: PostgresStorage, count: int) -> None:
    """Until ``count`` of this storage's statements wait on a row lock (a bounded poll of
    the server: a lock wait has no event to await)."""
    schema = pg._settings.quoted_schema
    async with pg.pool.connection() as conn:
        while (
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND position($1 in query) > 0",
                schema,
            )
            < count
        ):
            await trio.sleep(0.01)


@pytest.mark.parametrize("end", ["settle", "release"])
async def test_batches_across_trees_of_different_depths_lock_in_one_order(
    pg: PostgresStorage, queue_name: str, end: str
) -> None:
    """Two trees: ``r -> p -> c``, ``r -> f`` and ``s -> q -> e``, ``s -> d``. One
    batch settles (or releases) ``c`` and ``d`` (``r`` is two levels above them, ``s``
    one), the other ``e`` and ``f`` (``s`` two levels above, ``r`` one). A third
    transaction holds ``p`` so the first batch stops half-way through its locks, the
    second batch comes to wait on it, then ``p`` is let go: both batches take their locks in one order (roots
    first, whichever call they come from) and both commit; locking farthest-from-the-job
    first took ``r`` then ``s`` in one and ``s`` then ``r`` in the other (40P01)."""
    q = queue_name
    await pg.enqueue_flow([FlowJob(q, job("r"), None), FlowJob(q, job("p"), (q, "r")), FlowJob(q, job("c"), (q, "p")), FlowJob(q, job("f"), (q, "r"))])
    await pg.enqueue_flow([FlowJob(q, job("s"), None), FlowJob(q, job("q"), (q, "s")), FlowJob(q, job("e"), (q, "q")), FlowJob(q, job("d"), (q, "s"))])
    claims = {c.id: c for c in await pg.dequeue(q, W1, 4, 0.1, LEASE)}
    assert sorted(claims) == ["c", "d", "e", "f"]
    answers: dict[str, object] = {}

    async def end_batch(name: str, ids: list[str]) -> None:
        if end == "settle":
            answers[name] = await pg.settle(q, W1, [_settlement(claims[i], False) for i in ids])
        else:
            answers[name] = await pg.release(q, W1, ids)

    with trio.fail_after(30):
        async with pg.pool.connection() as locker:
            await locker.execute("BEGIN")
            await locker.execute(f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'p' FOR UPDATE", q)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(end_batch, "first", ["c", "d"])
                await _until_waiting(pg, 1)  # the first batch waits on p
                nursery.start_soon(end_batch, "second", ["e", "f"])
                await _until_waiting(pg, 2)  # the second waits on a row the first holds
                await locker.execute("COMMIT")
    done = [True, True] if end == "settle" else 2
    assert answers == {"first": done, "second": done}
    for jid in ("c", "d", "e", "f"):
        rec = await pg.get_job(q, jid)
        assert rec is not None and rec.state.split(":")[0] == ("completed" if end == "settle" else "queued"), (jid, rec)


async def test_a_tree_naming_a_locked_dependency_waits_for_it_without_holding_it(
    pg: PostgresStorage, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dependency's row locked by another transaction: the enqueue naming it does not
    wait on the lock (``NOWAIT``: it could be part of a cycle with a dependency's end), but
    tries again after a pause, and goes through once the row is free."""
    from trioqueue.storage.postgres import _flows

    await pg.enqueue(queue_name, [job("dep")])
    paused = trio.Event()
    real_sleep = trio.sleep

    async def sleep(seconds: float) -> None:
        paused.set()
        await real_sleep(seconds)

    monkeypatch.setattr(_flows.trio, "sleep", sleep)
    async with pg.pool.connection() as conn:
        await conn.execute("BEGIN")
        await conn.fetch(f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'dep' FOR UPDATE", queue_name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pg.enqueue_flow, [FlowJob(queue_name, job("after"), depends_on=((queue_name, "dep"),))])
            with trio.fail_after(10):
                await paused.wait()  # refused at once, not waiting on the row
            await conn.execute("COMMIT")
    record = await pg.get_job(queue_name, "after")
    assert record is not None and record.state.startswith("waiting_children:")


async def test_a_dependency_ending_while_a_job_naming_it_and_its_dependent_is_written_never_deadlocks(
    pg: PostgresStorage, queue_name: str
) -> None:
    """``a`` depends on ``b``; ``b`` completes while ``n`` (depending on ``a`` and ``b``)
    is written: whichever goes first, nothing deadlocks, ``b``'s end is counted once on
    each dependent, and ``n`` runs only after ``a``."""
    for r in range(ROUNDS):
        b, a, n = f"b{r}", f"a{r}", f"n{r}"
        await pg.enqueue(queue_name, [job(b)])
        [claim] = await pg.dequeue(queue_name, W1, 1, 0.1, LEASE)
        await pg.enqueue_flow([FlowJob(queue_name, job(a), depends_on=((queue_name, b),))])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pg.settle, queue_name, W1, [_settlement(claim, False)])
            nursery.start_soon(pg.enqueue_flow, [FlowJob(queue_name, job(n), depends_on=((queue_name, a), (queue_name, b)))])
        [again] = await pg.dequeue(queue_name, W1, 5, 0.1, LEASE)
        assert again.id == a  # released by b's end; n still waits for a
        assert (await pg.get_job(queue_name, n)).state.startswith("waiting_children:")  # type: ignore[union-attr]
        assert await pg.settle(queue_name, W1, [_settlement(again, False)]) == [True]
        [last] = await pg.dequeue(queue_name, W1, 5, 0.1, LEASE)
        assert last.id == n
        assert [c.id for _, c in await pg.get_children(queue_name, n)] == [a, b]


async def test_a_rate_limited_claim_counts_from_when_it_holds_the_queue_lock(pg: PostgresStorage, queue_name: str) -> None:
    """A rate-limited claim that waited for the queue's flow lock (held here as another
    claimer's transaction would hold it) longer than the rate's window counts against
    the rate from when it claimed, not from when it was called: the next claim, right
    after it, is refused. (Counted from the call, its claim had already left the window,
    and two jobs were claimed together against a rate of one a window.)"""
    per = 1.0
    limits = ClaimLimits(rate=1, per=per)
    await pg.enqueue(queue_name, [job("a"), job("b")])
    first: list[str] = []

    async def claim_first() -> None:
        first.extend(c.id for c in await pg.dequeue(queue_name, W1, 1, 0, LEASE, limits=limits))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with pg.transaction() as tx:
                await tx.execute(f"SELECT 1 FROM {pg.schema}.queues WHERE queue = $1 FOR UPDATE", queue_name)
                holder = await tx.fetchval("SELECT pg_backend_pid()")
                nursery.start_soon(claim_first)
                async with pg.pool.connection() as conn:
                    blocked = "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
                    while not await conn.fetchval(blocked, holder):
                        await trio.sleep(0.01)  # another session's lock wait: nothing to wait on
                await trio.sleep(per)  # the window passes while the claim waits for the lock
    assert first == ["a"]
    assert await pg.dequeue(queue_name, "w2", 1, 0, LEASE, limits=limits) == []
