"""The dashboard's job page lists a job's stored steps (issue 34, item 1)."""

from __future__ import annotations

from typing import Any

import trio

from trioqueue import Job, MemoryStorage, Queue
from trioqueue.dashboard import Dashboard

from dashboard_client import Client


async def test_the_job_page_lists_the_steps_in_order() -> None:
    async def handler(job: Job[Any]) -> None:
        await job.step("charge", lambda: {"paid": 10})
        await job.step("<b>mail</b>", lambda: "sent")

    storage = MemoryStorage()
    async with Queue(storage, name="orders", handler=handler, block_timeout=0.5) as q:
        with trio.fail_after(20):
            await q.enqueue_and_wait("order", None)
        async with trio.open_nursery() as nursery:
            [base] = await nursery.start(Dashboard(storage, port=0, names=["orders"]).run)
            client = Client(base)
            page = await trio.to_thread.run_sync(lambda: client.get("/job?queue=orders&id=order"))
            nursery.cancel_scope.cancel()
    assert page.status == 200 and 'id="job-steps"' in page.body
    table = page.body[page.body.index('id="job-steps"') :]
    assert table.index("charge") < table.index("&lt;b&gt;mail&lt;/b&gt;")  # in order, escaped
    assert "<b>mail</b>" not in page.body
