"""The fault-injecting storage wrapper (``trioqueue.testing``), and the Queue under faults."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from trioqueue import Job, MemoryStorage, Queue, Storage, StorageError, ValidationError
from trioqueue.storage import Groups, NonBlockingStart, Transactions
from trioqueue.storage._capabilities import CAPABILITIES, require
from trioqueue.testing import STORAGE_METHODS, Fault, FaultPlan, FaultyStorage

from storage_helpers import job


def test_every_storage_method_is_wrapped() -> None:
    assert {"enqueue", "dequeue", "settle", "start", "heartbeat", "set_progress", "tick_schedule"} <= set(
        STORAGE_METHODS
    )
    # every call of the core and of every capability memory has (all but transactions)
    faulty = FaultyStorage(MemoryStorage())
    for name in set(STORAGE_METHODS) - {"enqueue_in_transaction", "enqueue_flow_in_transaction"}:
        assert getattr(type(faulty), name).__name__ == name
    with pytest.raises(ValidationError, match=r"FaultPlan.fail_after must be a probability in \[0, 1\], got 2"):
        FaultPlan(fail_after=2)


async def test_a_faulty_storage_has_exactly_the_capabilities_of_the_storage_it_wraps(storage: Storage) -> None:
    """isinstance checks stay truthful through the wrapper (and through a subclass of it):
    it has the capabilities of its storage and no other, but NonBlockingStart (its
    start_nowait could not be faulted). A capability's calls are faulted like the core's."""

    class Sub(FaultyStorage):
        pass

    expected = {c for c in CAPABILITIES if isinstance(storage, c)} - {NonBlockingStart}
    for faulty in (FaultyStorage(storage), Sub(storage)):
        assert {c for c in CAPABILITIES if isinstance(faulty, c)} == expected
        assert isinstance(faulty, FaultyStorage)
    assert isinstance(Sub(storage), Sub)
    assert isinstance(storage, Transactions) == hasattr(FaultyStorage(storage), "enqueue_in_transaction")
    dead = FaultyStorage(storage)
    dead.dead = True
    with pytest.raises(StorageError, match=r"storage unreachable \(group_counts\)"):
        await require(dead, Groups, "test").group_counts("q")


async def _calls(st: FaultyStorage) -> list[tuple[int, str, Fault]]:
    async with st:
        for i in range(40):
            try:
                await st.enqueue("q", [job(f"j{i}")])
                await st.get_job("q", f"j{i}")
            except StorageError:
                pass
    return [(f.call, f.method, f.fault) for f in st.log]


async def test_same_seed_same_faults() -> None:
    plan = FaultPlan(delay=0.2, max_delay=0.001, fail_before=0.2, fail_after=0.2)
    first = await _calls(FaultyStorage(MemoryStorage(), plan, seed=42))
    again = await _calls(FaultyStorage(MemoryStorage(), plan, seed=42))
    other = await _calls(FaultyStorage(MemoryStorage(), plan, seed=43))
    assert first == again and first != other
    assert {fault for _, _, fault in first} == {Fault.DELAY, Fault.FAIL_BEFORE, Fault.FAIL_AFTER}


@pytest.mark.parametrize(
    ("plan", "raises", "landed"),
    [
        (FaultPlan(fail_before=1), StorageError, False),
        (FaultPlan(fail_after=1), StorageError, True),
        (FaultPlan(delay=1, max_delay=0.01), None, True),
        (FaultPlan(cancel_before=1), trio.Cancelled, False),
        (FaultPlan(cancel_after=1), trio.Cancelled, True),
    ],
)
async def test_each_fault_does_what_it_says(
    storage: Storage, queue_name: str, plan: FaultPlan, raises: type[BaseException] | None, landed: bool
) -> None:
    st = FaultyStorage(storage, FaultPlan(methods=frozenset({"enqueue"}), **_fields(plan)), seed=1)
    outcome: list[str] = []
    with trio.CancelScope() as scope:
        st.cancel_scope = scope
        try:
            await st.enqueue(queue_name, [job("x")])
            outcome.append("returned")
        except StorageError:
            outcome.append("StorageError")
    if scope.cancelled_caught:
        outcome.append("Cancelled")
    expected = {None: "returned", StorageError: "StorageError", trio.Cancelled: "Cancelled"}[raises]
    assert outcome == [expected]
    assert (await storage.get_job(queue_name, "x") is not None) == landed
    assert [f.method for f in st.log] == ["enqueue"] and st.log[0].job_ids == ("x",)


def _fields(plan: FaultPlan) -> dict[str, Any]:
    return {k: getattr(plan, k) for k in ("delay", "max_delay", "fail_before", "fail_after", "cancel_before", "cancel_after")}


async def test_dropped_events_are_announced_by_a_resync(storage: Storage, queue_name: str) -> None:
    st = FaultyStorage(storage, FaultPlan(drop_events=1), seed=3)
    async with st.subscribe(queue_name) as events:
        await storage.enqueue(queue_name, [job("e")])
        with trio.fail_after(10):
            batch = await events.receive()
    assert [e.kind for e in batch] == ["resync"]
    assert [f.fault for f in st.log] == [Fault.DROP_EVENTS]


async def test_every_job_completes_despite_storage_faults(storage: Storage, queue_name: str) -> None:
    """Claims, starts, settlements and heartbeats fail at random (before or after reaching
    the storage): every job still completes, and a handler that returned runs again only
    when a settlement about its job was injected a fault."""
    runs: Counter[str] = Counter()

    async def handler(job: Job[Any]) -> int:
        runs[job.id] += 1
        return int(job.payload)

    plan = FaultPlan(
        fail_before=0.15, fail_after=0.15, methods=frozenset({"dequeue", "start", "settle", "heartbeat"})
    )
    faulty = FaultyStorage(storage, plan, seed=11)
    async with (
        # A claim whose reply was lost uses an attempt when the reaper gives it back (the
        # reaper cannot know its handler never ran): with the default 3, a job whose claims
        # were lost three times fails as stalled, about one run in six. The promise tested
        # here is that faults lose no job, so attempts are not what runs out.
        Queue(storage, name=queue_name, max_attempts=20) as producer,
        # A claim whose reply was lost leaves its jobs in the worker's list until their lease
        # runs out and the reaper gives them back: a short lease keeps the test short.
        Queue(
            faulty,
            name=queue_name,
            handler=handler,
            concurrency=4,
            retry_delay=0,
            block_timeout=0.3,
            visibility_timeout=3.0,
        ),
    ):
        results: dict[str, int] = {}

        async def request(i: int) -> None:
            results[f"j{i}"] = await producer.enqueue_and_wait(f"j{i}", i, timeout=60)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(30):
                    nursery.start_soon(request, i)
    assert results == {f"j{i}": i for i in range(30)}
    assert faulty.log, "no fault was injected: the test tested nothing"
    for job_id, n in runs.items():
        if n > 1:
            assert faulty.faults_on(job_id, "settle") or faulty.faults_on(job_id, "start"), (job_id, n)
