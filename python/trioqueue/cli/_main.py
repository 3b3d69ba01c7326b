"""The ``trioqueue`` command line: its parser and the dispatch to each command (exit codes
and error reporting: :mod:`._run`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import trio

from ._run import EXIT_USAGE, Parser, positive_int, run_command, storage_url, until_interrupted

__all__ = ["main"]

class _Version(argparse.Action):
    """``--version``: ``trioqueue X.Y.Z`` (``trioqueue.__version__``), looked up only when
    asked for (argparse's own version action needs the string when the parser is built)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        from .._model._version import package_version

        print(f"trioqueue {package_version()}")
        parser.exit()


def _parser() -> Parser:
    parser = Parser(
        prog="trioqueue",
        description="trioqueue command line",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    worker = sub.add_parser(
        "worker",
        help="run the Workers (or Queues) of an application until SIGINT/SIGTERM",
        description="Import each QUEUE (module:attribute: a Worker, a Queue with a handler, or a factory "
        "returning one) and "
        "run it. The first SIGINT/SIGTERM stops gracefully (running jobs finish; exit 0), a second "
        "forces the stop (running jobs go back to their queue; exit 130). With --processes N, a "
        "supervisor runs N worker processes, restarts one that dies and forwards the signals.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    worker.add_argument(
        "queues", nargs="+", metavar="QUEUE", help="module:attribute of a Worker or a Queue, or of a factory returning one"
    )
    worker.add_argument("--storage", type=storage_url, default=None, help="storage URL replacing the Queues' own")
    worker.add_argument("--concurrency", type=positive_int, default=None, help="handlers at once, per queue")
    worker.add_argument("--name", default=None, help="queue name replacing the Queue's own (one QUEUE only)")
    worker.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="worker processes, run by a supervisor that restarts one that dies (1: this process serves)",
    )
    worker.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)  # a worker of --processes
    worker.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (job failures are logged at INFO)",
    )
    worker.add_argument("--log-format", default="text", choices=["text", "json"], help="json: one object a line")
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (0: any free port, logged; with --processes N, worker i "
        "serves on this port + i); needs trioqueue[metrics]",
    )
    worker.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server binds")
    worker.add_argument(
        "--metrics-refresh", type=float, default=5.0, help="seconds between reads of the queue gauges from the storage"
    )
    worker.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")
    demo = sub.add_parser(
        "demo", help="run a realistic workload and print a summary", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    demo.add_argument("--jobs", type=positive_int, default=5000, help="number of jobs")
    demo.add_argument("--concurrency", type=positive_int, default=50, help="handlers at once")
    demo.add_argument("--storage", choices=["memory", "file", "redis", "postgres"], default="file", help="the backend")
    demo.add_argument(
        "--location",
        type=storage_url,
        default=None,
        help="directory (file; default: a temporary one) or URL (redis; default: redis://127.0.0.1:6379/0; "
        "postgres: postgresql://user@host:port/dbname, required; the schema trioqueue_demo unless ?schema= says)",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")
    from ._bench import add_parser as add_bench

    add_bench(sub, positive_int)
    from ._admin import add_admin_commands
    from ._dashboard import add_dashboard_command

    add_admin_commands(sub, Parser)
    add_dashboard_command(sub, Parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trioqueue`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import demo_command

        if args.storage == "postgres" and not (args.location or "").lower().startswith(("postgresql://", "postgres://")):
            parser.exit(
                EXIT_USAGE,
                "trioqueue demo: error: --storage postgres needs --location postgresql://user@host:port/dbname"
                f"{'' if args.location is None else f', got {args.location!r}'} (see --help)\n",
            )
        return run_command(lambda: trio.run(until_interrupted, demo_command, args), debug=args.debug)
    if args.command == "bench":
        from ._bench import bench_command

        return run_command(lambda: trio.run(until_interrupted, bench_command, args), debug=args.debug)
    if args.command == "worker":
        if args.name is not None and len(args.queues) > 1:
            parser.exit(EXIT_USAGE, "trioqueue worker: error: --name applies to one QUEUE, got several (see --help)\n")
        if args.processes > 1 and sys.platform == "win32":
            parser.exit(EXIT_USAGE, "trioqueue worker: error: --processes needs a POSIX system (see --help)\n")
        if args.processes > 1 and args.metrics_port and args.metrics_port + args.processes - 1 > 65535:
            parser.exit(
                EXIT_USAGE, "trioqueue worker: error: --metrics-port + --processes goes past port 65535 (see --help)\n"
            )
        from ._worker import configure_logging

        configure_logging(args.log_level, args.log_format)
        if args.processes > 1 and not args.supervised:
            from ._supervisor import supervise, worker_commands

            return run_command(lambda: trio.run(supervise, worker_commands(args)), debug=args.debug)
        return run_command(lambda: trio.run(_worker_command, args), debug=args.debug)
    if args.command == "dashboard":
        from ._dashboard import dashboard_command

        return dashboard_command(args, parser)
    from ._admin import ADMIN_COMMANDS, admin_command

    if args.command in ADMIN_COMMANDS:
        return run_command(lambda: trio.run(admin_command, args), debug=args.debug)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects unknown ones


async def _worker_command(args: argparse.Namespace) -> int:
    from ._worker import Runnable, adapted, load_queue, queues_of, serve
    from ..storage import from_url

    sys.path.insert(0, "")  # import the application from the working directory, as python -m does
    queues: list[Runnable] = []
    for spec in args.queues:
        queue = await load_queue(spec)
        changes: dict[str, Any] = {}
        if args.storage is not None:
            changes["storage"] = from_url(args.storage)
        if args.concurrency is not None:
            changes["concurrency"] = args.concurrency
        if args.name is not None:
            changes["name"] = args.name
        queues.append(adapted(queue, changes))
    link = None
    if args.supervised:
        from ._supervisor import ParentLink

        link = ParentLink()
    if args.metrics_port is None:
        return await serve(queues, link=link)
    from ._worker import MetricsServer

    metrics = MetricsServer(queues_of(queues), args.metrics_host, args.metrics_port, refresh_interval=args.metrics_refresh)
    return await serve(queues, metrics=metrics, link=link)
