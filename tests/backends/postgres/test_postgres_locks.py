"""PostgresStorage's lock order: every transaction that touches a tree of jobs locks its
rows top-down (ancestors first, root first; siblings in the order they were added), so
concurrent ends, starts, heartbeats and cancels of one tree wait for each other instead
of deadlocking. Each test races them many times and fails on the first ``40P01``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest
import trio

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1, job
from trioqueue.storage import Claim, SettleKind, Settlement
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
