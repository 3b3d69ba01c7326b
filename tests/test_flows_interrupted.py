"""Trees of jobs whose steps are interrupted or interleaved, every backend: a dynamic
parent whose run was cut short (a ``kill -9``, a forced stop, an exception) after
``add_children`` and before its ``WaitForChildren`` was stored, and a parent released by
its last child while a sibling fails the root (the cancel cascade and the release of a
waiting parent are one atomic step with respect to each other)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from storage_helpers import W1, W2, claim, job, kind, settlement
from support import Recorder
from trioqueue import Child, ChildJobFailedError, Job, JobState, Queue, Storage
from trioqueue._model._serde import decode_error
from trioqueue.storage import SettleKind
from trioqueue.storage._base import FlowJob

_ERR = b'{"type":"UnrecoverableError","message":"bad broke","traceback":""}'


async def _failed_by_children(storage: Storage, q: str, job_id: str) -> None:
    rec = await storage.get_job(q, job_id)
    assert rec is not None and kind(rec.state) == "failed", rec
    assert rec.error is not None
    error = decode_error(rec.error)
    assert error.type == "ChildJobFailedError", error
    assert "bad broke" in error.message, error


@pytest.mark.parametrize("when", ["while-it-ran", "after-it-was-released"])
async def test_a_parent_cut_short_after_add_children_ends_failed_when_a_child_failed(
    storage: Storage, queue_name: str, when: str
) -> None:
    """The parent's run adds children, then is cut short (released, as a forced stop
    does; the reaper's recovery after a kill -9 puts it back the same way) before it
    stores ``WaitForChildren``. A child fails for good under ``cancel`` (while the cut
    run still held the parent, or after): the parent's next run, which finds its
    children ended and returns, must end failed (``ChildJobFailedError``), not
    completed."""
    q = queue_name
    await storage.enqueue(q, [job("p")])
    [run] = await claim(storage, q)
    kids = f"{q}-kids"  # (the parent alone on its queue: the children are claimed apart)
    children = [FlowJob(kids, job("bad", max_attempts=1), (q, "p")), FlowJob(kids, job("slow"), (q, "p"))]
    assert await storage.add_children(q, W1, "p", run.token, children, "cancel")
    if when == "after-it-was-released":
        assert await storage.release(q, W1, ["p"]) == 1
    [bad] = await claim(storage, kids, W2, n=1)
    assert bad.id == "bad"
    assert await storage.settle(kids, W2, [settlement(SettleKind.FAIL, kids, "bad", _ERR, ttl=60)]) == [True]
    if when == "while-it-ran":
        assert await storage.release(q, W1, ["p"]) == 1
    slow = await storage.get_job(kids, "slow")
    assert slow is not None and kind(slow.state) == "cancelled", slow
    # Its next run, if it has one (a storage may fail it at once instead): the handler
    # finds its children ended and returns.
    for again in await claim(storage, q):
        assert again.id == "p"
        assert await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "p", b'"done"', ttl=60)]) == [True]
    await _failed_by_children(storage, q, "p")


@pytest.mark.parametrize("settle_as", [SettleKind.RETRY, SettleKind.RATE_LIMITED])
async def test_a_parent_whose_child_failed_is_not_put_back_by_its_run(
    storage: Storage, queue_name: str, settle_as: SettleKind
) -> None:
    """The run of a parent whose child failed under ``cancel`` ends with a retry (the
    handler raised) or ``RateLimited``: the parent ends failed by its children instead
    of running again."""
    q = queue_name
    await storage.enqueue(q, [job("p")])
    [run] = await claim(storage, q)
    assert await storage.add_children(q, W1, "p", run.token, [FlowJob(q, job("bad", max_attempts=1), (q, "p"))])
    [bad] = await claim(storage, q, W2, n=1)
    assert await storage.settle(q, W2, [settlement(SettleKind.FAIL, q, "bad", _ERR, ttl=60)]) == [True]
    err = b'{"type":"RuntimeError","message":"interrupted","traceback":""}'
    assert await storage.settle(q, W1, [settlement(settle_as, q, "p", err, delay=0)]) == [True]
    await _failed_by_children(storage, q, "p")


async def test_a_dynamic_parent_that_raised_after_add_children_fails_by_its_failed_child(
    storage: Storage, queue_name: str
) -> None:
    """Through a Queue: the parent adds children, a child fails for good, and the parent
    raises before ``WaitForChildren`` (as a run cut short does); it is retried, finds its
    children ended and would return: it ends failed with ``ChildJobFailedError``."""
    runs: list[int] = []
    bad_failed = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        if job.id == "bad":
            raise RuntimeError("bad broke")
        if job.id == "slow":
            await trio.sleep_forever()
        runs.append(job.attempts)
        if len(runs) == 1:
            await job.add_children([Child("bad", options={"max_attempts": 1}), Child("slow")])
            await bad_failed.wait()
            raise RuntimeError("interrupted before WaitForChildren")
        return "parent done"

    async with Queue(storage, name=queue_name, handler=handler, concurrency=3, retry_delay=0, block_timeout=0.5) as q:
        failed = Recorder()
        q.on("failed", failed)
        q.on("cancelled", failed)
        outcome: dict[str, Any] = {}

        async def wait_for_parent() -> None:
            try:
                outcome["result"] = await q.enqueue_and_wait("parent", None, max_attempts=3)
            except ChildJobFailedError as exc:
                outcome["error"] = exc

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_parent)
                await failed.wait_for("failed", "bad")
                bad_failed.set()
            await failed.wait_for("cancelled", "slow")  # (running: cancelled in its worker)
        assert "result" not in outcome, outcome
        assert "bad broke" in str(outcome["error"])
        status = await q.get_status("slow")
        assert status is not None and status.state is JobState.CANCELLED
