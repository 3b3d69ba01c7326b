"""PostgresStorage: which wake-ups reach a blocked claim. A completion frees a
concurrency slot: its wake-up reaches the claims waiting for one (a limited claim), not
the others (an unlimited claim would only run an empty claim statement)."""

from __future__ import annotations

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
    count = [0]
    claim = pg._claims.claim

    async def counted(*args: Any) -> Any:
        count[0] += 1
        return await claim(*args)

    pg._claims.claim = counted  # type: ignore[method-assign]
    return count


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
