"""PostgresStorage: which wake-ups reach a blocked claim. A completion frees a
concurrency slot: its wake-up reaches the claims waiting for one (a limited claim), not
the others (an unlimited claim would only run an empty claim statement). A ready job a
claim skipped because another transaction held it is claimed when that transaction ends,
even without a wake-up (a rollback)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import trio
import trio.testing

pytest.importorskip("psycopg")

from storage_helpers import LEASE, W1, W2, job
from trioqueue.storage import ClaimLimits, SettleKind, Settlement
from trioqueue.storage.postgres import PostgresStorage


def _count_claims(pg: PostgresStorage) -> list[int]:
    """Count the claim attempts (statements) of ``pg`` from now on."""
    return _watch_claims(pg)[0]


def _watch_claims(pg: PostgresStorage) -> tuple[list[int], list[trio.Event]]:
    """Count the claim attempts (statements) of ``pg`` from now on; with an event set as
    each of the first eight returns."""
    count = [0]
    done = [trio.Event() for _ in range(8)]
    claim = pg._claims.claim

    async def counted(*args: Any) -> Any:
        count[0] += 1
        try:
            return await claim(*args)
        finally:
            if count[0] <= len(done):
                done[count[0] - 1].set()

    pg._claims.claim = counted  # type: ignore[method-assign,assignment]
    return count, done


async def test_a_completion_does_not_wake_an_unlimited_claim(pg: PostgresStorage, queue_name: str) -> None:
    await pg.enqueue(queue_name, [job("a")])
    [held] = await pg.dequeue(queue_name, W1, 1, 0.05, LEASE)
    attempts = _count_claims(pg)
    got: list[str] = []

    async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(c.id for c in await pg.dequeue(queue_name, W2, 5, 30.0, LEASE))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(blocked_claim)
            await trio.testing.wait_all_tasks_blocked()
            assert attempts[0] == 1
            await pg.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "a", b"1", 60, token=held.token)])
            await trio.sleep(0.3)  # the completion's NOTIFY has come and gone
            assert attempts[0] == 1  # not woken: no empty claim
            await pg.enqueue(queue_name, [job("b")])  # a new job does wake it
    assert got == ["b"] and attempts[0] == 2


async def test_a_completion_wakes_a_claim_waiting_for_a_slot(pg: PostgresStorage, queue_name: str) -> None:
    limits = ClaimLimits(concurrency=1)
    await pg.enqueue(queue_name, [job("a"), job("b")])
    [held] = await pg.dequeue(queue_name, W1, 1, 0.05, LEASE, None, limits)
    got: list[str] = []

    async def blocked_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        got.extend(c.id for c in await pg.dequeue(queue_name, W2, 1, 30.0, LEASE, None, limits))

    with trio.fail_after(2):  # well before the 5 s polling fallback
        async with trio.open_nursery() as nursery:
            await nursery.start(blocked_claim)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # the one slot is held
            await pg.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "a", b"1", 60, token=held.token)])
    assert got == ["b"]


@pytest.mark.parametrize("end", ["ROLLBACK", "COMMIT"])
@pytest.mark.parametrize("short", [False, True], ids=["empty", "short"])
@pytest.mark.parametrize("limits", [None, ClaimLimits(concurrency=5)], ids=["one_statement", "limited"])
@pytest.mark.parametrize("groups", [None, ("g", "g"), ("g", "h"), ("g", None)], ids=["plain", "one_group", "two_groups", "mixed"])
async def test_a_ready_job_skipped_while_locked_is_claimed_when_the_lock_ends_without_polling(
    postgres_url: str, queue_name: str, end: str, short: bool, limits: ClaimLimits | None,
    groups: tuple[str | None, str | None] | None,
) -> None:
    """A claim skips a ready job another transaction holds locked (SKIP LOCKED); that
    transaction then ends without changing the job (a rollback, or a commit of a row lock
    only: no wake-up NOTIFY). The waiting claim takes the job then, not at its next poll
    (an hour away here: the bound below is only reached if the wake-up is lost), in
    the one-statement claim and in the general one (a limited claim), on a queue without
    groups and on one whose jobs have groups (claimed in the groups' turns)."""
    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}", poll_interval=3600.0) as pg:
        ga, gb = groups or (None, None)
        a, b = job("a")._replace(group=ga), job("b")._replace(group=gb)
        await pg.enqueue(queue_name, [a, b] if short else [a])
        _, claimed = _watch_claims(pg)
        got: list[list[str]] = []

        async def claims() -> None:
            got.append([c.id for c in await pg.dequeue(queue_name, W1, 2, 3600.0, LEASE, None, limits)])
            if short:  # the next call of the worker's loop
                got.append([c.id for c in await pg.dequeue(queue_name, W1, 2, 3600.0, LEASE, None, limits)])

        async with pg.pool.connection() as locker:
            await locker.execute("BEGIN")
            await locker.execute(
                f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'a' FOR UPDATE", queue_name
            )
            with trio.fail_after(30):  # a lost wake-up waits an hour
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(claims)
                    await claimed[0].wait()  # the claim ran while 'a' was locked
                    await locker.execute(end)
        assert got == ([["b"], ["a"]] if short else [["a"]])


