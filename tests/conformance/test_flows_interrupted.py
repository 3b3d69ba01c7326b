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
from trioqueue.storage import SettleKind, Trees
from trioqueue.storage._base import FlowJob

pytestmark = pytest.mark.capability("Trees")

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


@pytest.mark.parametrize("settle_as", [SettleKind.RETRY, SettleKind.RATE_LIMITED, SettleKind.SLEEP])
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


def _tree(q: str) -> list[FlowJob]:
    """root (cancel) -> mid -> leaf, and root -> sib (one attempt)."""
    return [
        FlowJob(q, job("root")),
        FlowJob(q, job("mid"), (q, "root")),
        FlowJob(q, job("leaf"), (q, "mid")),
        FlowJob(q, job("sib", max_attempts=1), (q, "root")),
    ]


async def _mid_outcome(storage: Storage, q: str, settle_in_order: Any) -> list[tuple[str, str]]:
    """Run ``settle_in_order`` (leaf and sib claimed by W1); the tree's events until mid's
    and root's ends, ``[(kind, job id)]`` in order."""
    await storage.enqueue_flow(_tree(q))
    assert sorted(c.id for c in await claim(storage, q)) == ["leaf", "sib"]
    seen: list[tuple[str, str]] = []
    async with storage.subscribe(q) as events:
        await settle_in_order()
        with trio.fail_after(10):
            async for batch in events:
                seen += [(e.kind, e.job_id) for e in batch if e.kind in ("promoted", "cancelled", "failed")]
                if ("cancelled", "mid") in seen and ("failed", "root") in seen:
                    break
    return seen


@pytest.mark.parametrize("first", ["sib-fails", "leaf-completes"])
async def test_a_parent_whose_last_child_ends_as_a_sibling_fails_the_root_is_cancelled_not_run(
    storage: Storage, queue_name: str, first: str
) -> None:
    """root (cancel) has mid (waiting for leaf) and sib. sib fails (the root fails and
    cancels its tree) and leaf completes (mid's last child: it would release mid), one
    right after the other, either way round: mid ends cancelled, and is never released
    after the root failed (never claimable then)."""
    q = queue_name

    async def sib_fails() -> None:
        assert await storage.settle(q, W1, [settlement(SettleKind.FAIL, q, "sib", _ERR, ttl=60)]) == [True]

    async def leaf_completes() -> None:
        assert await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "leaf", b'"leaf"', ttl=60)]) == [True]

    async def settle_in_order() -> None:
        for step in (sib_fails, leaf_completes) if first == "sib-fails" else (leaf_completes, sib_fails):
            await step()

    seen = await _mid_outcome(storage, q, settle_in_order)
    assert ("failed", "root") in seen
    promoted_after_root_failed = ("promoted", "mid") in seen[seen.index(("failed", "root")) :]
    assert not promoted_after_root_failed, seen
    mid = await storage.get_job(q, "mid")
    assert mid is not None and kind(mid.state) == "cancelled", mid
    assert await claim(storage, q) == []


async def test_file_a_parent_released_in_the_pass_that_fails_its_root_is_cancelled_instead(
    tmp_path: Any, queue_name: str
) -> None:
    """FileStorage: the process that settled sib (failed) died before it acted on its
    tree's notes (kill -9); the next step that acts on them (leaf's settle) fails the
    root and, in the same pass, finds mid's last child ended: mid must not be released
    (claimable, in that pass and the next, before the root's cascade reaches it)."""
    from trioqueue.storage import FileStorage

    q = queue_name
    async with FileStorage(tmp_path / "store") as st:

        async def killed_after_settle(queue: str | None = None) -> None:
            await trio.lowlevel.checkpoint()  # (the notes stay, as a crash leaves them)

        async def settle_in_order() -> None:
            st._trees.act_on_notes = killed_after_settle  # type: ignore[method-assign]
            try:
                assert await st.settle(q, W1, [settlement(SettleKind.FAIL, q, "sib", _ERR, ttl=60)]) == [True]
            finally:
                del st._trees.act_on_notes
            assert await st.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "leaf", b'"leaf"', ttl=60)]) == [True]

        seen = await _mid_outcome(st, q, settle_in_order)
        assert ("failed", "root") in seen and ("promoted", "mid") not in seen, seen
        mid = await st.get_job(q, "mid")
        assert mid is not None and kind(mid.state) == "cancelled", mid


