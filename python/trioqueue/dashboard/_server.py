"""Serving the dashboard: Hypercorn on Trio, a hub of queue subscriptions, signals."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from .._model import _validate as check
from .._model._errors import ValidationError
from ..storage._base import Storage
from ._app import DashboardApp
from ._hub import Hub
from ._security import check_bind

__all__ = ["Dashboard", "run_dashboard"]

logger = logging.getLogger("trioqueue.dashboard")


class Dashboard:
    """The web dashboard of a storage's queues, as a Trio service.

    ``urls = await nursery.start(dashboard.run)`` serves it (reporting the bound URLs,
    useful with ``port=0``); :meth:`stop` shuts it down gracefully (browser streams end),
    cancelling the nursery stops it at once. ``names`` restricts it to those queues (by
    default the storage's queues are discovered, and new ones every few seconds).
    ``heartbeat_ttl`` is the workers' ``visibility_timeout`` (their heartbeat's lifetime),
    used to show how long ago each heartbeat was.
    Refuses (``ValidationError``) a non-loopback ``host`` without ``auth_token``.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        host: str = "127.0.0.1",
        port: int = 8181,
        auth_token: str | None = None,
        read_only: bool = False,
        names: Sequence[str] | None = None,
        heartbeat_ttl: float = 30.0,
    ) -> None:
        check_bind(host, auth_token)
        heartbeat_ttl = check.seconds("heartbeat_ttl", heartbeat_ttl)
        if not 0 <= port <= 65535:
            raise ValidationError(f"port must be 0..65535, got {port}")
        self.host = host
        self.port = port
        self.hub = Hub(storage, names=names)
        self.app = DashboardApp(self.hub, auth_token=auth_token, read_only=read_only, heartbeat_ttl=heartbeat_ttl)
        self.urls: list[str] = []
        self._shutdown = trio.Event()

    def _config(self) -> Config:
        config = Config()
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        config.bind = [f"{host}:{self.port}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("trioqueue.dashboard.http")
        config.graceful_timeout = 3.0
        return config

    async def run(self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`stop` or cancellation."""
        self._shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.hub.run)

            async def serve_then_stop(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(self.app, self._config(), shutdown_trigger=self._shutdown.wait, task_status=task_status)  # type: ignore[arg-type]
                nursery.cancel_scope.cancel()  # the hub too

            self.urls = await nursery.start(serve_then_stop)
            logger.info("dashboard serving %s", ", ".join(self.urls))
            task_status.started(self.urls)

    def stop(self) -> None:
        """Shut down gracefully: close the browsers' event streams, then the server."""
        self.hub.stop()
        self._shutdown.set()


async def run_dashboard(dashboard: Dashboard) -> int:
    """Run until SIGINT/SIGTERM (graceful; a second one forces). The exit code."""
    forced = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal forced
                seen = 0
                async for signum in signals:
                    seen += 1
                    if seen == 1:
                        logger.info("received %s: stopping the dashboard", signal.Signals(signum).name)
                        dashboard.stop()
                    else:
                        forced = True
                        nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await dashboard.run()
            nursery.cancel_scope.cancel()  # stopped: end the watcher too
        logger.info("dashboard stopped%s", " (forced)" if forced else "")
    return 130 if forced else 0
