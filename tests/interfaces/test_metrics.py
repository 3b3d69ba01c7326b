"""Prometheus metrics (trioqueue.metrics): counters from the execution path, histograms,
gauges from the storage; and ``trioqueue worker --metrics-port`` scraped over real HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trioqueue import Job, JobCancelledError, JobFailedError, Queue, Storage
from trioqueue.metrics import QueueMetrics
from trioqueue.storage import from_url
from trioqueue.storage._base import NewJob

from support import ProcessLines, Recorder

FAST = {"retry_delay": 0, "block_timeout": 0.5}


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Exposition text -> {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def handle(job: Job[Any]) -> Any:
    if job.payload == "boom":
        raise ValueError("boom")
    if job.payload == "block":
        await trio.sleep_forever()
    return job.payload


async def test_counters_histograms_and_gauges_in_the_apps_registry(storage: Storage, queue_name: str) -> None:
    registry = CollectorRegistry()
    metrics = QueueMetrics(registry, refresh_interval=3600)
    blocked = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        if job.payload == "block":
            blocked.set()
        return await handle(job)

    queue = metrics.instrument(Queue(storage, name=queue_name, handler=handler, max_attempts=2, concurrency=4, **FAST))
    async with queue, trio.open_nursery() as nursery:
        await nursery.start(metrics.run)
        for i in range(5):
            assert await queue.enqueue_and_wait(f"ok{i}", i) == i
        assert (await queue.enqueue("ok0", 0)).status == "completed"  # not a new job: not counted
        with pytest.raises(JobFailedError):
            await queue.enqueue_and_wait("boom", "boom")  # attempt 1 retried, attempt 2 failed
        await queue.enqueue("later", 1, delay=3600)
        await queue.enqueue("block", "block")
        async with trio.open_nursery() as waiters:

            async def wait_block() -> None:
                with pytest.raises(JobCancelledError):
                    await queue.enqueue_and_wait("block", "block")  # joins the job

            waiters.start_soon(wait_block)
            await blocked.wait()
            await queue.cancel("block")
        await metrics.refresh()
        samples = parse(generate_latest(registry).decode())
        nursery.cancel_scope.cancel()
    q = queue_name
    assert value(samples, "trioqueue_jobs_enqueued_total", queue=q) == 8  # 5 ok, boom, later, block
    assert value(samples, "trioqueue_jobs_started_total", queue=q) == 8  # 5 ok, 2 boom, block
    assert value(samples, "trioqueue_jobs_completed_total", queue=q) == 5
    assert value(samples, "trioqueue_jobs_retried_total", queue=q) == 1
    assert value(samples, "trioqueue_jobs_failed_total", queue=q) == 1
    assert value(samples, "trioqueue_jobs_cancelled_total", queue=q) == 1
    assert value(samples, "trioqueue_jobs_reaped_total", queue=q) == 0
    assert value(samples, "trioqueue_job_duration_seconds_count", queue=q, outcome="completed") == 5
    assert value(samples, "trioqueue_job_duration_seconds_count", queue=q, outcome="retried") == 1
    assert value(samples, "trioqueue_job_duration_seconds_count", queue=q, outcome="failed") == 1
    assert value(samples, "trioqueue_job_duration_seconds_count", queue=q, outcome="cancelled") == 1
    assert value(samples, "trioqueue_job_wait_seconds_count", queue=q) == 7  # first attempts only
    for state, n in {"completed": 5, "failed": 1, "cancelled": 1, "delayed": 1, "queued": 0, "processing": 0}.items():
        assert value(samples, "trioqueue_jobs", queue=q, state=state) == n, state
    assert value(samples, "trioqueue_workers", queue=q) == 1


async def test_reaped_counter_and_gauges_of_a_stopped_queue(storage: Storage, queue_name: str) -> None:
    from trioqueue._core import encode_envelope

    # A worker that claimed a job and died: the instrumented queue's reaper recovers it.
    await storage.heartbeat(queue_name, "dead-worker", 0.3, [], 0.3)
    await storage.enqueue(queue_name, [NewJob("orphan", encode_envelope("orphan", b"1", 0, 0, 3, 60_000), 3, 60.0)])
    [claim] = await storage.dequeue(queue_name, "dead-worker", 1, 1.0, 0.3)
    assert claim.id == "orphan"
    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    stalled = Recorder()
    queue = Queue(storage, name=queue_name, handler=handle, visibility_timeout=1.0, **FAST).copy()
    metrics.instrument(queue)
    queue.on("stalled", stalled)
    async with queue:
        with trio.fail_after(15):
            assert await queue.enqueue_and_wait("orphan", None) == 1
            await stalled.wait_for("stalled")
        await metrics.refresh()
        assert value(parse(generate_latest(registry).decode()), "trioqueue_workers", queue=queue_name) == 1
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "trioqueue_jobs_reaped_total", queue=queue_name) == 1
    await metrics.refresh()  # the queue no longer runs: its gauges go away
    assert value(parse(generate_latest(registry).decode()), "trioqueue_workers", queue=queue_name) is None


def test_a_put_back_that_is_not_an_outcome_is_not_counted() -> None:
    """A rate-limited, waiting or sleeping attempt is no outcome: ``job_finished`` of one
    counts nothing (it raised a KeyError, which the queue logged, once an attempt)."""
    from trioqueue.storage import SettleKind

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    for kind in (SettleKind.RATE_LIMITED, SettleKind.WAIT_CHILDREN, SettleKind.SLEEP):
        metrics.job_finished("q", "j", kind, 0.01)
    metrics.job_finished("q", "j", SettleKind.COMPLETE, 0.01)
    assert value(parse(generate_latest(registry).decode()), "trioqueue_jobs_completed_total", queue="q") == 1


def test_metrics_names_clash_in_one_registry_is_refused() -> None:
    registry = CollectorRegistry()
    QueueMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        QueueMetrics(registry)
    QueueMetrics(registry, namespace="other")  # another namespace is fine


# -- the worker CLI, scraped over HTTP ---------------------------------------------------

APP = textwrap.dedent(
    """
    import trio
    from trioqueue import Job, MemoryStorage, Queue

    async def handle(job: Job[object]) -> object:
        if job.payload == "boom":
            raise ValueError("boom")
        return job.payload

    queue = Queue(MemoryStorage(), name="jobs", handler=handle, block_timeout=0.5, max_attempts=2, retry_delay=0)
    """
)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()  # type: ignore[no-any-return]


@pytest.fixture(params=["file", "redis", "postgres"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    if request.param == "postgres":
        return f"{request.getfixturevalue('postgres_url')}?schema=t_{uuid.uuid4().hex[:12]}"
    return request.getfixturevalue("redis_url")  # type: ignore[no-any-return]


async def test_worker_cli_serves_metrics_over_http(tmp_path: Path, storage_url: str) -> None:
    (tmp_path / "app.py").write_text(APP)
    name = f"m-{uuid.uuid4().hex[:8]}"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "worker", "app:queue", "--storage", storage_url, "--name", name,
         "--metrics-port", "0", "--metrics-host", "127.0.0.1", "--metrics-refresh", "0.05", "--log-format", "json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = ProcessLines(proc)
    url = None
    with trio.fail_after(60):
        while url is None:
            record = json.loads(await lines.wait_for("{"))
            if record["message"].startswith("serving metrics on "):
                url = record["message"].removeprefix("serving metrics on ")
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        async with Queue(from_url(storage_url), name=name, max_attempts=2) as producer:  # the job's own max
            for i in range(6):
                assert await producer.enqueue_and_wait(f"j{i}", i) == i
            with pytest.raises(JobFailedError):
                await producer.enqueue_and_wait("boom", "boom")
        # Counters are updated as jobs run; gauges within --metrics-refresh: scrape until
        # the worker's read of the storage shows the finished jobs (another process: no event).
        while True:
            samples = parse(await trio.to_thread.run_sync(_scrape, url))
            completed = value(samples, "trioqueue_jobs", queue=name, state="completed")
            if completed == 6 and value(samples, "trioqueue_jobs", queue=name, state="failed") == 1:
                break
            await trio.sleep(0.05)
    assert value(samples, "trioqueue_jobs", queue=name, state="queued") == 0
    assert value(samples, "trioqueue_workers", queue=name) == 1
    assert value(samples, "trioqueue_oldest_job_age_seconds", queue=name) == 0  # none waiting
    assert value(samples, "trioqueue_jobs_enqueued_total", queue=name) == 0  # the test enqueued, not the worker
    assert value(samples, "trioqueue_jobs_started_total", queue=name) == 8
    assert value(samples, "trioqueue_jobs_completed_total", queue=name) == 6
    assert value(samples, "trioqueue_jobs_retried_total", queue=name) == 1
    assert value(samples, "trioqueue_jobs_failed_total", queue=name) == 1
    assert value(samples, "trioqueue_job_duration_seconds_count", queue=name, outcome="completed") == 6
    assert value(samples, "trioqueue_job_wait_seconds_count", queue=name) == 7
    proc.send_signal(signal.SIGINT)
    with trio.fail_after(60):
        assert await proc.wait() == 0
    with pytest.raises(urllib.error.URLError):  # the server stopped with the worker
        await trio.to_thread.run_sync(_scrape, url)


async def test_storage_oldest_per_non_terminal_state(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as queue:
        assert await storage.oldest(queue_name, "queued") is None
        await queue.enqueue("a", 1)
        await queue.enqueue("b", 2)
        await queue.enqueue("d", 3, delay=3600)
        a, b, d = [await queue.get_status(j) for j in ("a", "b", "d")]
        assert a is not None and b is not None and d is not None
        assert await storage.oldest(queue_name, "queued") == a.updated_at
        assert await storage.oldest(queue_name, "delayed") == d.updated_at
        assert await storage.oldest(queue_name, "processing") is None
        [claim] = await storage.dequeue(queue_name, "w", 1, 0.5, 30.0)
        assert claim.id == "a"
        a = await queue.get_status("a")
        assert a is not None and await storage.oldest(queue_name, "processing") == a.updated_at
        assert await storage.oldest(queue_name, "queued") == b.updated_at
        for bad in ("completed", "nope"):
            with pytest.raises(ValueError, match="non-terminal"):
                await storage.oldest(queue_name, bad)


async def test_oldest_job_age_gauge(storage: Storage, queue_name: str) -> None:
    import time

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    async with metrics.instrument(Queue(storage, name=queue_name)) as queue:
        await metrics.refresh()
        assert value(parse(generate_latest(registry).decode()), "trioqueue_oldest_job_age_seconds", queue=queue_name) == 0
        await queue.enqueue("waiting", 1)
        status = await queue.get_status("waiting")
        assert status is not None
        await metrics.refresh()
        before = time.time()
        age = value(parse(generate_latest(registry).decode()), "trioqueue_oldest_job_age_seconds", queue=queue_name)
        after = time.time()
        assert age is not None and before - status.updated_at - 0.001 <= age <= after - status.updated_at + 0.001
        samples = parse(generate_latest(registry).decode())
        assert value(samples, "trioqueue_jobs", queue=queue_name, state="queued") == 1
        assert value(samples, "trioqueue_jobs_enqueued_total", queue=queue_name) == 1
        assert value(samples, "trioqueue_workers", queue=queue_name) == 0  # a producer is no worker
