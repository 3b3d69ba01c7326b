"""The ``trioqueue`` command line: argument parsing, exit codes and error reporting.

Exit codes: 0 success, 1 a runtime error (one line on stderr), 2 a usage error (one line on
stderr), 130 interrupted by Ctrl-C (SIGINT). ``--debug`` prints the traceback as well.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import trio

from ._errors import TrioQueueError

__all__ = ["main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``prog: error: message``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parser() -> _Parser:
    parser = _Parser(prog="trioqueue", description="trioqueue command line")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="run a realistic workload and print a summary")
    demo.add_argument("--jobs", type=_positive_int, default=5000, help="number of jobs (default 5000)")
    demo.add_argument("--concurrency", type=_positive_int, default=50, help="handlers at once (default 50)")
    demo.add_argument("--storage", choices=["memory", "file", "redis"], default="file")
    demo.add_argument("--location", default=None, help="directory (file) or URL (redis)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")
    return parser


def _interrupted(exc: BaseException) -> bool:
    """A KeyboardInterrupt, or a group holding nothing else."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(e) for e in exc.exceptions)
    return False


def _describe(exc: BaseException) -> str:
    """One line for an error: the innermost single cause of a group, its type when the
    message alone would be unclear."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, TrioQueueError) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def run_command(body: Callable[[], int], *, debug: bool, stderr: Any = None) -> int:
    """Run a command's body, turning errors and Ctrl-C into one line and an exit code."""
    stderr = stderr or sys.stderr
    try:
        return body()
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        if debug:
            traceback.print_exception(exc, file=stderr)
        if _interrupted(exc):
            print("\ntrioqueue: interrupted (jobs not finished went back to their queue)", file=stderr)
            return EXIT_INTERRUPTED
        if not isinstance(exc, Exception) and not isinstance(exc, BaseExceptionGroup):
            raise
        print(f"trioqueue: error: {_describe(exc)}", file=stderr)
        return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trioqueue`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import demo_command

        return run_command(lambda: trio.run(demo_command, args), debug=args.debug)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects unknown ones
