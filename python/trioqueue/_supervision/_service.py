"""``async with`` for a service: an object with ``run(task_status=...)`` (runs until
stopped) and ``stop()`` (asks it to stop gracefully), such as a Queue or a Worker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ._execution import only_cancelled

__all__ = ["ServiceContext", "sole_interrupt"]


class ServiceContext:
    """Runs ``run`` in a nursery of its own from :meth:`enter` to :meth:`exit`: a body that
    ends normally stops it gracefully (``stop``), one that raises cancels it (a forced
    stop), and the body's exception propagates as it is, not in an ExceptionGroup."""

    def __init__(self, run: Callable[..., Awaitable[None]], stop: Callable[[], None]) -> None:
        self._run = run
        self._stop = stop
        self._cm: Any = None
        self._nursery: trio.Nursery | None = None

    async def enter(self) -> None:
        cm = trio.open_nursery()
        nursery = await cm.__aenter__()
        try:
            await nursery.start(self._run)
        except BaseException:
            # ``run`` failed before it started: nothing runs in the nursery; close it
            # without wrapping the error in an ExceptionGroup.
            await cm.__aexit__(None, None, None)
            raise
        self._cm, self._nursery = cm, nursery

    async def exit(self, exc: BaseException | None) -> None:
        cm, nursery, self._cm, self._nursery = self._cm, self._nursery, None, None
        if exc is None:
            self._stop()  # graceful
        elif nursery is not None and not isinstance(exc, trio.Cancelled):
            nursery.cancel_scope.cancel()  # the body failed: forced stop, jobs go back
        await cm.__aexit__(None, None, None)


def sole_interrupt(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The ``KeyboardInterrupt``/``SystemExit`` a group carries, when it carries nothing
    else but cancellations: it is raised bare, as the interpreter expects."""
    interrupts, rest = group.split((KeyboardInterrupt, SystemExit))
    if interrupts is None or (rest is not None and not only_cancelled(rest)):
        return None
    found: BaseException = interrupts
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found