async def test_file_a_queued_job_whose_ancestor_failed_is_not_claimed_while_the_cascade_is_on_its_way(
    tmp_path: Any, queue_name: str
) -> None:
    """FileStorage cascades a failure level by level, a step each (c- notes). The process
    carrying it died after the step that failed the root (kill -9): leaf, queued under
    mid, is not cancelled yet. A claim meanwhile (another worker) must not hand it out:
    it is cancelled then, as the cascade would, and never runs (the chaos run of
    scripts/chaos_trees.py found such leaves claimed, and dynamic children added after
    the root failed claimed too)."""
    from trioqueue.storage import FileStorage

    q, kids = queue_name, f"{queue_name}-kids"  # (leaf on a queue of its own: claimed apart)
    async with FileStorage(tmp_path / "store") as st:
        await st.enqueue_flow(
            [
                FlowJob(q, job("root")),
                FlowJob(q, job("mid"), (q, "root")),
                FlowJob(kids, job("leaf"), (q, "mid")),
                FlowJob(q, job("sib", max_attempts=1), (q, "root")),
            ]
        )
        [sib] = await claim(st, q, n=1)
        assert sib.id == "sib"
        act_on_notes = st._trees.act_on_notes

        async def one_step_then_killed(queue: str | None = None) -> None:
            await st._trees.act_on_queue(q)  # the root fails; its cascade's notes stay
            st._trees.dirty.clear()

        st._trees.act_on_notes = one_step_then_killed  # type: ignore[method-assign]
        try:
            assert await st.settle(q, W1, [settlement(SettleKind.FAIL, q, "sib", _ERR, ttl=60)]) == [True]
        finally:
            del st._trees.act_on_notes
        root = await st.get_job(q, "root")
        assert root is not None and kind(root.state) == "failed", root
        leaf = await st.get_job(kids, "leaf")
        assert leaf is not None and kind(leaf.state) == "queued", leaf  # (the cascade is on its way)
        assert await claim(st, kids, W2) == []
        leaf = await st.get_job(kids, "leaf")
        assert leaf is not None and kind(leaf.state) == "cancelled", leaf
        await act_on_notes(q)  # the cascade's next steps (a reaper pass): nothing changes
        await act_on_notes(kids)
        mid = await st.get_job(q, "mid")
        assert mid is not None and kind(mid.state) == "cancelled", mid
        leaf = await st.get_job(kids, "leaf")
        assert leaf is not None and kind(leaf.state) == "cancelled", leaf


def _kids(kids: str, parent: tuple[str, str]) -> list[FlowJob]:
    """Dynamic children of ``parent``: one with a child of its own, one leaf."""
    return [
        FlowJob(kids, job("kid-1"), parent),
        FlowJob(kids, job("kid-2"), parent),
        FlowJob(kids, job("grandkid"), (kids, "kid-1")),
    ]


@pytest.mark.parametrize("how", ["cancel-of-the-parent", "a-sibling-failed-the-root"])
async def test_a_parent_with_a_cancel_request_adds_no_children(storage: Storage, queue_name: str, how: str) -> None:
    """A running dynamic parent gets a cancel request (``cancel`` of it while it runs, or
    its root failed under ``cancel`` by a sibling: the cascade reached it) and its handler,
    still holding the claim, calls ``add_children``: refused as a lost claim (``False``),
    nothing written, so no child can be claimed (the chaos run of scripts/chaos_trees.py
    found such children claimed, run and completed after their root's cancel)."""
    q, kids = queue_name, f"{queue_name}-kids"  # (the children on a queue of their own)
    if how == "cancel-of-the-parent":
        await storage.enqueue(q, [job("p")])
        [run] = await claim(storage, q)
        assert await storage.cancel(q, "p") == "cancelled"
    else:
        await storage.enqueue_flow(
            [FlowJob(q, job("root")), FlowJob(q, job("p"), (q, "root")), FlowJob(q, job("sib", max_attempts=1), (q, "root"))]
        )
        claims = {c.id: c for c in await claim(storage, q)}
        assert sorted(claims) == ["p", "sib"]
        run = claims["p"]
        assert await storage.settle(q, W1, [settlement(SettleKind.FAIL, q, "sib", _ERR, ttl=60)]) == [True]
        root = await storage.get_job(q, "root")
        assert root is not None and kind(root.state) == "failed", root
    reply = await storage.heartbeat(q, W1, 30.0, [("p", run.token)], 30.0)
    assert reply.cancel_requested == ["p"] and not reply.lost, reply  # (the claim is still held)
    assert await storage.add_children(q, W1, "p", run.token, _kids(kids, (q, "p")), "cancel") is False
    assert await claim(storage, kids, W2) == []
    for kid in ("kid-1", "kid-2", "grandkid"):
        assert await storage.get_job(kids, kid) is None, kid
    assert await _children_of(storage, q, "p") == []
    # The run ends as a cancel request makes it end: cancelled.
    assert await storage.settle(q, W1, [settlement(SettleKind.CANCEL, q, "p", b"", ttl=60)]) == [True]
    p = await storage.get_job(q, "p")
    assert p is not None and kind(p.state) == "cancelled", p


async def _children_of(storage: Storage, q: str, job_id: str) -> list[str]:
    assert isinstance(storage, Trees)
    return [r.id for _, r in await storage.get_children(q, job_id)]


