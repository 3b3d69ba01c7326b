"""The trioqueue web dashboard: ``trioqueue dashboard --storage URL``.

An ASGI app served by Hypercorn on Trio: queues with live counts and a throughput chart,
job lists and details, workers, schedules, and actions (retry, cancel, remove, purge,
pause, resume). Live updates come over server-sent events from one event subscription per
queue for the whole process. Needs the ``dashboard`` extra (Hypercorn, Jinja2)."""

from __future__ import annotations

from ._app import DashboardApp
from ._hub import Hub
from ._server import Dashboard, run_dashboard

__all__ = ["Dashboard", "DashboardApp", "Hub", "run_dashboard"]
