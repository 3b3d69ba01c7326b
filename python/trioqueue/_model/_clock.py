"""The one clock of the supervision layer and of MemoryStorage.

Two readings, each what the standard library gives (:func:`time.time`,
:func:`time.monotonic`), except inside a Trio run whose clock is a
:class:`trio.testing.MockClock`: there both follow Trio's virtual clock
(:func:`trio.current_time`), so the timers that read the time and the sleeps that wait
for it agree, and a day of delays, retries, leases and cron ticks runs in the time the
work itself takes.

- :func:`now`: wall time, seconds since the epoch. Under a MockClock it is the wall
  time when the run first asked plus the virtual time elapsed since then: it advances
  exactly with virtual time.
- :func:`monotonic`: a monotonic clock for a worker's own estimates (lease deadlines,
  renewal ages). Under a MockClock it is :func:`trio.current_time`.

Outside a Trio run (a thread sharing a MemoryStorage, a ``SyncProducer``) both read the
real clocks. Whether a run's clock is a MockClock is checked once per run and kept in a
:class:`trio.lowlevel.RunVar`; after that a reading costs one RunVar lookup. Until a
process has seen a MockClock run at all, a reading is the standard library's call and
nothing more: what opens in a run (a storage, a Queue, a Worker) calls :func:`note_run`,
which notices a MockClock (the per-job paths of an application pay nothing for the
virtual clock its tests use).

FileStorage, RedisStorage and PostgresStorage keep real time: their deadlines are the
filesystem's and the server's.
"""

from __future__ import annotations

import sys
from time import monotonic as _monotonic
from time import time as _time

import trio
from trio.lowlevel import RunVar

__all__ = ["monotonic", "note_run", "now"]

# None: real time in this run; a float: this run's clock is a MockClock and the wall time
# is that number plus trio.current_time().
_EPOCH: RunVar[float | None] = RunVar("trioqueue_clock_epoch")


# Whether this process has run under a MockClock (set by note_run; never reset).
_virtual_seen = False


def _is_mock_clock(clock: object) -> bool:
    """Whether ``clock`` is a :class:`trio.testing.MockClock`, without importing
    ``trio.testing``: it imports pytest where pytest is installed, thousands of objects that
    every full collection of the garbage collector then walks (a process that never
    imported ``trio.testing`` has no MockClock)."""
    testing = sys.modules.get("trio.testing")
    return testing is not None and isinstance(clock, testing.MockClock)


def note_run() -> None:
    """Called where a storage, a Queue or a Worker starts in a Trio run: notices a
    :class:`~trio.testing.MockClock`, after which readings check the run's clock."""
    global _virtual_seen
    if not _virtual_seen and _is_mock_clock(trio.lowlevel.current_clock()):
        _virtual_seen = True


def _decide() -> float | None:
    """The first reading of a run: is its clock virtual? Kept for the rest of the run."""
    epoch = _time() - trio.current_time() if _is_mock_clock(trio.lowlevel.current_clock()) else None
    _EPOCH.set(epoch)
    return epoch


def _virtual_epoch() -> float | None:
    """This run's epoch under a MockClock; ``None`` for real time (or outside a run)."""
    if not _virtual_seen:
        return None
    try:
        return _EPOCH.get()
    except LookupError:
        return _decide()
    except RuntimeError:  # outside a Trio run
        return None


def now() -> float:
    """Wall time in seconds since the epoch: :func:`time.time`, or virtual under a
    :class:`trio.testing.MockClock` (see the module docstring)."""
    if not _virtual_seen:  # (_virtual_epoch's first test, inline: the per-job path)
        return _time()
    epoch = _virtual_epoch()
    return _time() if epoch is None else epoch + trio.current_time()


def monotonic() -> float:
    """Seconds on a monotonic clock: :func:`time.monotonic`, or :func:`trio.current_time`
    under a :class:`trio.testing.MockClock` (see the module docstring)."""
    if not _virtual_seen:
        return _monotonic()
    return _monotonic() if _virtual_epoch() is None else trio.current_time()
