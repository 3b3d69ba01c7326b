"""Prometheus metrics for trioqueue Queues (the ``metrics`` extra: ``pip install
'trioqueue[metrics]'``).

::

    from prometheus_client import CollectorRegistry
    from trioqueue.metrics import QueueMetrics

    registry = CollectorRegistry()              # or the default one: QueueMetrics()
    metrics = QueueMetrics(registry)
    metrics.instrument(queue)                   # before or while it runs
    async with queue, trio.open_nursery() as nursery:
        await nursery.start(metrics.run)        # keeps the gauges fresh

What is measured, all labelled by ``queue``:

- counters of what *this process* did: ``trioqueue_jobs_enqueued_total`` (new jobs,
  duplicates not counted), ``_started_total`` (attempts started), ``_completed_total``,
  ``_failed_total`` (failed for good), ``_retried_total`` (failed attempts that will be
  retried), ``_cancelled_total``, ``_reaped_total`` (stalled jobs recovered by this
  process's reaper);
- histograms ``trioqueue_job_duration_seconds`` (the handler's run, also labelled by
  ``outcome``: completed, retried, failed, cancelled) and ``trioqueue_job_wait_seconds``
  (from enqueue, or from the due time of a delayed job, to the start of its first attempt);
- gauges of the queue as the storage sees it (the same in every process: aggregate them
  with ``max``): ``trioqueue_jobs{queue,state}`` (jobs per state, from
  :meth:`Queue.counts`), ``trioqueue_oldest_job_age_seconds`` (how long the oldest queued
  job has waited, from :meth:`Administration.oldest <trioqueue.storage.Administration.oldest>`; computed at scrape time from the cached
  entry time), ``trioqueue_workers`` (live registered workers) and
  ``trioqueue_metrics_refreshed_timestamp_seconds``.

The gauges are *cached*: :meth:`QueueMetrics.run` (a Trio service) reads the storage every
``refresh_interval`` seconds and a scrape returns the last values. A scrape runs in the
HTTP server's thread (or wherever the application calls ``generate_latest``, the Trio
thread included), so it never waits for the storage and never blocks the event loop;
gauges are at most ``refresh_interval`` old. A queue whose last read failed (or that is
not running) has no gauges until a read succeeds. Counters and histograms are updated as
things happen (``prometheus_client`` metrics are thread-safe).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ._model import _validate as check
from ._model._errors import install_hint
from ._supervision._observers import QueueObserver
from .storage._base import SettleKind
from .storage._capabilities import Administration

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"trioqueue.metrics {install_hint('metrics', 'prometheus-client')}") from exc

if TYPE_CHECKING:
    from ._supervision._queue import Queue

__all__ = ["DURATION_BUCKETS", "QueueMetrics", "QueueObserver", "WAIT_BUCKETS"]

logger = logging.getLogger("trioqueue.metrics")

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, math.inf)
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf)

_OUTCOMES = {
    SettleKind.COMPLETE: "completed",
    SettleKind.RETRY: "retried",
    SettleKind.FAIL: "failed",
    SettleKind.CANCEL: "cancelled",
}


class _Gauges:
    """The custom collector of the cached gauges (read at scrape time, any thread)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        # queue name -> (counts by state, live workers, oldest queued job's entry time or
        # None, refreshed at); replaced whole (one reference assignment), so a scrape in
        # another thread sees one consistent read.
        self.values: dict[str, tuple[dict[str, int], int, float | None, float]] = {}

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        ns = self.namespace
        return (
            GaugeMetricFamily(f"{ns}_jobs", "Jobs in each state, as the storage counts them", labels=["queue", "state"]),
            GaugeMetricFamily(
                f"{ns}_oldest_job_age_seconds", "How long the oldest queued job has been waiting (0: none)", labels=["queue"]
            ),
            GaugeMetricFamily(f"{ns}_workers", "Live workers registered on the queue", labels=["queue"]),
            GaugeMetricFamily(
                f"{ns}_metrics_refreshed_timestamp_seconds", "When the gauges were read from the storage", labels=["queue"]
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        jobs, oldest, workers, refreshed = self._families()
        now = time.time()
        for queue, (counts, live, since, at) in sorted(self.values.items()):
            for state, n in counts.items():
                jobs.add_metric([queue, state], n)
            oldest.add_metric([queue], 0.0 if since is None else max(0.0, now - since))
            workers.add_metric([queue], live)
            refreshed.add_metric([queue], at)
        return [jobs, oldest, workers, refreshed]


class QueueMetrics(QueueObserver):
    """Prometheus metrics of the Queues given to :meth:`instrument`, registered in
    ``registry`` (the default ``prometheus_client.REGISTRY`` when omitted; one
    QueueMetrics per registry, for any number of queues). See the module's docstring for
    the metrics; ``namespace`` prefixes their names."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "trioqueue",
        refresh_interval: float = 5.0,
        duration_buckets: Sequence[float] = DURATION_BUCKETS,
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.refresh_interval = check.seconds("refresh_interval", refresh_interval)
        self.queues: list[Queue[Any, Any]] = []
        ns = namespace
        reg = self.registry

        def counter(what: str, doc: str, labels: Sequence[str] = ("queue",)) -> Counter:
            return Counter(f"{ns}_jobs_{what}", doc, labels, registry=reg)

        self.enqueued = counter("enqueued", "Jobs enqueued by this process (duplicates not counted)")
        self.started = counter("started", "Attempts started by this process")
        self.completed = counter("completed", "Jobs completed by this process")
        self.failed = counter("failed", "Jobs failed for good by this process")
        self.retried = counter("retried", "Failed attempts of this process that will be retried")
        self.cancelled = counter("cancelled", "Jobs of this process cancelled (before or while running)")
        self.reaped = counter("reaped", "Stalled jobs recovered by this process's reaper")
        self.duration = Histogram(
            f"{ns}_job_duration_seconds",
            "Handler run time of an attempt, by outcome",
            ["queue", "outcome"],
            buckets=duration_buckets,
            registry=reg,
        )
        self.wait = Histogram(
            f"{ns}_job_wait_seconds",
            "Time from enqueue (or due time) to the start of a job's first attempt",
            ["queue"],
            buckets=wait_buckets,
            registry=reg,
        )
        self._by_outcome = {
            SettleKind.COMPLETE: self.completed,
            SettleKind.RETRY: self.retried,
            SettleKind.FAIL: self.failed,
            SettleKind.CANCEL: self.cancelled,
        }
        self._children: dict[str, _Children] = {}
        self._gauges = _Gauges(ns)
        reg.register(self._gauges)

    def instrument(self, queue: Queue[Any, Any]) -> Queue[Any, Any]:
        """Measure ``queue`` (and the copies :meth:`Queue.copy` makes of it from now on,
        as the worker CLI does); returns it."""
        queue.add_observer(self)
        if queue not in self.queues:
            self.queues.append(queue)
        self._of(queue.name)  # its counters are exported (at 0) from the start
        return queue

    # -- gauges ------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the gauges of every running instrumented queue from the storage now."""
        fresh: dict[str, tuple[dict[str, int], int, float | None, float]] = {}
        for queue in list(self.queues):
            if not queue.running:
                continue
            try:
                counts = await queue.counts()
                storage = queue.storage
                oldest = await storage.oldest(queue.name, "queued") if isinstance(storage, Administration) else None
                workers = await queue.storage.workers(queue.name)
            except Exception as exc:
                logger.warning("metrics of queue %r not refreshed: %s", queue.name, exc)
                continue
            fresh[queue.name] = ({str(state.value): n for state, n in counts.items()}, len(workers), oldest, time.time())
        self._gauges.values = fresh  # one assignment: a scrape sees the old or the new read

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh the gauges every ``refresh_interval`` seconds until cancelled (the
        first refresh is done when it reports started). Start it once the queues run."""
        await self.refresh()
        task_status.started()
        while True:
            await trio.sleep(self.refresh_interval)
            await self.refresh()

    # -- QueueObserver -----------------------------------------------------------------

    def _of(self, queue: str) -> _Children:
        children = self._children.get(queue)
        if children is None:
            children = self._children[queue] = _Children(self, queue)
        return children

    def copied(self, queue: Queue[Any, Any]) -> None:
        self.instrument(queue)

    def jobs_enqueued(self, queue: str, count: int) -> None:
        if count:
            self._of(queue).enqueued.inc(count)

    def job_started(self, queue: str, job_id: str, attempt: int, wait: float | None) -> None:
        children = self._of(queue)
        children.started.inc()
        if wait is not None:
            children.wait.observe(max(0.0, wait))

    def job_finished(self, queue: str, job_id: str, outcome: SettleKind, duration: float | None) -> None:
        children = self._of(queue)
        ended = children.ended.get(outcome)
        if ended is None:
            return  # put back without using an attempt (rate limited, waiting for children, asleep): not an outcome
        ended.inc()
        if duration is not None:
            children.duration[outcome].observe(duration)

    def job_reaped(self, queue: str, job_id: str, outcome: str) -> None:
        self._of(queue).reaped.inc()


class _Children:
    """The labelled children of one queue's metrics (``labels()`` is looked up once)."""

    __slots__ = ("duration", "ended", "enqueued", "reaped", "started", "wait")

    def __init__(self, m: QueueMetrics, queue: str) -> None:
        self.enqueued = m.enqueued.labels(queue)
        self.started = m.started.labels(queue)
        self.reaped = m.reaped.labels(queue)
        self.wait = m.wait.labels(queue)
        self.ended = {kind: counter.labels(queue) for kind, counter in m._by_outcome.items()}
        self.duration = {kind: m.duration.labels(queue, name) for kind, name in _OUTCOMES.items()}
