"""Optional OpenTelemetry tracing: a job carries its producer's trace context, and the
worker runs its handler in a span that continues it.

Active when ``opentelemetry-api`` is importable (checked once, at import): ``enqueue``
stores the current context (W3C ``traceparent``/``tracestate`` and baggage, through the
globally configured propagator) in the job's envelope options, and each attempt runs in a
``CONSUMER`` span named ``"<queue> process"`` whose parent is that context. Without the
package nothing is stored and nothing is called; with the API but no tracer provider
configured (no SDK), nothing is done either: the API would only make no-op spans.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._outcomes import Parked, Sleeping, WaitForChildren

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the optional dependency is absent: tracing is off
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from ._types import Job

__all__ = ["ENABLED", "JobSpan", "current_context", "end_job_span", "start_job_span"]

TRACER_NAME = "trioqueue"


_tracer: tuple[Any, Any] = (None, None)  # (provider, its trioqueue tracer)

# ``get_tracer_provider()`` looks the environment up on every call while no provider is
# set (a microsecond, on every job and enqueue); the API's global says so for free.
_ENV_PROVIDER = ENABLED and "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _provider() -> Any:
    """The configured tracer provider, or ``None`` while there is none (the API's proxy
    provider: spans would be no-ops)."""
    if not _ENV_PROVIDER and getattr(trace, "_TRACER_PROVIDER", False) is None:
        return None  # the API's own test: no provider set in code nor named in the environment
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _configured_tracer() -> Any:
    """The trioqueue tracer of the configured provider, or ``None`` while no SDK is
    configured (the API's proxy provider: spans would be no-ops; skip them)."""
    global _tracer
    provider = _provider()
    if provider is None:
        return None
    if _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(TRACER_NAME))
    return _tracer[1]


def current_context() -> dict[str, str] | None:
    """The current trace context as a carrier dict, or ``None`` when there is none (or
    no tracer provider is configured)."""
    if not ENABLED or _provider() is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


class JobSpan:
    """The span of one attempt, current in the attempt's task (and the threads it starts)
    from :func:`start_job_span` to :func:`end_job_span`."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span = span
        self.token = token


def start_job_span(queue: str, job: Job[Any], carrier: dict[str, str] | None) -> JobSpan | None:
    """Start the span of one attempt of ``job``, continuing ``carrier``'s context, and make
    it current in this task; ``None`` while no tracer provider is configured."""
    if not _ENV_PROVIDER and getattr(trace, "_TRACER_PROVIDER", False) is None:
        return None  # _provider()'s first test, inline: this runs for every job
    tracer = _configured_tracer()
    if tracer is None:
        return None
    parent = propagate.extract(carrier) if carrier else None
    span = tracer.start_span(
        f"{queue} process",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "trioqueue",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": job.id,
            "trioqueue.job.attempt": job.attempts,
            "trioqueue.job.max_attempts": job.max_attempts,
        },
    )
    return JobSpan(span, otel_context.attach(trace.set_span_in_context(span, parent)))


def end_job_span(handle: JobSpan, raised: BaseException | None) -> None:
    """End the attempt's span; an attempt that raised (or timed out) is marked failed,
    not one that went to sleep or waits for its children or for a signal."""
    otel_context.detach(handle.token)
    if raised is not None and not isinstance(raised, Sleeping | WaitForChildren | Parked):
        handle.span.record_exception(raised)
        handle.span.set_status(Status(StatusCode.ERROR, f"{type(raised).__qualname__}: {raised}"))
    handle.span.end()
