"""Crash safety of trees of jobs (and of dependencies): worker processes SIGKILLed while trees run (FileStorage
and RedisStorage: memory cannot span processes). No job of a tree is lost,
and no parent begins before every child of it began (and ended: a parent is queued only
once its children are terminal). The workers are tests/helpers/queue_worker.py."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from support import Recorder
from test_processes import Fleet, fleet, shared_storage, spec_of  # noqa: F401 - fixtures
from trioqueue import Child, JobRef, JobState, Queue, Storage
from trioqueue.storage.file import FileStorage

TREES, CHILDREN = 30, 5


@pytest.fixture
async def file_storage(tmp_path: Path) -> AsyncIterator[FileStorage]:
    async with FileStorage(tmp_path / "store") as st:
        yield st


def _starts(log: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        if line:
            job_id, _, _, at = line.split(" ")
            out.setdefault(job_id, []).append(float(at))
    return out


async def test_workers_killed_while_trees_run_lose_no_job_and_run_no_parent_early(
    shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str
) -> None:
    rng = random.Random(uuid.uuid4().int)
    log = tmp_path / "executions.log"
    file_storage = shared_storage
    # children on a second queue (a tree across queues: notes reach the other queue's parent)
    other = f"{queue_name}-kids"

    def spec(name: str, queue: str) -> dict[str, Any]:
        return spec_of(file_storage, queue=queue, worker_id=name, log=str(log), visibility_timeout=1.0)

    completed = Recorder()
    with trio.fail_after(60):
        await fleet.start("worker", spec("victim", queue_name), "READY")
        await fleet.start("worker", spec("victim-kids", other), "READY")
        await fleet.start("worker", spec("other", queue_name), "READY")
        async with Queue(file_storage, name=queue_name) as producer:
            producer.on("completed", completed)
            for t in range(TREES):  # each tree: children on both queues, one grandchild
                kids = [
                    Child(f"t{t}-c{c}", {"seconds": rng.uniform(0, 0.05)}, queue=other if c % 2 else None)
                    for c in range(CHILDREN - 1)
                ]
                kids.append(Child(f"t{t}-mid", {"seconds": 0.01}, children=[Child(f"t{t}-leaf", {"seconds": 0.02})]))
                await producer.enqueue(f"t{t}", {"seconds": 0.0}, children=kids)
            await trio.sleep(rng.uniform(0.05, 0.4))  # trees in flight: claims, settles, notes
            fleet.kill("victim")
            fleet.kill("victim-kids")
            await fleet.start("worker", spec("replacement", queue_name), "READY")
            await fleet.start("worker", spec("replacement-kids", other), "READY")
            await completed.wait_until(lambda evs: {f"t{t}" for t in range(TREES)} <= {e.job_id for e in evs})
            async with Queue(file_storage, name=other) as kids_queue:
                for t in range(TREES):
                    status = await producer.get_status(f"t{t}")
                    assert status is not None and status.state is JobState.COMPLETED, status
                    assert status.children is not None and status.children[JobState.COMPLETED] == CHILDREN
                    for c in range(CHILDREN - 1):
                        q = kids_queue if c % 2 else producer
                        child = await q.get_status(f"t{t}-c{c}")
                        assert child is not None and child.state is JobState.COMPLETED, child
    starts = _starts(log)
    for t in range(TREES):
        parent = min(starts[f"t{t}"])
        tree = [f"t{t}-c{c}" for c in range(CHILDREN - 1)] + [f"t{t}-mid", f"t{t}-leaf"]
        assert all(max(starts[j]) < parent for j in tree), (t, {j: starts[j] for j in tree}, parent)
        assert max(starts[f"t{t}-leaf"]) < min(starts[f"t{t}-mid"])


async def test_workers_killed_while_dependencies_run_lose_no_job_and_run_no_dependent_early(
    shared_storage: Storage, fleet: Fleet, tmp_path: Path, queue_name: str
) -> None:
    """Dependencies (``depends_on``) across two queues, fan-out and diamonds, while workers
    are killed: every dependent runs once its dependencies ended, none runs before."""
    rng = random.Random(uuid.uuid4().int)
    log = tmp_path / "executions.log"
    other = f"{queue_name}-sources"
    n = 20

    def spec(name: str, queue: str) -> dict[str, Any]:
        return spec_of(shared_storage, queue=queue, worker_id=name, log=str(log), visibility_timeout=1.0)

    def where(i: int) -> str:
        return other if i % 2 else queue_name

    deps: dict[str, list[str]] = {}
    completed = Recorder()
    with trio.fail_after(60):
        await fleet.start("worker", spec("victim", queue_name), "READY")
        await fleet.start("worker", spec("victim-sources", other), "READY")
        await fleet.start("worker", spec("other", queue_name), "READY")
        async with Queue(shared_storage, name=queue_name) as producer, Queue(shared_storage, name=other) as sources:
            producer.on("completed", completed)
            for i in range(n):
                await (sources if i % 2 else producer).enqueue(f"s{i}", {"seconds": rng.uniform(0, 0.05)})
            for i in range(n):  # fan-out: every source has two dependents
                pair = [i, (i + 1) % n]
                deps[f"d{i}"] = [f"s{j}" for j in pair]
                await producer.enqueue(f"d{i}", {"seconds": 0.01}, depends_on=[JobRef(where(j), f"s{j}") for j in pair])
            for i in range(n):  # diamonds: d{i} and d{i+1} share s{i+1}
                deps[f"t{i}"] = [f"d{i}", f"d{(i + 1) % n}"]
                await producer.enqueue(f"t{i}", {"seconds": 0.0}, depends_on=deps[f"t{i}"])
            await trio.sleep(rng.uniform(0.05, 0.4))  # in flight: claims, settles, notes
            fleet.kill("victim")
            fleet.kill("victim-sources")
            await fleet.start("worker", spec("replacement", queue_name), "READY")
            await fleet.start("worker", spec("replacement-sources", other), "READY")
            await completed.wait_until(lambda evs: {f"t{i}" for i in range(n)} <= {e.job_id for e in evs})
            for i in range(n):
                for job_id in (f"d{i}", f"t{i}"):
                    status = await producer.get_status(job_id)
                    assert status is not None and status.state is JobState.COMPLETED, status
    starts = _starts(log)
    for dependent, names in deps.items():
        assert all(max(starts[d]) < min(starts[dependent]) for d in names), (dependent, {d: starts[d] for d in names})


async def test_a_tree_whose_write_was_cut_short_can_be_enqueued_again(file_storage: FileStorage, queue_name: str) -> None:
    """Children are written before their parents: a crash before the root leaves children
    naming a parent that does not exist. The producer's retry replaces them (here the root
    is forgotten by hand, which leaves the same records behind)."""
    tree = [Child("a", 1), Child("b", 2, children=[Child("b1", 3)])]
    async with Queue(file_storage, name=queue_name) as q:
        await q.enqueue("root", None, children=tree)
        assert await q.remove("root")
        assert (await q.get_status("b1")) is not None  # the leftovers
        assert (await q.enqueue("root", None, children=tree)).status.value == "queued"
        status = await q.get_status("root")
        assert status is not None and status.children == {**dict.fromkeys(JobState, 0), JobState.QUEUED: 1, JobState.WAITING_CHILDREN: 1}
        from trioqueue import FlowError

        with pytest.raises(FlowError, match="'a' already exists"):  # not a leftover: refused
            await q.enqueue("other-root", None, children=[Child("a")])


async def test_redis_a_crash_between_a_childs_settle_and_its_tree_leaves_notes_the_reaper_acts_on(redis_url: str) -> None:
    """On RedisStorage a child's end is noted by the settle script and acted on by
    tree_act right after; a worker killed in between leaves the note, and the reaper of the
    child's queue carries it to a parent on another queue."""
    from redis_helpers import _done, _job, _prefix

    from trioqueue.storage._base import FlowJob
    from trioqueue.storage.redis import RedisStorage

    async with RedisStorage(redis_url, prefix=_prefix()) as st:
        await st.enqueue_flow([FlowJob("reports", _job("p")), FlowJob("kids", _job("c"), ("reports", "p"))])
        [claim] = await st.dequeue("kids", "w", 1, 0, 30)
        acted: list[str] = []

        async def killed(queue: str) -> None:  # the worker dies before tree_act
            acted.append(queue)

        st._trees.act = killed  # type: ignore[method-assign]
        assert await st.settle("kids", "w", [_done(claim, b"r")]) == [True]
        assert acted == ["kids"]
        del st._trees.act  # the storage's own again
        parent = await st.get_job("reports", "p")
        assert parent is not None and parent.state.startswith("waiting_children:")
        await st.recover_stalled("kids")
        parent = await st.get_job("reports", "p")
        assert parent is not None and parent.state.startswith("queued:")
        assert [c.id for c in await st.dequeue("reports", "w", 1, 0, 30)] == ["p"]
        assert [(q, r.id, r.result) for q, r in await st.get_children("reports", "p")] == [("kids", "c", b"r")]


