"""``trioqueue dashboard``: its arguments and its command (the web app lives in
``trioqueue.dashboard``, imported only when the command runs: it needs the ``dashboard``
extra)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import trio

__all__ = ["add_dashboard_command", "dashboard_command"]


def add_dashboard_command(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add the ``dashboard`` sub-command to the ``trioqueue`` parser's subparsers."""
    dash = sub.add_parser(
        "dashboard",
        help="serve the web dashboard of a storage's queues",
        description="Serve the web dashboard (Hypercorn on Trio): queues, jobs, workers, schedules, "
        "live counts, and actions. Binds 127.0.0.1 unless told otherwise; any other address needs "
        "--auth-token. SIGINT/SIGTERM stops it.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    from ._run import storage_url

    dash.add_argument("--storage", type=storage_url, required=True, help="storage URL (redis://..., file:///path, ...)")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind")
    dash.add_argument("--port", type=int, default=8181, help="port to bind (0: any free port)")
    dash.add_argument(
        "--auth-token",
        default=None,
        help="token required from every client (header 'Authorization: Bearer T' or the login form); "
        "$TRIOQUEUE_DASHBOARD_TOKEN is used when not given",
    )
    dash.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    dash.add_argument(
        "--name", action="append", default=None, help="show only this queue (repeatable; default: all queues)"
    )
    dash.add_argument(
        "--heartbeat-ttl",
        type=float,
        default=30.0,
        help="the workers' visibility_timeout (their heartbeat's lifetime), to show heartbeat ages",
    )
    dash.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper, help="log level"
    )
    dash.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")


def dashboard_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``trioqueue dashboard`` until SIGINT/SIGTERM; the exit code."""
    from ._run import EXIT_ERROR, EXIT_USAGE, run_command
    from .._model._errors import ValidationError, install_hint
    from ._worker import configure_logging
    from ..storage import from_url

    try:
        from ..dashboard import Dashboard, run_dashboard
    except ImportError as exc:
        parser.exit(EXIT_ERROR, f"trioqueue dashboard: error: the dashboard {install_hint('dashboard', 'Hypercorn and Jinja2')} ({exc})\n")
    configure_logging(args.log_level, "text")
    try:
        dashboard = Dashboard(
            from_url(args.storage),
            host=args.host,
            port=args.port,
            auth_token=args.auth_token or os.environ.get("TRIOQUEUE_DASHBOARD_TOKEN") or None,
            read_only=args.read_only,
            names=args.name,
            heartbeat_ttl=args.heartbeat_ttl,
        )
    except ValidationError as exc:
        parser.exit(EXIT_USAGE, f"trioqueue dashboard: error: {exc}\n")
    return run_command(lambda: trio.run(run_dashboard, dashboard), debug=args.debug)
