"""``trioqueue worker``: import Workers (or Queues with a handler) from the application and
run them until signalled.

The first SIGINT/SIGTERM stops gracefully (no new claims, running handlers finish,
prefetched jobs go back; exit 0); a second one forces the stop (running handlers are
cancelled and their jobs go back to the queue; exit 130). Each is logged.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from .._model._errors import TrioQueueError, ValidationError, install_hint
from .._supervision._queue import Queue
from .._supervision._worker import Worker

__all__ = [
    "JsonFormatter",
    "MetricsServer",
    "Runnable",
    "SupervisorLink",
    "adapted",
    "configure_logging",
    "load_queue",
    "queues_of",
    "serve",
]

logger = logging.getLogger("trioqueue.worker")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


Runnable = Queue[Any, Any] | Worker
"""What ``trioqueue worker`` runs: a Worker, or a Queue (with a handler: the one-object
shorthand)."""


async def load_queue(spec: str) -> Runnable:
    """The Worker or Queue named by ``module.path:attribute`` (a Worker, a Queue with a
    handler, or a zero-argument factory returning one, sync or async). Raises
    ``TrioQueueError`` saying what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValidationError(f"expected module:attribute (like myapp.tasks:queue), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrioQueueError(f"cannot import {module_name!r} (from {spec!r}): {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise TrioQueueError(f"{module_name!r} has no attribute {attr!r} (from {spec!r})") from None
    if not isinstance(target, Queue | Worker) and callable(target):
        _check_factory(spec, target)
        target = target()
        if inspect.isawaitable(target):
            target = await target
    if not isinstance(target, Queue | Worker):
        raise TrioQueueError(
            f"{spec!r} is not a trioqueue Queue (nor a factory returning one): {target!r} (a Worker would do too)"
        )
    return target


def queues_of(runnables: Sequence[Runnable]) -> list[Queue[Any, Any]]:
    """The Queues that ``runnables`` serve (a Worker's, a Queue itself)."""
    return [q for r in runnables for q in (r.queues if isinstance(r, Worker) else (r,))]


def adapted(runnable: Runnable, changes: dict[str, Any]) -> Runnable:
    """``runnable`` with the command line's ``changes`` (``storage``, ``name``: the
    queues'; ``concurrency``: the worker's) applied to a copy (itself when there are none)."""
    if not changes:
        return runnable
    if isinstance(runnable, Queue):
        return runnable.copy(**changes)
    queue_changes = {k: v for k, v in changes.items() if k in ("storage", "name")}
    if "name" in queue_changes and len(runnable.queues) > 1:
        raise ValidationError(f"--name applies to one queue, and worker {runnable!r} consumes several")
    worker_changes = {k: v for k, v in changes.items() if k not in queue_changes}
    if queue_changes:
        worker_changes["queues"] = [q.copy(**queue_changes) for q in runnable.queues]
    return runnable.copy(**worker_changes)


def _check_factory(spec: str, target: Any) -> None:
    """Raise ``TrioQueueError`` if ``target`` cannot be called with no arguments (a job
    handler named instead of its Queue, say)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # (a builtin without a signature: let the call say)
    needed = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if needed:
        what = "a class" if inspect.isclass(target) else "a function"
        raise TrioQueueError(
            f"{spec!r} is {what} taking arguments ({', '.join(needed)}), not a Queue: QUEUE must be a Queue, or a"
            " factory returning one (called with no arguments), e.g. queue = Queue(storage, handler=handle) in the"
            " module, named as module:queue (or a Worker: worker = Worker(queue, handler=handle), module:worker)"
        )


class MetricsServer:
    """Prometheus metrics of ``queues`` (instrumented at once, in a registry of their own)
    served over HTTP on ``host:port`` by :meth:`run` (``port`` 0: any free port)."""

    def __init__(self, queues: Sequence[Queue[Any, Any]], host: str, port: int, *, refresh_interval: float = 5.0) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise TrioQueueError(f"--metrics-port {install_hint('metrics', 'prometheus-client')}") from None

        from ..metrics import QueueMetrics

        if not 0 <= port <= 65535:
            raise ValidationError(f"metrics port must be in 0..65535, got {port}")
        self.host, self.port = host, port
        self.metrics = QueueMetrics(CollectorRegistry(), refresh_interval=refresh_interval)
        for q in queues:
            self.metrics.instrument(q)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (the queues must be running); the server is then shut down."""
        from prometheus_client import start_http_server

        try:
            server, thread = start_http_server(self.port, addr=self.host, registry=self.metrics.registry)
        except OSError as exc:
            raise TrioQueueError(f"cannot serve metrics on {self.host}:{self.port}: {exc}") from exc
        try:
            self.port = server.server_port
            logger.info("serving metrics on http://%s:%d/metrics", self.host, self.port)
            await self.metrics.run(task_status=task_status)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(server.shutdown)
                server.server_close()
                await trio.to_thread.run_sync(thread.join)


class SupervisorLink(Protocol):
    """What a worker started by ``trioqueue worker --processes N`` tells its supervisor
    and hears from it (:class:`trioqueue.cli._supervisor.ParentLink`)."""

    async def ready(self) -> None:
        """Tell the supervisor the worker serves its queues."""

    async def receive(self) -> tuple[str, str] | None:
        """The supervisor's next request, ``("stop" | "force", signal name)`` (a signal it
        forwards), or ``None`` once it is gone (it never leaves its workers running)."""


async def serve(
    queues: Sequence[Runnable], *, metrics: MetricsServer | None = None, link: SupervisorLink | None = None
) -> int:
    """Run ``queues`` (Workers, or Queues with a handler) until a signal stops them; the
    exit code (0 graceful, 130 forced).
    ``metrics``: serve their metrics while they run. ``link``: the worker's supervisor,
    told when the queues serve, whose requests count as signals; if it goes away, the
    worker forces its stop."""
    forced = False
    stopping = False
    with trio.open_signal_receiver(*_SIGNALS) as signals:
        async with trio.open_nursery() as outer:

            def stop(why: str, force: bool, running: trio.Nursery) -> None:
                """A stop request (``why``: what came); the first is graceful unless ``force``."""
                nonlocal forced, stopping
                if not force and not stopping:
                    logger.info(
                        "%s: stopping gracefully (running jobs finish, prefetched ones go back); send it again to force",
                        why,
                    )
                    for q in queues:
                        q.stop()
                elif not forced:
                    logger.warning("%s: forcing the stop (running jobs go back to the queue)", why)
                    forced = True
                    running.cancel_scope.cancel()
                stopping = True

            async def watch(running: trio.Nursery) -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    stop(f"received {name} again" if stopping else f"received {name}", stopping, running)

            async def follow(link: SupervisorLink, running: trio.Nursery) -> None:
                while (request := await link.receive()) is not None:
                    what, name = request
                    stop(f"received {name} from the supervisor", what == "force" or stopping, running)
                stop("the supervisor is gone", True, running)

            async with trio.open_nursery() as running:
                for r in queues:
                    await running.start(r.run)
                    for q in queues_of([r]):
                        logger.info(
                            "worker %s serving queue %r on %r (concurrency %d)",
                            r.worker_id, q.name, q.storage, r.concurrency,
                        )
                if metrics is not None:
                    await outer.start(metrics.run)  # ends with the queues (outer is cancelled)
                outer.start_soon(watch, running)
                if link is not None:
                    outer.start_soon(follow, link, running)
                    await link.ready()
            outer.cancel_scope.cancel()
    logger.info("worker stopped%s", " (forced)" if forced else "")
    return 130 if forced else 0


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the record's extras."""

    _STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """Log to stderr at ``level``, as text or one JSON object a line."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