async def test_a_childs_note_taken_by_another_process_before_its_record_is_written_is_not_lost(
    file_storage: FileStorage,
) -> None:
    """A child's settle leaves its note before it writes its record. With the parent on
    another queue, that note must not be visible there before the record is: another
    process acting on the parent's queue in between (here a reaper pass, in a thread with
    its own FileStorage: another flock holder) would read the child still processing, take
    the note, and the parent would wait forever (a tree that never completes)."""
    import threading

    from redis_helpers import _done, _job

    from trioqueue.storage._base import FlowJob

    st = file_storage
    await st.enqueue_flow([FlowJob("reports", _job("p")), FlowJob("kids", _job("c"), ("reports", "p"))])
    [claim] = await st.dequeue("kids", "w", 1, 0, 30)
    errors: list[BaseException] = []
    ready, go, done = threading.Event(), threading.Event(), threading.Event()

    async def reaper_pass() -> None:
        async with FileStorage(st.directory) as other:
            for name in ("kids", "reports"):
                other._core.q(name)  # opened (start-up repair) before the settle holds a lock
            ready.set()
            await trio.to_thread.run_sync(go.wait)
            await other.recover_stalled("reports")

    def meanwhile() -> None:
        try:
            trio.run(reaper_pass)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            ready.set()
            done.set()

    thread = threading.Thread(target=meanwhile)
    thread.start()
    await trio.to_thread.run_sync(ready.wait, 30)
    commit = st._core.commit
    seen: list[str] = []

    def commit_then_someone_acts(q, items, fds):  # type: ignore[no-untyped-def]
        if q.name == "kids" and not seen:  # the settle: its note is made, its record not yet
            seen.append(q.name)
            go.set()
            done.wait(30)
        return commit(q, items, fds)

    st._core.commit = commit_then_someone_acts  # type: ignore[method-assign]
    try:
        assert await st.settle("kids", "w", [_done(claim, b"r")]) == [True]
    finally:
        del st._core.commit
        go.set()
        thread.join(30)
    assert seen and not errors, errors
    parent = await st.get_job("reports", "p")
    assert parent is not None and parent.state.startswith("queued"), parent.state
    assert [c.id for c in await st.dequeue("reports", "w", 1, 0, 30)] == ["p"]


async def test_a_crash_after_a_childs_settle_leaves_a_note_the_reaper_of_its_queue_carries(
    file_storage: FileStorage,
) -> None:
    """The worker dies between a child's settle and acting on its note: the ``u-`` note in
    the child's queue is left, and that queue's reaper carries it to the parent's queue."""
    from redis_helpers import _done, _job

    from trioqueue.storage._base import FlowJob

    st = file_storage
    await st.enqueue_flow([FlowJob("reports", _job("p")), FlowJob("kids", _job("c"), ("reports", "p"))])
    [claim] = await st.dequeue("kids", "w", 1, 0, 30)

    async def killed(queue: str | None = None) -> None:  # the worker dies before acting
        st._trees.dirty.clear()

    st._trees.act_on_notes = killed  # type: ignore[method-assign]
    assert await st.settle("kids", "w", [_done(claim, b"r")]) == [True]
    del st._trees.act_on_notes
    parent = await st.get_job("reports", "p")
    assert parent is not None and parent.state.startswith("waiting_children"), parent.state
    await st.recover_stalled("reports")  # the parent's queue's reaper: nothing there yet
    await st.recover_stalled("kids")
    parent = await st.get_job("reports", "p")
    assert parent is not None and parent.state.startswith("queued"), parent.state
