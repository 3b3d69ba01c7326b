"""Signals from the command line (``trioqueue signal``, ``stats``, ``list
waiting_signal``) and the dashboard's listing of the jobs waiting for one (issue 34,
item 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from trioqueue import Job, MemoryStorage, Queue, Storage
from trioqueue.dashboard import Dashboard

from dashboard_client import Client
from support import Recorder
from test_admin_cli import Cli, target  # noqa: F401 - the fixture: file, Redis, PostgreSQL


def _parked(q: Queue[Any]) -> Recorder:
    """The queue's ``waiting_signal`` (a job parked) and ``completed`` events, recorded."""
    parked = Recorder()
    q.on("waiting_signal", parked)
    q.on("completed", parked)
    return parked


async def test_the_cli_signals_a_waiting_job_and_counts_and_lists_it(target: tuple[Cli, Callable[[], Storage]]) -> None:
    """The signal comes from another process (the command), and wakes the worker there
    as a new job would (Redis: a blocked claim; PostgreSQL: a NOTIFY; file: inotify)."""
    cli, make_storage = target
    queue_name = cli.name

    async def handler(job: Job[Any]) -> Any:
        return await job.wait_for_signal("approve")

    q = Queue(make_storage(), name=queue_name, handler=handler, block_timeout=30)
    parked = _parked(q)
    async with q:
        await q.enqueue("order", None)
        with trio.fail_after(30):
            await parked.wait_for("waiting_signal", "order")
        stats = await cli.json("stats")
        assert stats[queue_name]["counts"]["waiting_signal"] == 1
        assert "waiting_signal" in (await cli.run("stats")).stdout.decode().splitlines()[0]
        listed = await cli.json("list", "waiting_signal")
        assert [j["id"] for j in listed["jobs"]] == ["order"]
        out = await cli.json("signal", "order", "approve", "--payload", '{"by": "ann"}')
        assert out == {"id": "order", "signal": "approve", "status": "delivered"}
        with trio.fail_after(10):  # (woken, not by the claim's 30 s timeout)
            await parked.wait_for("completed", "order")
        status = await q.get_status("order")
        assert status is not None
        assert status.result == {"by": "ann"}
    assert "not signalled: it is completed" in await cli.error("signal", "order", "approve")
    assert "not signalled: it is unknown" in await cli.error("signal", "nope", "approve")
    assert "--payload is not valid JSON" in await cli.error("signal", "order", "approve", "--payload", "{bad")


async def test_the_dashboard_lists_the_jobs_waiting_for_a_signal() -> None:
    async def handler(job: Job[Any]) -> Any:
        return await job.wait_for_signal("approve")

    storage = MemoryStorage()
    q = Queue(storage, name="orders", handler=handler, block_timeout=0.5)
    parked = _parked(q)
    async with q:
        await q.enqueue("order-7", None)
        with trio.fail_after(20):
            await parked.wait_for("waiting_signal", "order-7")
        async with trio.open_nursery() as nursery:
            [base] = await nursery.start(Dashboard(storage, port=0, names=["orders"]).run)
            client = Client(base)
            home = await trio.to_thread.run_sync(lambda: client.get("/"))
            page = await trio.to_thread.run_sync(lambda: client.get("/queue?name=orders&state=waiting_signal"))
            nursery.cancel_scope.cancel()
    assert home.status == 200 and 'data-queue="orders" data-state="waiting_signal">1<' in home.body
    assert page.status == 200 and "order-7" in page.body


async def test_a_sync_producer_signals_a_waiting_job(tmp_path: Path) -> None:
    """From code outside Trio (a web handler's webhook): ``SyncProducer.signal``."""
    from trioqueue import FileStorage, SyncProducer

    store = tmp_path / "store"

    async def handler(job: Job[Any]) -> Any:
        return await job.wait_for_signal("paid")

    q = Queue(FileStorage(store), name="jobs", handler=handler, block_timeout=0.5)
    parked = _parked(q)
    async with q:
        await q.enqueue("invoice", None)
        with trio.fail_after(20):
            await parked.wait_for("waiting_signal", "invoice")

        def webhook() -> list[str]:
            producer: SyncProducer[Any, Any] = SyncProducer(store, name="jobs")
            try:
                return [producer.signal("invoice", "paid", {"eur": 12}), producer.signal("nobody", "paid")]
            finally:
                producer.close()

        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(webhook) == ["delivered", "not_found"]
            await parked.wait_for("completed", "invoice")
        status = await q.get_status("invoice")
        assert status is not None
        assert status.result == {"eur": 12}