async def test_a_handler_whose_job_is_being_cancelled_cannot_add_children(storage: Storage, queue_name: str) -> None:
    """Through a Queue: the handler of a running job notices its cancel request (shielded,
    so it goes on), then calls ``job.add_children``: it raises a ``TrioQueueError`` naming
    the job, no child is written (none runs), and the job ends cancelled."""
    from trioqueue import TrioQueueError

    running = trio.Event()
    cancel_seen = trio.Event()
    refused: list[BaseException] = []
    ran: list[str] = []

    async def handler(job: Job[Any]) -> Any:
        ran.append(job.id)
        if job.id != "p":
            return "kid ran"
        with trio.CancelScope(shield=True):
            running.set()
            await cancel_seen.wait()
            try:
                await job.add_children([Child("kid-1"), Child("kid-2", children=[Child("grandkid")])])
            except TrioQueueError as exc:
                refused.append(exc)
        await trio.sleep_forever()

    async with Queue(storage, name=queue_name, handler=handler, concurrency=3, retry_delay=0, block_timeout=0.5) as q:
        events = Recorder()
        q.on("cancel_requested", events)
        q.on("cancelled", events)
        with trio.fail_after(10):
            await q.enqueue("p", None)
            await running.wait()
            await q.cancel("p")
            await events.wait_for("cancel_requested", "p")
            cancel_seen.set()
            await events.wait_for("cancelled", "p")
        assert len(refused) == 1, refused
        assert "'p'" in str(refused[0]) and "cancel" in str(refused[0]), refused
        for kid in ("kid-1", "kid-2", "grandkid"):
            assert await q.get_status(kid) is None, kid
        assert ran == ["p"]
        status = await q.get_status("p")
        assert status is not None and status.state is JobState.CANCELLED


async def test_file_a_parent_whose_ancestor_was_cancelled_adds_no_children_while_the_cascade_is_on_its_way(
    tmp_path: Any, queue_name: str
) -> None:
    """FileStorage: the process that cancelled the root died before it acted on the
    notes that cascade the cancel (kill -9): p, a running child of the root, has no cancel
    request yet. Its handler's ``add_children`` is refused all the same (its root was
    cancelled): nothing written, nothing to claim."""
    from trioqueue.storage import FileStorage

    q, kids = queue_name, f"{queue_name}-kids"
    async with FileStorage(tmp_path / "store") as st:
        await st.enqueue_flow([FlowJob(q, job("root")), FlowJob(q, job("p"), (q, "root")), FlowJob(q, job("other"), (q, "root"))])
        [run] = await claim(st, q, n=1)
        assert run.id == "p"

        async def killed_after_cancel(queue: str | None = None) -> None:
            await trio.lowlevel.checkpoint()  # (the notes stay, as a crash leaves them)

        act_on_notes = st._trees.act_on_notes
        st._trees.act_on_notes = killed_after_cancel  # type: ignore[method-assign]
        try:
            assert await st.cancel(q, "root") == "cancelled"
        finally:
            st._trees.act_on_notes = act_on_notes  # type: ignore[method-assign]
        reply = await st.heartbeat(q, W1, 30.0, [("p", run.token)], 30.0)
        assert reply.cancel_requested == [] and not reply.lost, reply  # (the cascade is on its way)
        assert await st.add_children(q, W1, "p", run.token, _kids(kids, (q, "p")), "cancel") is False
        assert await claim(st, kids, W2) == []
        for kid in ("kid-1", "kid-2", "grandkid"):
            assert await st.get_job(kids, kid) is None, kid


@pytest.mark.parametrize("order", ["parent-first", "child-first"])
async def test_a_parent_failed_by_a_child_settled_with_its_wait_counts_once_on_its_own_parent(
    storage: Storage, queue_name: str, order: str
) -> None:
    """root (``continue``) has p and sib. p, a dynamic parent, adds c (``cancel``); one
    worker holds p and c and settles p's ``WaitForChildren`` and c's failure for good in
    one ``settle`` call (a batch of settlements): p ends failed by its child, counted
    once on the root. The root must wait for sib, still running: not released (queued,
    claimable) while a child is pending (the chaos run of scripts/chaos_trees.py on
    PostgreSQL found roots completed before a child ran, p's end counted twice on them)."""
    q = queue_name
    await storage.enqueue_flow(
        [
            FlowJob(q, job("root"), policy="continue"),
            FlowJob(q, job("p"), (q, "root")),
            FlowJob(q, job("sib"), (q, "root")),
        ]
    )
    runs = {c.id: c for c in await claim(storage, q)}
    assert sorted(runs) == ["p", "sib"]
    assert await storage.add_children(q, W1, "p", runs["p"].token, [FlowJob(q, job("c", max_attempts=1), (q, "p"))])
    [c] = await claim(storage, q)
    assert c.id == "c"
    wait = settlement(SettleKind.WAIT_CHILDREN, q, "p", b"")
    fail = settlement(SettleKind.FAIL, q, "c", _ERR, ttl=60)
    batch = [wait, fail] if order == "parent-first" else [fail, wait]
    assert await storage.settle(q, W1, batch) == [True, True]
    await _failed_by_children(storage, q, "p")
    root = await storage.get_job(q, "root")
    assert root is not None and root.state.startswith("waiting_children"), root  # sib is still running
    assert await claim(storage, q, W2) == []
    # sib ends: now the root is released, once.
    assert await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "sib", b'"sib"', ttl=60)]) == [True]
    [again] = await claim(storage, q, W2)
    assert again.id == "root"
