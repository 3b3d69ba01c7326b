"""Storage conformance, Queue level (issue 26, section 4): emptying a queue
(``Queue.clear``) and count-based retention (``keep_completed``/``keep_failed``,
``result_ttl=None``), on every backend."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import (
    Job,
    JobCancelledError,
    JobState,
    Queue,
    Storage,
    UnrecoverableError,
    ValidationError,
)

from queue_helpers import FAST
from support import Recorder


# -- 3. clear ----------------------------------------------------------------------------


async def test_clear_forgets_every_job_in_every_state_and_keeps_schedules(storage: Storage, queue_name: str) -> None:
    started = trio.Event()
    release = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "block":
            started.set()
            await release.wait()
            return "late"
        if job.payload == "fail":
            raise UnrecoverableError("no")
        return job.payload

    events = Recorder()
    waited: list[BaseException] = []
    async with Queue(storage, name=f"{queue_name}-other", **FAST) as other:
        await other.enqueue("kept", 1)  # another queue: not touched
        async with Queue(storage, name=queue_name, handler=handler, max_attempts=1, **FAST) as q:
            for name in ("cleared", "error", "completed", "failed"):
                q.on(name, events)
            await q.schedule("nightly", {"n": 1}, cron="0 3 * * *")
            await q.enqueue_many([("done", 1), ("bad", "fail")])
            with trio.fail_after(20):
                await events.wait_until(lambda evs: {"completed", "failed"} <= {e.name for e in evs})
            await q.enqueue("running", "block")
            with trio.fail_after(20):
                await started.wait()
            await q.enqueue_many([("waiting", 2), ("queued2", 3)])
            await q.enqueue("later", 4, delay=60)
            await q.enqueue("gone", 5, delay=60)
            await q.cancel("gone")
            counts = await q.counts()
            assert sum(counts.values()) == 7 and counts[JobState.PROCESSING] >= 1

            async def wait_later() -> None:
                try:
                    await q.enqueue_and_wait("later", 4, delay=60, timeout=30)
                except JobCancelledError as exc:
                    waited.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_later)
                # it joined the delayed job (the duplicate's incarnation) before the clear
                while not any(w.token for w in q._waiters._by_id.get("later", ())):
                    await trio.testing.wait_all_tasks_blocked()
                assert await q.clear() == 7
            assert len(waited) == 1  # the waiter learnt its job is gone
            ids = ["done", "bad", "running", "waiting", "queued2", "later", "gone"]
            assert await q.get_statuses(ids) == [None] * 7
            assert set((await q.counts()).values()) == {0}
            assert [s.name for s in await q.schedules()] == ["nightly"]
            with trio.fail_after(20):
                await events.wait_for("cleared")
            # the running handler ends: its settlement is refused, the worker goes on
            release.set()
            with trio.fail_after(20):
                await events.wait_until(lambda evs: any(e.name == "error" and e.job_id == "running" for e in evs))
                assert await q.enqueue_and_wait("after", {"ok": True}) == {"ok": True}
            assert await q.get_status("running") is None
            assert await q.clear(schedules=True) == 1
            assert await q.schedules() == []
            with pytest.raises(ValidationError, match="schedules"):
                await q.clear(schedules="yes")  # type: ignore[arg-type]
        assert (await other.get_status("kept")) is not None
