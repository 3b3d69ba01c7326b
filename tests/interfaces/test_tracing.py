"""Optional OpenTelemetry: a job carries its producer's trace context and the worker runs
the handler in a span continuing it (opentelemetry-sdk with an in-memory exporter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from trioqueue import Job, JobFailedError, Queue, Storage
from trioqueue._core import decode_envelope

from support import Recorder


class _Switch(Sampler):
    """Samples everything while a test of this module runs, nothing otherwise: the global
    provider can be set only once per process, and the rest of the suite should not pay."""

    active = False

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, kind: Any = None, attributes: Any = None, *rest: Any
    ) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.active else Decision.DROP, attributes)

    def get_description(self) -> str:
        return "switch"


_SWITCH = _Switch()
_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider(sampler=_SWITCH)
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    _SWITCH.active = True
    try:
        yield _EXPORTER
    finally:
        _SWITCH.active = False
        _EXPORTER.clear()


async def test_worker_span_continues_the_producer_span(storage: Storage, queue_name: str, spans: InMemorySpanExporter) -> None:
    seen: dict[str, Any] = {}

    async def handler(job: Job[Any]) -> Any:
        seen[job.id] = trace.get_current_span().get_span_context()
        if job.payload == "boom":
            raise ValueError("boom")
        return job.payload

    tracer = trace.get_tracer("test")
    async with Queue(storage, name=queue_name) as producer:
        with tracer.start_as_current_span("web request") as request_span:
            await producer.enqueue("traced", 1)
            await producer.enqueue_many([("many", 2)])
            await producer.enqueue("boom", "boom", max_attempts=1)
        await producer.enqueue("untraced", 3)  # no span current: no context stored
        record = await storage.get_job(queue_name, "untraced")
        assert record is not None
    async with Queue(storage, name=queue_name, handler=handler, block_timeout=0.5) as worker:
        with trio.fail_after(30):
            for job_id in ("traced", "many", "untraced"):
                await worker.enqueue_and_wait(job_id, None)
            with pytest.raises(JobFailedError):
                await worker.enqueue_and_wait("boom", None)
    finished = {s.attributes["messaging.message.id"]: s for s in spans.get_finished_spans() if s.name.endswith(" process")}
    parent = request_span.get_span_context()
    for job_id in ("traced", "many", "boom"):
        span = finished[job_id]
        assert span.name == f"{queue_name} process" and span.kind is SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context.trace_id == parent.trace_id
        assert span.attributes["messaging.destination.name"] == queue_name
        assert span.attributes["trioqueue.job.attempt"] == 1
        # The handler ran with the job's span current.
        assert seen[job_id].span_id == span.context.span_id
    assert finished["traced"].status.status_code is StatusCode.UNSET
    assert finished["boom"].status.status_code is StatusCode.ERROR
    assert [e.name for e in finished["boom"].events] == ["exception"]
    untraced = finished["untraced"]
    assert untraced.parent is None and untraced.context.trace_id != parent.trace_id


async def test_sync_handler_runs_in_the_span_too(storage: Storage, queue_name: str, spans: InMemorySpanExporter) -> None:
    def handler(job: Job[Any]) -> Any:  # runs in a worker thread
        return format(trace.get_current_span().get_span_context().trace_id, "032x")

    tracer = trace.get_tracer("test")
    async with Queue(storage, name=queue_name, handler=handler, block_timeout=0.5) as queue:
        with tracer.start_as_current_span("script") as root:
            with trio.fail_after(30):
                trace_id = await queue.enqueue_and_wait("t", None)
    assert trace_id == format(root.get_span_context().trace_id, "032x")


async def test_a_run_that_sleeps_or_waits_for_a_signal_is_not_marked_failed(
    storage: Storage, queue_name: str, spans: InMemorySpanExporter
) -> None:
    """``job.sleep`` and ``job.wait_for_signal`` end a run by an exception of their own:
    the run did not fail, and its span says nothing of an error."""

    async def handler(job: Job[Any]) -> Any:
        if job.id == "nap":
            await job.sleep("nap", 0.05)
            return "slept"
        return await job.wait_for_signal("go")

    q = Queue(storage, name=queue_name, handler=handler, block_timeout=0.5)
    parked = Recorder()
    q.on("waiting_signal", parked)
    q.on("completed", parked)
    async with q:
        with trio.fail_after(30):
            assert await q.enqueue_and_wait("nap", None) == "slept"
            await q.enqueue("wait", None)
            await parked.wait_for("waiting_signal", "wait")
            assert await q.signal("wait", "go", "ok") == "delivered"
            await parked.wait_for("completed", "wait")
    finished = [s for s in spans.get_finished_spans() if s.name.endswith(" process")]
    runs = sorted(s.attributes["messaging.message.id"] for s in finished)
    assert runs == ["nap", "nap", "wait", "wait"]
    assert [(s.status.status_code, list(s.events)) for s in finished] == [(StatusCode.UNSET, [])] * 4


def test_without_opentelemetry_nothing_is_stored_or_called() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the package were not installed
        import trio
        from trioqueue import MemoryStorage, Queue
        from trioqueue._model import _tracing
        from trioqueue._core import decode_envelope

        async def main():
            storage = MemoryStorage()
            async with Queue(storage, name="q", handler=lambda job: job.payload + 1, block_timeout=0.5) as q:
                assert await q.enqueue_and_wait("a", 1) == 2
                await q.enqueue("b", 1, delay=3600)
            print(_tracing.ENABLED, "opentelemetry" in sys.modules and sys.modules["opentelemetry"] is not None)

        trio.run(main)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


async def test_trace_context_rides_in_the_envelope_options(storage: Storage, queue_name: str, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    async with Queue(storage, name=queue_name) as producer:
        with tracer.start_as_current_span("request") as span:
            await producer.enqueue("j", 1)
        await producer.enqueue("plain", 1)
    claims = await storage.dequeue(queue_name, "w", 2, 0.5, 30.0)
    options = {c.id: decode_envelope(c.envelope)[7] for c in claims}
    ctx = span.get_span_context()
    assert options["plain"] is None  # nothing to carry: no options written
    assert options["j"] is not None
    assert f"{ctx.trace_id:032x}-{ctx.span_id:016x}".encode() in options["j"]
