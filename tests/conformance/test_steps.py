"""Steps of durable jobs (``Job.step``) and resuming from the failed step (conformance:
every backend with the Steps capability). Issue 34, items 1 and 2."""

from __future__ import annotations

import pytest
import trio

from trioqueue import Storage
from trioqueue.storage import Administration, Settlement, SettleKind, Steps

from storage_helpers import LEASE, W1, W2, job

pytestmark = pytest.mark.capability("Steps")

# -- the storage ---------------------------------------------------------------------------


async def test_save_step_is_fenced_by_the_claim_token(storage: Storage, queue_name: str) -> None:
    """Only the holder of the current claim stores a step; the steps come back in the
    order they were saved; a name stored twice keeps its first value."""
    assert isinstance(storage, Steps)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("s")])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.get_steps(queue_name, "s") == {}
    assert await storage.save_step(queue_name, W1, "s", claim.token, "b", b"2")
    assert await storage.save_step(queue_name, W1, "s", claim.token, "a", b"1")
    assert not await storage.save_step(queue_name, W1, "s", "not-the-claim", "c", b"3")
    assert not await storage.save_step(queue_name, W2, "s", claim.token, "c", b"3")
    assert not await storage.save_step(queue_name, W1, "unknown", claim.token, "c", b"3")
    assert await storage.save_step(queue_name, W1, "s", claim.token, "a", b"again")  # (a retried save)
    assert list((await storage.get_steps(queue_name, "s")).items()) == [("b", b"2"), ("a", b"1")]
    done = Settlement(SettleKind.COMPLETE, "s", b"1", 60, token=claim.token)
    assert await storage.settle(queue_name, W1, [done]) == [True]
    assert not await storage.save_step(queue_name, W1, "s", claim.token, "late", b"4")  # settled: not held
    assert list(await storage.get_steps(queue_name, "s")) == ["b", "a"]  # kept with the completed job
    assert await storage.get_steps(queue_name, "unknown") == {}


async def test_retry_job_keeps_steps_unless_reset_and_a_new_incarnation_has_none(storage: Storage, queue_name: str) -> None:
    assert isinstance(storage, Steps) and isinstance(storage, Administration)
    await storage.heartbeat(queue_name, W1, 30.0, [], LEASE)
    await storage.enqueue(queue_name, [job("r", max_attempts=1)])
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "a", b"1")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.FAIL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.retry_job(queue_name, "r", "t2")
    assert await storage.get_steps(queue_name, "r") == {"a": b"1"}
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "b", b"2")  # the new claim stores
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.FAIL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.get_steps(queue_name, "r") == {"a": b"1", "b": b"2"}
    assert await storage.retry_job(queue_name, "r", "t3", reset_steps=True)
    assert await storage.get_steps(queue_name, "r") == {}
    # cancelled, then enqueued again: a new incarnation starts with no steps
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "c", b"3")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.CANCEL, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.get_steps(queue_name, "r") == {"c": b"3"}
    await storage.enqueue(queue_name, [job("r", token="t4")])
    assert await storage.get_steps(queue_name, "r") == {}
    # removed (forgotten), then enqueued again: none either
    [claim] = await storage.dequeue(queue_name, W1, 1, 0.05, LEASE)
    assert await storage.save_step(queue_name, W1, "r", claim.token, "d", b"4")
    assert await storage.settle(queue_name, W1, [Settlement(SettleKind.COMPLETE, "r", b"", 60, token=claim.token)]) == [True]
    assert await storage.remove_job(queue_name, "r")
    assert await storage.get_steps(queue_name, "r") == {}
    await storage.enqueue(queue_name, [job("r", token="t5")])
    assert await storage.get_steps(queue_name, "r") == {}
