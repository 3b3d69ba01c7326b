"""Dependencies between jobs (``depends_on``): conformance, every backend.

A job enqueued with ``depends_on=[id or JobRef, ...]`` waits in ``waiting_children`` until
every named job (existing, of any queue of the storage, in any state) is terminal, then
runs and reads their outcomes as a parent reads its children's, under the same
``on_child_failure`` rules. Many jobs may depend on one; a dependency's record is kept
until every dependent has ended; a dependent's end never cancels its dependencies."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioqueue import (
    CancelStatus,
    Child,
    ChildJobFailedError,
    FlowError,
    Job,
    JobFailedError,
    JobRef,
    JobState,
    Queue,
    Storage,
)

from support import Recorder
from test_flows import FAST, Handlers, fail, only_the_pending_one_is_left, tagged

pytestmark = pytest.mark.capability("Trees")


def reader(seen: dict[str, Any], key: str) -> Any:
    """A handler that records the results and failures it reads."""

    async def read(job: Job[Any]) -> str:
        seen[key] = (await job.children_results(), await job.children_failures())
        return f"ran {job.id}"

    return read


async def test_a_dependent_waits_until_every_dependency_is_terminal_then_runs_once(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    gate = trio.Event()

    async def slow(job: Job[Any]) -> str:
        await gate.wait()
        return "b"

    handlers = Handlers(b=slow, report=reader(seen, "report"))
    async with Queue(storage, name=queue_name, handler=handlers, concurrency=4, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("a", None)
            await q.enqueue("b", None)
            await q.enqueue("report", None, depends_on=["a", JobRef(queue_name, "b")])
            await events.wait_for("completed", "a")
            status = await q.get_status("report")
            assert status is not None and status.state is JobState.WAITING_CHILDREN
            assert "report" not in handlers.ran
            gate.set()
            await events.wait_for("completed", "report")
        assert handlers.ran.count("report") == 1
        assert seen["report"] == ({"a": "done a", "b": "b"}, {})
        assert set(await q.children("report")) == {JobRef(queue_name, "a"), JobRef(queue_name, "b")}


async def test_a_dependency_already_terminal_counts_at_once(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    handlers = Handlers(after=reader(seen, "after"))
    async with Queue(storage, name=queue_name, handler=handlers, **FAST) as q:
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("first", None) == "done first"
            assert await q.enqueue_and_wait("after", None, depends_on=["first"]) == "ran after"
        assert seen["after"] == ({"first": "done first"}, {})


async def test_an_unknown_dependency_is_refused_naming_both_and_writes_nothing(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, **FAST) as q:
        await q.enqueue("known", None)
        with pytest.raises(FlowError, match="'job' depends on job 'ghost' of queue .*which does not exist"):
            await q.enqueue("job", None, depends_on=["known", "ghost"])
        assert await q.get_status("job") is None
        with pytest.raises(FlowError, match="'kid' depends on job 'ghost'"):
            await q.enqueue("root", None, children=[Child("kid", options={"depends_on": ["ghost"]})])
        assert await q.get_status("root") is None and await q.get_status("kid") is None
        cases = [
            ({"depends_on": "known"}, "depends_on must be a list"),
            ({"depends_on": []}, "depends_on of job 'job' is empty"),
            ({"depends_on": ["job"]}, "'job' cannot depend on itself"),
            ({"depends_on": [3]}, "a dependency must be a job id"),
            ({"depends_on": ["known"], "debounce": 1.0}, "debounce cannot be combined"),
            ({"children": [Child("c")], "depends_on": ["c"]}, "of its own tree"),
        ]
        for options, message in cases:
            with pytest.raises((FlowError, ValueError), match=message):
                await q.enqueue("job", None, **options)  # type: ignore[arg-type]
            assert await q.get_status("job") is None and await q.get_status("c") is None, options
        status = await q.get_status("known")
        assert status is not None and status.state is JobState.QUEUED


async def test_many_dependents_of_one_job_and_a_diamond(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    gate = trio.Event()

    async def top(job: Job[Any]) -> str:
        await gate.wait()
        return "top"

    handlers = Handlers(top=top, left=reader(seen, "left"), right=reader(seen, "right"), bottom=reader(seen, "bottom"))
    for i in range(5):
        handlers.behaviour[f"fan{i}"] = reader(seen, f"fan{i}")
    async with Queue(storage, name=queue_name, handler=handlers, concurrency=4, keep_completed=0, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("top", None)
            for i in range(5):
                await q.enqueue(f"fan{i}", None, depends_on=["top"])
            await q.enqueue("left", None, depends_on=["top"])
            await q.enqueue("right", None, depends_on=["top"])
            await q.enqueue("bottom", None, depends_on=["left", "right"])
            gate.set()
            await events.wait_for("completed", "bottom")
            for i in range(5):
                await events.wait_for("completed", f"fan{i}")
        for key in [f"fan{i}" for i in range(5)] + ["left", "right"]:
            assert seen[key] == ({"top": "top"}, {}), key
        assert seen["bottom"] == ({"left": "ran left", "right": "ran right"}, {})
        assert handlers.ran.count("top") == 1 and handlers.ran.count("bottom") == 1
        assert handlers.ran.index("bottom") > max(handlers.ran.index("left"), handlers.ran.index("right"))


async def test_a_failed_dependency_under_cancel_fails_the_dependent(storage: Storage, queue_name: str) -> None:
    handlers = Handlers(bad=fail)
    async with Queue(storage, name=queue_name, handler=handlers, max_attempts=1, **FAST) as q:
        events = Recorder()
        q.on("failed", events)
        q.on("cancelled", events)
        with trio.fail_after(10):
            await q.enqueue("bad", None, delay=3600)  # not run yet: the dependent waits for it
            await q.enqueue("good", None)
            await q.enqueue("dependent", None, depends_on=["good", "bad"], children=[Child("kid", options={"delay": 3600})])
            assert (await q.cancel("bad")).status is CancelStatus.CANCELLED
            await events.wait_for("failed", "dependent")
            await events.wait_for("cancelled", "kid")  # (files: the cascade is a step of its own)
            with pytest.raises(JobFailedError) as caught:
                await q.enqueue_and_wait("dependent", None)
        assert caught.value.error.type == "ChildJobFailedError"
        assert "bad" in caught.value.error.message
        assert "dependent" not in handlers.ran
        kid = await q.get_status("kid")
        assert kid is not None and kid.state is JobState.CANCELLED  # its own children are cancelled
        good = await q.get_status("good")
        assert good is not None and good.state is not JobState.CANCELLED  # its dependencies are not
        # a dependency that failed already fails a new dependent at once (on_child_failure="cancel")
        with trio.fail_after(10):
            with pytest.raises(JobFailedError) as again:
                await q.enqueue_and_wait("late", None, depends_on=["bad"])
        assert again.value.error.type == "ChildJobFailedError"
    assert issubclass(ChildJobFailedError, Exception)


@pytest.mark.parametrize("policy", ["continue", "ignore"])
async def test_continue_and_ignore_run_the_dependent_which_reads_the_failures(
    storage: Storage, queue_name: str, policy: str
) -> None:
    seen: dict[str, Any] = {}
    handlers = Handlers(bad=fail, dependent=reader(seen, "dependent"))
    async with Queue(storage, name=queue_name, handler=handlers, max_attempts=1, **FAST) as q:
        with trio.fail_after(10):
            await q.enqueue("bad", None)
            await q.enqueue("good", None)
            out = await q.enqueue_and_wait("dependent", None, depends_on=["bad", "good"], on_child_failure=policy)  # type: ignore[arg-type]
        assert out == "ran dependent"
        results, failures = seen["dependent"]
        assert results == {"good": "done good"}
        assert failures["bad"].message == "bad broke"


async def test_a_dependency_on_another_queue(storage: Storage, queue_name: str, backend: str) -> None:
    seen: dict[str, Any] = {}
    gate = trio.Event()

    async def before(job: Job[Any]) -> str:
        await gate.wait()
        return "done before"

    mine, theirs = tagged(queue_name, "mine", "theirs")
    here = Handlers(after=reader(seen, "after"), after2=reader(seen, "after2"))
    async with (
        Queue(storage, name=mine, handler=here, **FAST) as q,
        Queue(storage, name=theirs, handler=Handlers(before=before, same=reader(seen, "same")), **FAST) as other,
    ):
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await other.enqueue("before", None)
            await q.enqueue("after", None, depends_on=[JobRef(theirs, "before")])
            await q.enqueue("after2", None, depends_on=[JobRef(theirs, "before")])
            await other.enqueue("same", None, depends_on=["before"])  # (a plain id: its own queue's job)
            gate.set()
            out = await other.enqueue_and_wait("same", None)
            await events.wait_for("completed", "after")
            await events.wait_for("completed", "after2")
        assert out == "ran same"
        assert seen["after"] == seen["after2"] == seen["same"] == ({"before": "done before"}, {})
        assert list(await q.children("after")) == [JobRef(theirs, "before")]
        if backend == "redis-cluster":  # queues without a common hash tag: refused, nothing written
            plain = f"{queue_name}-plain"
            async with Queue(storage, name=plain) as elsewhere:
                await elsewhere.enqueue("x", None)
            with pytest.raises(FlowError, match="slots.*hash tag"):
                await q.enqueue("cross", None, depends_on=[JobRef(plain, "x")])
            assert await q.get_status("cross") is None


async def test_retention_keeps_a_dependency_until_its_dependents_ran(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    gate, start = trio.Event(), trio.Event()

    async def slow(job: Job[Any]) -> str:
        await gate.wait()
        return "slow"

    async def quick(job: Job[Any]) -> str:
        await start.wait()  # (ends once its dependents are enqueued: else it may be gone already)
        return "done quick"

    handlers = Handlers(slow=slow, quick=quick, dependent=reader(seen, "dependent"), other=reader(seen, "other"))
    async with Queue(storage, name=queue_name, handler=handlers, concurrency=3, keep_completed=0, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("quick", None, result_ttl=0.05)
            await q.enqueue("slow", None)
            await q.enqueue("dependent", None, depends_on=["quick", "slow"])
            await q.enqueue("other", None, depends_on=["quick"])
            start.set()
            await events.wait_for("completed", "other")
            await events.wait_for("completed", "quick")
            for i in range(3):  # more completions: keep_completed=0 counts out the others
                await q.enqueue_and_wait(f"filler{i}", None)
            await trio.sleep(0.3)  # past quick's own TTL: a timer is what is tested
            quick = await q.get_status("quick")
            assert quick is not None and quick.state is JobState.COMPLETED
            gate.set()
            await events.wait_for("completed", "dependent")
        assert seen["dependent"] == ({"quick": "done quick", "slow": "slow"}, {})
        assert seen["other"] == ({"quick": "done quick"}, {})


async def test_children_and_depends_on_combined(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    handlers = Handlers(parent2=reader(seen, "parent2"))
    async with Queue(storage, name=queue_name, handler=handlers, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("dep", None, delay=3600)
            await q.enqueue("parent", None, depends_on=["dep"], children=[Child("kid")])
            await events.wait_for("completed", "kid")
            status = await q.get_status("parent")
            assert status is not None and status.state is JobState.WAITING_CHILDREN
            assert (await q.cancel("dep")).status is CancelStatus.CANCELLED  # a failure, as for a child
            with pytest.raises(JobFailedError):
                await q.enqueue_and_wait("parent", None)
            await q.enqueue("dep2", None)
            kids = [Child("kid2"), Child("kid3", options={"depends_on": ["dep2"]})]  # (a child may have dependencies)
            out = await q.enqueue_and_wait("parent2", None, depends_on=["dep2"], children=kids, on_child_failure="continue")
        assert out == "ran parent2"
        assert seen["parent2"] == ({"kid2": "done kid2", "kid3": "done kid3", "dep2": "done dep2"}, {})
        assert list(await q.children("parent2")) == [JobRef(queue_name, k) for k in ("kid2", "kid3", "dep2")]
        assert handlers.ran.index("dep2") < handlers.ran.index("kid3")


async def test_cancelling_a_dependent_leaves_its_dependencies(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, **FAST) as q:
        await q.enqueue("dep", None)
        await q.enqueue("dependent", None, depends_on=["dep"])
        assert (await q.cancel("dependent")).status is CancelStatus.CANCELLED
        dep = await q.get_status("dep")
        assert dep is not None and dep.state is JobState.QUEUED


async def test_enqueue_many_and_a_removed_dependency(storage: Storage, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    handlers = Handlers(d1=reader(seen, "d1"), d2=reader(seen, "d2"))
    async with Queue(storage, name=queue_name, **FAST) as producer:
        await producer.enqueue("gone", None, delay=3600)
        results = await producer.enqueue_many([("d1", None), ("d2", None)], depends_on=["gone"], on_child_failure="continue")
        assert [r.status.value for r in results] == ["queued", "queued"]
        assert await producer.remove("gone")  # counts as cancelled for its dependents
        worker = Queue(storage, name=queue_name, handler=handlers, **FAST)
        events = Recorder()
        worker.on("completed", events)
        async with worker:
            with trio.fail_after(10):
                await events.wait_for("completed", "d1")
                await events.wait_for("completed", "d2")
    assert seen["d1"] == ({}, {}) and seen["d2"] == ({}, {})  # (its record is gone: nothing to read)


async def test_children_added_by_a_running_job_cannot_have_dependencies(storage: Storage, queue_name: str) -> None:
    async def add(job: Job[Any]) -> str:
        with pytest.raises(FlowError, match="cannot have depends_on"):
            await job.add_children([Child("kid", options={"depends_on": ["other"]})])
        return "checked"

    async with Queue(storage, name=queue_name, handler=Handlers(adder=add), **FAST) as q:
        await q.enqueue("other", None, delay=3600)
        with trio.fail_after(10):
            assert await q.enqueue_and_wait("adder", None) == "checked"
        assert await q.get_status("kid") is None


async def test_a_dependency_whose_dependents_are_gone_goes_by_its_own_ttl(storage: Storage, queue_name: str) -> None:
    gate = trio.Event()

    async def dep(job: Job[Any]) -> str:
        await gate.wait()
        return "dep"

    async with Queue(storage, name=queue_name, handler=Handlers(dep1=dep, dep2=dep), concurrency=2, **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("dep1", None, result_ttl=0.05)
            await q.enqueue("dep2", None, result_ttl=0.05)
            await q.enqueue("removed", None, depends_on=["dep1"])
            await q.enqueue("cancelled", None, depends_on=["dep2"])
            assert await q.remove("removed")
            assert (await q.cancel("cancelled")).status is CancelStatus.CANCELLED
            gate.set()
            await events.wait_for("completed", "dep1")
            await events.wait_for("completed", "dep2")
            await trio.sleep(0.3)  # past their own TTL: a timer is what is tested
            await q.enqueue("sweep", None)  # (a step that forgets what is due)
        assert await q.get_status("dep1") is None and await q.get_status("dep2") is None


async def test_a_removed_dependent_lets_its_ended_dependencies_go_by_their_ttl(storage: Storage, queue_name: str) -> None:
    gate = trio.Event()

    async def ended(job: Job[Any]) -> str:
        await gate.wait()  # (named while it runs: ended with a TTL this short, it could be gone)
        return "ended"

    async with Queue(storage, name=queue_name, handler=Handlers(ended=ended), **FAST) as q:
        events = Recorder()
        q.on("completed", events)
        with trio.fail_after(10):
            await q.enqueue("ended", None, result_ttl=0.05)
            await q.enqueue("pending", None, delay=3600)
            await q.enqueue("dependent", None, depends_on=["ended", "pending"])  # (waits for "pending")
            gate.set()
            await events.wait_for("completed", "ended")  # kept for the dependent, whatever its TTL
            assert await q.remove("dependent")
        await only_the_pending_one_is_left(q)


async def test_an_id_enqueued_again_after_its_dependency_was_cancelled_is_retained_as_any_job(
    storage: Storage, queue_name: str
) -> None:
    """A cancelled dependency's id enqueued again is a job of its own, depended on by
    nobody: count-based retention counts it out like any other finished job."""
    if hasattr(storage, "keep_every"):
        storage.keep_every = 1  # FileStorage trims in batches: at every settled job here
    async with Queue(storage, name=queue_name, handler=Handlers(), keep_completed=1, **FAST) as q:
        with trio.fail_after(10):
            await q.enqueue("dep", None, delay=3600)
            await q.enqueue("dependent", None, depends_on=["dep"])
            assert (await q.cancel("dep")).status is CancelStatus.CANCELLED
            assert (await q.get_status("dependent")).state is JobState.FAILED  # type: ignore[union-attr]
            assert await q.enqueue_and_wait("dep", None) == "done dep"  # the id again: a new job
            assert await q.enqueue_and_wait("later", None) == "done later"
    async with Queue(storage, name=queue_name) as q:
        assert await q.get_status("dep") is None  # counted out: "later" is the one kept
        assert (await q.get_status("later")).state is JobState.COMPLETED  # type: ignore[union-attr]