async def test_claims_that_skipped_one_locked_job_wait_for_it_on_one_connection(
    postgres_url: str, queue_name: str
) -> None:
    """Two idle claims of one storage that skipped the same held job wait for its lock
    through one statement on the server (not a pooled connection each); when the lock
    ends, one claims the job and the other waits on for the next wake-up."""
    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}", poll_interval=3600.0) as pg:
        schema = pg._settings.quoted_schema
        await pg.enqueue(queue_name, [job("a")])
        _, claimed = _watch_claims(pg)
        got: list[str] = []

        async def claim(worker: str) -> None:
            got.extend(c.id for c in await pg.dequeue(queue_name, worker, 1, 3600.0, LEASE))

        async with pg.pool.connection() as locker, pg.pool.connection() as watcher:
            await locker.execute("BEGIN")
            await locker.execute(f"SELECT 1 FROM {schema}.jobs WHERE queue = $1 AND id = 'a' FOR UPDATE", queue_name)
            with trio.fail_after(30):  # a lost wake-up waits an hour
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(claim, W1)
                    nursery.start_soon(claim, W2)
                    await claimed[1].wait()  # both claims skipped 'a'
                    waits = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0"
                    while not await watcher.fetchval(waits, schema):  # (a lock wait has no event to await)
                        await trio.sleep(0.01)
                    await trio.testing.wait_all_tasks_blocked()
                    assert await watcher.fetchval(waits, schema) == 1
                    await locker.execute("ROLLBACK")
                    while not got:
                        await trio.sleep(0.01)
                    assert got == ["a"]
                    await pg.enqueue(queue_name, [job("b")])  # the other claim's wake-up
        assert sorted(got) == ["a", "b"]


@pytest.mark.parametrize("end", ["ROLLBACK", "COMMIT"])
async def test_a_due_job_held_by_another_transaction_is_waited_for_not_claimed_again_and_again(
    postgres_url: str, queue_name: str, end: str
) -> None:
    """A delayed job comes due while another transaction holds its row: the claim's
    promotion skips it (SKIP LOCKED), so it stays due, in the past. The waiting claim
    waits for that row's lock (a few claims while it is held, not one a millisecond),
    and promotes and claims the job when the lock ends without a wake-up."""
    async with PostgresStorage(postgres_url, schema=f"t_{uuid.uuid4().hex[:12]}", poll_interval=3600.0) as pg:
        await pg.enqueue(queue_name, [job("a")._replace(run_at=time.time() + 0.05)])
        async with pg.pool.connection() as locker:
            await locker.execute("BEGIN")
            await locker.execute(
                f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'a' FOR UPDATE", queue_name
            )
            await trio.sleep(0.1)  # (wall clock: the job's time, in ms of it, passes)
            attempts, claimed = _watch_claims(pg)
            got: list[str] = []

            async def claim() -> None:
                got.extend(c.id for c in await pg.dequeue(queue_name, W1, 1, 3600.0, LEASE))

            with trio.fail_after(30):  # a lost wake-up waits an hour
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(claim)
                    await claimed[0].wait()  # the claim ran while 'a' was held and due
                    await trio.sleep(0.5)  # the row stays held a while (no event: time is the point)
                    during = attempts[0]
                    await locker.execute(end)
        assert got == ["a"]
        assert during <= 3  # (a claim spinning on the past due time makes hundreds)


@pytest.mark.parametrize("held", ["due", "stalled"])
async def test_a_recovery_scan_that_skipped_a_held_job_names_no_deadline_in_the_past(
    pg: PostgresStorage, queue_name: str, held: str
) -> None:
    """A recovery scan skips a due or stalled job another transaction holds (SKIP
    LOCKED); the next deadline it returns is not that job's time, already past (the
    reaper would scan again at once, and again, for as long as the row is held): the
    job is seen at the scan after the next deadline or the scan interval."""
    if held == "due":
        await pg.enqueue(queue_name, [job("a")._replace(run_at=time.time() + 0.05)])
    else:
        await pg.enqueue(queue_name, [job("a")])
        assert [c.id for c in await pg.dequeue(queue_name, W1, 1, 0.0, 0.05)] == ["a"]
    await trio.sleep(0.1)  # (wall clock: the job's time or lease, in ms of it, passes)
    async with pg.pool.connection() as locker:
        await locker.execute("BEGIN")
        await locker.execute(
            f"SELECT 1 FROM {pg._settings.quoted_schema}.jobs WHERE queue = $1 AND id = 'a' FOR UPDATE", queue_name
        )
        recovered, deadline = await pg.recover_stalled(queue_name)
        await locker.execute("ROLLBACK")
    assert (recovered, deadline) == ([], None)  # (no other job: no other deadline)
