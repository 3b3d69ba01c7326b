"""SyncProducer and AsyncioProducer: producers for code that does not run Trio.

End to end across processes: a sync producer process and an asyncio producer process
(tests/helpers/producer_app.py) enqueue and wait while a ``trioqueue worker`` process runs
the jobs, on FileStorage and on the suite's Redis. In-process tests cover threads, closing
and errors.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trioqueue import (
    AsyncioProducer,
    FileStorage,
    JobFailedError,
    JobState,
    Queue,
    QueueStoppedError,
    SyncProducer,
    TrioQueueError,
    ValidationError,
)
from trioqueue.storage import from_url

from support import ProcessLines

from support import HELPERS

WORKER_APP = textwrap.dedent(
    """
    import trio
    from trioqueue import Job, MemoryStorage, Queue

    async def handle(job: Job[object]) -> object:
        if job.payload == "boom":
            raise ValueError("boom")
        if job.payload == "block":
            await trio.sleep_forever()
        return job.payload * 2

    queue = Queue(MemoryStorage(), name="jobs", handler=handle, block_timeout=0.5, max_attempts=1)
    """
)

EXPECTED = {
    "enqueue": "queued",
    "duplicate": "duplicate",
    "many": ["queued", "queued", "queued"],
    "wait": 42,
    "wait_failed": {"error": "JobFailedError"},
    "bad_id": {"error": "ValidationError"},
    "bad_payload": {"error": "ValidationError"},
    "delayed": "queued",
    "cancel": "cancelled",
    "status": {"state": "completed", "result": 42},
    "status_unknown": None,
    "result": 42,
    "result_failed": {"error": "JobFailedError"},
    "concurrent": [0, 2, 4, 6, 8, 10],
}


@pytest.fixture(params=["file", "redis"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    return request.getfixturevalue("redis_url")  # type: ignore[no-any-return]


@pytest.fixture
async def worker(tmp_path: Path, storage_url: str) -> AsyncIterator[str]:
    """A ``trioqueue worker`` process on ``storage_url``; yields the queue name."""
    (tmp_path / "app.py").write_text(WORKER_APP)
    name = f"p-{uuid.uuid4().hex[:8]}"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "worker", "app:queue", "--storage", storage_url, "--name", name,
         "--concurrency", "4", "--log-format", "json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = ProcessLines(proc)
    try:
        with trio.fail_after(60):
            while "serving queue" not in await lines.readline():
                pass
        yield name
    finally:
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(60):
            assert await proc.wait() == 0


async def _run_producer(mode: str, url: str, name: str, tag: str) -> dict[str, Any]:
    proc = await trio.run_process(
        [sys.executable, str(HELPERS / "producer_app.py"), mode, url, name, tag],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().splitlines()
    assert out[-1] == "DONE", out
    return {r["step"]: r["out"] for r in map(json.loads, out[:-1])}


async def test_sync_and_asyncio_producer_processes_with_a_trio_worker_process(worker: str, storage_url: str) -> None:
    reports: dict[str, dict[str, Any]] = {}

    async def produce(mode: str) -> None:
        reports[mode] = await _run_producer(mode, storage_url, worker, mode)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce, "sync")
            nursery.start_soon(produce, "asyncio")
    assert reports["sync"] == EXPECTED
    assert reports["asyncio"] == EXPECTED
    # What the worker process did, read back through the storage by a Trio Queue.
    async with Queue(from_url(storage_url), name=worker) as queue:
        for mode in ("sync", "asyncio"):
            for job_id, result in [(f"{mode}-a", 2), (f"{mode}-m2", 4), (f"{mode}-t5", 10)]:
                with trio.fail_after(60):
                    async for status in queue.watch(job_id):
                        if status is not None and status.state.terminal:
                            break
                assert status is not None and status.state is JobState.COMPLETED and status.result == result
            later = await queue.get_status(f"{mode}-later")
            assert later is not None and later.state is JobState.CANCELLED


# -- in process: a Trio worker in the test, the producer called from threads ------------


async def _double(job: Any) -> Any:
    if job.payload == "block":
        await trio.sleep_forever()
    if job.payload == "boom":
        raise ValueError("boom")
    return job.payload * 2


@pytest.fixture
async def file_worker(tmp_path: Path) -> AsyncIterator[Path]:
    store = tmp_path / "store"
    async with Queue(FileStorage(store), name="jobs", handler=_double, concurrency=8, block_timeout=0.5, max_attempts=1):
        yield store


def _producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("trioqueue-producer-")]


async def test_sync_producer_shared_by_threads(file_worker: Path) -> None:
    producer: SyncProducer[int, int] = await trio.to_thread.run_sync(lambda: SyncProducer(file_worker, name="jobs"))
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def client(n: int) -> None:
        for i in range(5):
            try:
                results[n * 10 + i] = producer.enqueue_and_wait(f"t{n}-{i}", n * 10 + i)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    def clients() -> None:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses.extend(producer.get_statuses([f"t{n}-4" for n in range(8)] + ["never"]))
        producer.close()

    statuses: list[Any] = []
    with trio.fail_after(60):
        await trio.to_thread.run_sync(clients)
    assert not errors
    assert results == {k: 2 * k for k in results} and len(results) == 40
    assert [(s.id, s.state, s.result) for s in statuses[:8]] == [(f"t{n}-4", JobState.COMPLETED, 2 * (n * 10 + 4)) for n in range(8)]
    assert statuses[8] is None
    assert not _producer_threads()


async def test_close_ends_calls_in_flight_and_refuses_new_ones(file_worker: Path) -> None:
    def scenario() -> tuple[BaseException | None, BaseException | None]:
        producer: SyncProducer[str, str] = SyncProducer(file_worker, name="jobs")
        waiting: list[BaseException] = []

        def wait_forever() -> None:
            try:
                producer.enqueue_and_wait("stuck", "block", timeout=3600)
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                waiting.append(exc)

        waiter = threading.Thread(target=wait_forever)
        waiter.start()
        # The wait is in flight once the worker runs the job.
        while (status := producer.get_status("stuck")) is None or status.state is not JobState.PROCESSING:
            threading.Event().wait(0.02)  # another process's view: nothing to wait on but the registry
        producer.close()
        waiter.join()
        try:
            producer.enqueue("x", "y")
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            return waiting[0] if waiting else None, exc
        return waiting[0] if waiting else None, None

    with trio.fail_after(60):
        in_flight, after = await trio.to_thread.run_sync(scenario)
    assert isinstance(in_flight, QueueStoppedError) and in_flight.job_id == "stuck"
    assert isinstance(after, TrioQueueError) and "is closed" in str(after)
    assert not _producer_threads()
    async with Queue(FileStorage(file_worker), name="jobs") as queue:
        await queue.cancel("stuck")  # let the worker stop gracefully


async def test_asyncio_producer_errors_and_cancellation(file_worker: Path) -> None:
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with AsyncioProducer(file_worker, name="jobs") as producer:
            try:
                await producer.enqueue_and_wait("boom", "boom")
            except JobFailedError as exc:
                out["failed"] = (exc.job_id, exc.error.type, exc.error.message)
            try:
                await producer.enqueue("bad", {1, 2})  # a set: not JSON
            except ValidationError as exc:
                out["invalid"] = str(exc)
            # An asyncio timeout cancels the call in the Trio thread; the producer goes on.
            try:
                await asyncio.wait_for(producer.enqueue_and_wait("late", 1, delay=3600), timeout=0.05)
            except TimeoutError:
                out["timed_out"] = True
            # ... and the call is gone from the bridge (polled: another thread's nursery).
            bridge = producer._bridge
            for _ in range(1000):
                calls = trio.from_thread.run_sync(lambda: len(bridge._calls.child_tasks), trio_token=bridge._token)
                if not calls:
                    break
                await asyncio.sleep(0.01)
            out["calls_left"] = calls
            out["cancel"] = (await producer.cancel("late")).status.value
            out["after"] = await producer.enqueue_and_wait("ok", 4)
            statuses = await producer.get_statuses(i for i in ("ok", "nobody", "late"))
            out["statuses"] = [None if st is None else (st.id, st.state.value) for st in statuses]
            try:
                await producer.get_statuses("ok")
            except ValidationError as exc:
                out["one_string"] = str(exc)
        try:
            await producer.get_status("ok")
        except TrioQueueError as exc:
            out["closed"] = str(exc)
        return out

    with trio.fail_after(60):
        out = await trio.to_thread.run_sync(asyncio.run, main())
    assert out["failed"] == ("boom", "ValueError", "boom")
    assert "payload of job 'bad'" in out["invalid"]
    assert out["timed_out"] is True and out["calls_left"] == 0
    assert out["cancel"] == "cancelled" and out["after"] == 8
    assert out["statuses"] == [("ok", "completed"), None, ("late", "cancelled")]
    assert "not the string 'ok'" in out["one_string"]
    assert "is closed" in out["closed"]
    assert not _producer_threads()


def test_construction_errors_are_raised_in_the_caller(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="unsupported storage URL scheme 'ftp'"):
        SyncProducer("ftp://nowhere", name="jobs")
    with pytest.raises(ValidationError, match="max_attempts"):
        SyncProducer(tmp_path / "store", name="jobs", max_attempts=0)  # type: ignore[arg-type]
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(Exception) as info:
        SyncProducer(str(blocker / "store"), name="jobs")  # the storage cannot open
    assert not isinstance(info.value, AssertionError)
    assert not _producer_threads()

    async def open_bad() -> None:
        async with AsyncioProducer(str(blocker / "store"), name="jobs"):
            raise AssertionError("opened a storage under a regular file")

    with pytest.raises(type(info.value)):
        asyncio.run(open_bad())
    assert not _producer_threads()
    with pytest.raises(TrioQueueError, match="is not open yet"):
        AsyncioProducer(str(tmp_path / "store"), name="jobs")._bridge.submit("get_status", "x")
