"""What every ``trioqueue`` command shares: exit codes, the one-line usage errors of its
parser, and :func:`run_command`, which turns a command's errors and Ctrl-C into one line on
stderr and an exit code.

Exit codes: 0 success, 1 a runtime error (one line on stderr), 2 a usage error (one line on
stderr), 130 interrupted by Ctrl-C (SIGINT). ``--debug`` prints the traceback as well.
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from .._model._errors import TrioQueueError

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Parser",
    "positive_int",
    "run_command",
    "storage_url",
    "until_interrupted",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``prog: error: message``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def storage_url(text: str) -> str:
    """An argparse type: a storage URL :func:`~trioqueue.storage.from_url` accepts (a
    mistyped one is a usage error, before anything is created)."""
    from .._model._errors import ValidationError
    from ..storage._url import check_storage_url

    try:
        check_storage_url(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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


async def until_interrupted(command: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    """Run ``command(args)`` until it returns or a SIGINT comes. A SIGINT cancels it (a
    forced stop: what had not finished goes back to its queue), then is raised as
    :class:`KeyboardInterrupt` once every task has exited. Trio's own delivery raises
    KeyboardInterrupt wherever the code happens to be, which can cut a nursery's or a
    lock's exit in half (an early Ctrl-C of the demo ended in a TrioInternalError about
    one run in thirty)."""
    interrupted = False
    result = 0
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            result = await command(args)
            nursery.cancel_scope.cancel()
    if interrupted:
        raise KeyboardInterrupt
    return result
