"""Where trees and dependencies cross the other features (retry, groups, priorities,
durable sleep, cancel, removal): conformance, every backend with the capabilities each
test names. (Durable sleep and signals with the rest: test_durable_crossings.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import Child, ChildJobFailedError, Job, JobState, Queue, Storage

from support import Recorder
from test_flows import FAST, Handlers, fail

pytestmark = pytest.mark.capability("Trees")


async def test_a_retried_parent_dependent_or_child_is_a_job_of_its_own(storage: Storage, queue_name: str) -> None:
    """``Queue.retry`` of a parent failed by its child, of a dependent failed by its
    dependency, and of that child, makes each a new job outside the tree: the parent and
    the dependent run and read no children, and the child names no parent."""
    seen: dict[str, Any] = {}

    async def reads(job: Job[Any]) -> str:
        seen[job.id] = (await job.children_results(), await job.children_failures())
        return f"ran {job.id}"

    async with Queue(storage, name=queue_name, handler=Handlers(dep=fail, kid=fail, parent=reads, dependent=reads), **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        q.on("failed", events)
        with trio.fail_after(10):
            await q.enqueue("dep", None, max_attempts=1)
            await events.wait_for("failed", "dep")
            with pytest.raises(ChildJobFailedError):
                await q.enqueue_and_wait("dependent", None, depends_on=["dep"])
            with pytest.raises(ChildJobFailedError):
                await q.enqueue_and_wait("parent", None, children=[Child("kid", options={"max_attempts": 1})])
            for job_id in ("parent", "dependent", "kid"):
                assert await q.retry(job_id)
            await events.wait_for("completed", "parent")
            await events.wait_for("completed", "dependent")
            await events.wait_for("failed", "kid", count=2)  # (it fails again: its own run)
        assert seen == {"parent": ({}, {}), "dependent": ({}, {})}
        for job_id in ("parent", "dependent", "kid"):
            status = await q.get_status(job_id)
            assert status is not None and status.parent is None and status.children is None, status
            assert await q.children(job_id) == {}


@pytest.mark.capability("Trees", "Groups")
@pytest.mark.parametrize("waits_for", ["children", "depends_on"])
async def test_a_released_parent_or_dependent_runs_in_its_group(storage: Storage, queue_name: str, waits_for: str) -> None:
    """A grouped job that waited for its children or its dependencies is released into
    its group: with ``group_concurrency=1`` it does not run while another job of the
    group runs (a job without a group enqueued after it runs meanwhile), then it does."""
    started, gate = trio.Event(), trio.Event()

    async def blocker(job: Job[Any]) -> str:
        started.set()
        await gate.wait()
        return "blocker"

    handlers = Handlers(blocker=blocker)
    async with Queue(storage, name=queue_name, handler=handlers, concurrency=3, group_concurrency=1, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        q.on("promoted", events)
        with trio.fail_after(10):
            await q.enqueue("blocker", None, group="g")
            await started.wait()
            if waits_for == "children":
                await q.enqueue("waiter", None, group="g", children=[Child("first")])
            else:
                await q.enqueue_and_wait("first", None)
                await q.enqueue("waiter", None, group="g", depends_on=["first"])
            await events.wait_for("completed", "first")
            await events.wait_for("promoted", "waiter")  # released: queued in group "g"
            assert await q.enqueue_and_wait("probe", None) == "done probe"  # a free slot meanwhile
            assert "waiter" not in handlers.ran  # the group's one slot is the blocker's
            status = await q.get_status("waiter")
            assert status is not None and status.state is JobState.QUEUED and status.group == "g"
            gate.set()
            await events.wait_for("completed", "waiter")
        assert handlers.ran.index("waiter") > handlers.ran.index("probe")


@pytest.mark.capability("Trees", "Signals")
async def test_a_dependency_waiting_for_a_signal_holds_its_dependent_until_it_ends(storage: Storage, queue_name: str) -> None:
    """A dependency that waits for a signal (its run parked) has not ended: its dependent
    waits on; the signal completes it and the dependent runs with its result. One
    cancelled while it waits fails its dependent (under ``cancel``)."""
    seen: dict[str, Any] = {}

    async def dep(job: Job[Any]) -> Any:
        return await job.wait_for_signal("go")

    async def reads(job: Job[Any]) -> str:
        seen[job.id] = await job.children_results()
        return "ran"

    async with Queue(storage, name=queue_name, handler=Handlers(dep=dep, lost=dep, dependent=reads), **FAST) as q:
        events = Recorder()
        for name in ("waiting_signal", "completed", "failed", "cancelled"):
            q.on(name, events)
        with trio.fail_after(10):
            await q.enqueue("dep", None)
            await q.enqueue("lost", None)
            await q.enqueue("dependent", None, depends_on=["dep"])
            await q.enqueue("orphan", None, depends_on=["lost"])
            await events.wait_for("waiting_signal", "dep")
            await events.wait_for("waiting_signal", "lost")
            assert (await q.get_status("dependent")).state is JobState.WAITING_CHILDREN  # type: ignore[union-attr]
            assert await q.signal("dep", "go", {"n": 1}) == "delivered"
            await events.wait_for("completed", "dependent")
            await q.cancel("lost")
            await events.wait_for("failed", "orphan")
        assert seen == {"dependent": {"dep": {"n": 1}}}
        orphan = await q.get_status("orphan")
        assert orphan is not None and orphan.error is not None and orphan.error.type == "ChildJobFailedError"


@pytest.mark.capability("Trees", "Debounce")
@pytest.mark.parametrize("waits_for", ["children", "depends_on"])
async def test_a_debounce_of_a_waiting_parent_or_dependent_is_a_duplicate(
    storage: Storage, queue_name: str, waits_for: str
) -> None:
    """A debounced enqueue of the id of a job waiting for its children or dependencies
    changes nothing: it is a duplicate, and the job keeps its payload and keeps waiting."""
    async with Queue(storage, name=queue_name, **FAST) as q:
        await q.enqueue("first", None, delay=3600)
        if waits_for == "children":
            await q.enqueue("waiter", "old", children=[Child("kid", options={"delay": 3600})])
        else:
            await q.enqueue("waiter", "old", depends_on=["first"])
        result = await q.enqueue("waiter", "new", debounce=1.0)
        assert result.status.value == "duplicate"
        status = await q.get_status("waiter")
        assert status is not None and status.state is JobState.WAITING_CHILDREN
    seen: list[Any] = []

    async def record(job: Job[Any]) -> None:
        seen.append(job.payload)

    async with Queue(storage, name=queue_name, handler=Handlers(waiter=record), **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.cancel("kid" if waits_for == "children" else "first")  # (under cancel: it fails)
            await q.retry("waiter")
            await events.wait_for("completed", "waiter")
    assert seen == ["old"]


@pytest.mark.capability("Trees", "Administration")
async def test_purge_spares_the_ended_jobs_a_waiting_parent_or_dependent_will_read(storage: Storage, queue_name: str) -> None:
    """``purge`` forgets finished jobs as if their TTL had run out; a child or dependency
    kept for a parent or dependent still waiting has no TTL running, so it is spared, and
    they read its result when they run (it was forgotten, and then read as cancelled on
    some storages and not at all on others)."""
    seen: dict[str, Any] = {}
    gate = trio.Event()

    async def last(job: Job[Any]) -> str:
        await gate.wait()
        return "last"

    async def reads(job: Job[Any]) -> None:
        seen[job.id] = (await job.children_results(), sorted(await job.children_failures()))

    handlers = Handlers(last=last, dependent=reads, parent=reads)
    async with Queue(storage, name=queue_name, handler=handlers, concurrency=3, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("dep", None)
            await q.enqueue("last", None)
            await q.enqueue("dependent", None, depends_on=["dep", "last"])
            await q.enqueue(
                "parent", None, children=[Child("kid"), Child("kid2", options={"delay": 3600})], on_child_failure="continue"
            )
            await events.wait_for("completed", "dep")
            await events.wait_for("completed", "kid")
            await q.enqueue_and_wait("plain", None)
            assert await q.purge(JobState.COMPLETED) == 1  # "plain" only
            assert await q.get_status("dep") is not None and await q.get_status("kid") is not None
            gate.set()
            await q.cancel("kid2")
            await events.wait_for("completed", "dependent")
            await events.wait_for("completed", "parent")
    assert seen == {
        "dependent": ({"dep": "done dep", "last": "last"}, []),
        "parent": ({"kid": "done kid"}, ["kid2"]),
    }
