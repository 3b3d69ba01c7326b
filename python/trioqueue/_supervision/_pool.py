"""Sync handlers run in a pool of worker processes (``Queue(executor="process")``),
through trio-parallel.

What crosses between the worker and a pool process: the handler and the queue's payload
and result serdes cross once, when the pool process starts (trio-parallel's ``init``);
each attempt sends the job's fields and its payload as the bytes the storage holds. The
pool process decodes them with the payload serde, calls the handler, and sends back its
result encoded by the result serde: bytes the worker stores as they are (no payload or
result needs to be picklable, only the handler and the serdes). An exception the handler
raises crosses pickled, with its traceback (trio-parallel restores it with tblib), so
:class:`Retry`, :class:`UnrecoverableError`, :class:`RateLimited` and ``retry_if`` work as
in a thread; one that cannot cross (unpicklable) comes back as a
:class:`HandlerProcessError` carrying its type name, message and traceback text, which the
job stores as they were.

Cancelling an attempt (``job_timeout``, ``queue.cancel(id)``, a lost lease, a forced stop)
kills its pool process (SIGKILL: ``kill_on_cancel``); the next attempt starts a new one.
A pool process also stops a handler by its lease deadline on its own, without its
worker's help (a worker frozen by SIGSTOP, a long GC pause or a debugger can neither
renew the lease nor cancel the handler, and the job may run elsewhere meanwhile): the
worker shares the claim's deadline with it (:class:`LeaseDeadline`, a small file holding
it on the machine's monotonic clock, rewritten by every renewal), and a thread of the pool
process ends the process once the deadline passes (the worker's own lease watch gives the
claim up ``lease_margin`` earlier, so a live worker always comes first).
Each running queue has its own pool (a trio-parallel worker context), closed when the
queue stops. A pool process whose worker died (``kill -9``) notices within a quarter of a
second and exits: its parent is checked by a thread (``PR_SET_PDEATHSIG`` would fire when
the *thread* that started the process exits, and trio-parallel starts them from Trio's
short-lived worker threads).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, NoReturn

import trio

from .._model._errors import TrioQueueError, ValidationError, install_hint
from .._model._outcomes import ResultEncodeError
from .._model._serde import Serde, error_data
from .._model._types import Job, JobError
from ._leases import Leases

__all__ = [
    "EXECUTORS",
    "Encoded",
    "HandlerProcessError",
    "LeaseDeadline",
    "ProcessJob",
    "ProcessPool",
    "check_executor",
    "check_process_handler",
]

logger = logging.getLogger("trioqueue")

EXECUTORS = ("thread", "process")
GRACE_PERIOD = 5.0  # seconds an idle pool process has to exit when its queue stops (then killed)
PARENT_CHECK_INTERVAL = 0.25  # seconds between a pool process's checks of its parent
LEASE_EXIT = 75  # the exit status of a pool process that stopped a handler at its lease deadline
_DEADLINE = struct.Struct("d")


def check_executor(executor: Any, processes: Any) -> int | None:
    """``executor`` and ``processes`` as given to a Queue: the number of pool processes
    (``None`` for ``"thread"``, or for ``"process"`` when it follows ``concurrency``).
    ``ValidationError`` naming the problem; ``TrioQueueError`` when trio-parallel is
    missing."""
    if executor not in EXECUTORS:
        raise ValidationError(f"executor must be 'thread' or 'process', got {executor!r}")
    if executor == "thread":
        if processes is not None:
            raise ValidationError(f"processes applies to executor='process' only, got processes={processes!r}")
        return None
    try:
        import trio_parallel  # noqa: F401
    except ImportError:
        raise TrioQueueError(f"executor='process' {install_hint('process', 'trio-parallel')}") from None
    if processes is None:
        return None
    if isinstance(processes, bool) or not isinstance(processes, int):
        raise ValidationError(f"processes must be an int, got {type(processes).__name__}")
    if not 1 <= processes <= 1024:
        raise ValidationError(f"processes must be in 1..1024, got {processes}")
    return processes


def check_process_handler(handler: Any, is_async: bool, payload_serde: Serde, result_serde: Serde) -> None:
    """A handler (and serdes) that can run in a pool process: sync and picklable (a
    module-level function: it crosses by reference), or ``ValidationError`` saying why."""
    if is_async:
        raise ValidationError(
            f"executor='process' runs sync handlers only; {_name(handler)} is async (use executor='thread' "
            "or make it a plain function)"
        )
    for what, value in (("handler", handler), ("payload_serde", payload_serde), ("result_serde", result_serde)):
        try:
            pickle.loads(pickle.dumps(value))
        except Exception as exc:
            hint = " (a module-level function)" if what == "handler" else ""
            raise ValidationError(
                f"executor='process' needs a picklable {what}{hint}; {_name(value)} is not: {exc}"
            ) from exc


def _name(value: Any) -> str:
    return repr(getattr(value, "__qualname__", None) or type(value).__name__)


class Encoded:
    """A result the pool process already encoded with the result serde."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class HandlerProcessError(TrioQueueError):
    """An exception a handler raised in a pool process that could not be pickled back:
    ``error`` is what the job stores (its type name, message and traceback)."""

    def __init__(self, error: JobError) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (HandlerProcessError, (self.error,))


class ProcessJob(Job[Any]):
    """The :class:`Job` a handler in a pool process receives: no progress reports, no
    steps and no sleeps there (:meth:`report_progress`, :meth:`step`, :meth:`sleep` and
    :meth:`sleep_until` raise at once) and no lease
    estimate (``lease_deadline`` is ``None``)."""

    __slots__ = ()

    def report_progress(self, value: Any) -> NoReturn:
        raise TrioQueueError(
            f"report_progress for job {self.id!r}: not available in a handler running in a process pool "
            "(executor='process'); use an async or a thread handler to report progress"
        )

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> NoReturn:
        # (a plain call: a sync handler calling it unawaited hears of it at once)
        raise TrioQueueError(
            f"step {name!r} of job {self.id!r}: not available in a handler running in a process pool "
            "(executor='process'); use an async or a thread handler for a job with steps"
        )

    def sleep(self, name: str, seconds: float) -> NoReturn:
        raise TrioQueueError(
            f"sleep {name!r} of job {self.id!r}: not available in a handler running in a process pool "
            "(executor='process'); use an async or a thread handler for a job that sleeps"
        )

    def sleep_until(self, name: str, when: Any) -> NoReturn:
        raise TrioQueueError(
            f"sleep_until {name!r} of job {self.id!r}: not available in a handler running in a process pool "
            "(executor='process'); use an async or a thread handler for a job that sleeps"
        )

    def wait_for_signal(self, name: str, timeout: float | None = None) -> NoReturn:
        raise TrioQueueError(
            f"wait_for_signal {name!r} of job {self.id!r}: not available in a handler running in a process pool "
            "(executor='process'); use an async handler to wait for signals"
        )


# -- inside a pool process ------------------------------------------------------------

_installed: tuple[Callable[[Job[Any]], Any], Serde, Serde] | None = None


class _LeaseWatch:
    """A pool process's watch of the running attempt's lease deadline (a thread): the
    process exits (:data:`LEASE_EXIT`) once the deadline in the attempt's
    :class:`LeaseDeadline` file has passed; renewals rewrite it, and it is read again
    whenever the deadline it knew comes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fd: int | None = None

    def begin(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        with self._cond:
            self._fd = fd
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            fd, self._fd = self._fd, None
            self._cond.notify()
        if fd is not None:
            os.close(fd)

    def run(self) -> None:
        with self._cond:
            while True:
                if self._fd is None:
                    self._cond.wait()
                    continue
                try:
                    (deadline,) = _DEADLINE.unpack(os.pread(self._fd, _DEADLINE.size, 0))
                except (OSError, struct.error):
                    deadline = float("inf")  # unreadable: left to the worker
                left = deadline - time.monotonic()
                if left <= 0:
                    os._exit(LEASE_EXIT)  # its lease ran out: the job may run elsewhere now
                self._cond.wait(min(left, 3600.0))


_lease_watch: _LeaseWatch | None = None


def enter_pool_process(handler: Callable[[Job[Any]], Any], payload_serde: Serde, result_serde: Serde, parent: int) -> None:
    """trio-parallel's ``init`` of a pool process: keep the queue's handler and serdes,
    exit when ``parent`` (the worker) is gone, and watch the running attempt's lease."""
    global _installed, _lease_watch
    _installed = (handler, payload_serde, result_serde)
    threading.Thread(target=_watch_parent, args=(parent,), name="trioqueue-parent-check", daemon=True).start()
    _lease_watch = _LeaseWatch()
    threading.Thread(target=_lease_watch.run, name="trioqueue-lease-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_INTERVAL)
    os._exit(1)  # the worker is gone: no one will take this attempt's outcome


def run_job(fields: tuple[str, int, int, float, str, str | None], payload: bytes, lease: str | None = None) -> bytes:
    """One attempt, in a pool process: the result encoded by the result serde.
    ``lease``: the path of the attempt's :class:`LeaseDeadline` (``None``: not tracked)."""
    if _installed is None:
        raise TrioQueueError("this pool process was not set up by trioqueue")
    watch = _lease_watch if lease is not None else None
    if watch is not None and lease is not None:
        watch.begin(lease)
    try:
        return _run_job(_installed, fields, payload)
    finally:
        if watch is not None:
            watch.end()


def _run_job(
    installed: tuple[Callable[[Job[Any]], Any], Serde, Serde], fields: tuple[str, int, int, float, str, str | None], payload: bytes
) -> bytes:
    handler, payload_serde, result_serde = installed
    jid, attempts, max_attempts, created_at, worker_id, correlation_id = fields
    job = ProcessJob(jid, payload_serde.loads(payload), attempts, max_attempts, created_at, worker_id, correlation_id)
    try:
        result = handler(job)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(f"handler {_name(handler)} returned an awaitable: a process handler must be sync")
        what = f"result of job {jid!r} (a {type(result).__qualname__})"
        try:
            data = result_serde.dumps(result)
        except Exception as exc:  # the message says it all (an unpicklable cause would not cross)
            raise ResultEncodeError(f"{what} cannot be encoded by {type(result_serde).__name__}: {exc}") from None
        if not isinstance(data, bytes):
            raise ResultEncodeError(f"{what}: {type(result_serde).__name__}.dumps returned {type(data).__name__}, not bytes")
    except Exception as exc:
        failure = exc
    else:
        return data
    raise _portable(failure)  # (outside the except block: not chained to itself)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it and the exceptions chained to it survive pickling, else a
    :class:`HandlerProcessError` with its text (the chain included)."""
    seen: set[int] = set()
    chained: BaseException | None = exc
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        try:
            pickle.loads(pickle.dumps(chained))
        except Exception:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return HandlerProcessError(JobError(type(exc).__qualname__, str(exc), text, error_data(exc)))
        chained = chained.__cause__ or chained.__context__
    return exc


# -- in the worker ----------------------------------------------------------------------


class LeaseDeadline:
    """A claim's lease deadline (the worker's estimate, on :func:`time.monotonic`, which
    is the machine's: the pool process reads the same clock) shared with the pool
    process running its handler: a small temporary file, rewritten by :meth:`set` (each
    renewal), removed by :meth:`close`."""

    __slots__ = ("fd", "path")

    def __init__(self, deadline: float) -> None:
        self.fd, self.path = tempfile.mkstemp(prefix="trioqueue-lease-")
        self.set(deadline)

    def set(self, deadline: float) -> None:
        os.pwrite(self.fd, _DEADLINE.pack(deadline), 0)  # (8 bytes at offset 0: read whole)

    def close(self) -> None:
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass


class ProcessPool:
    """The pool of a running queue: a trio-parallel worker context (its processes start
    on demand, one per attempt running at once, at most ``processes``) open while the
    queue runs (:meth:`open`)."""

    def __init__(self, processes: int, handler: Callable[[Job[Any]], Any], payload_serde: Serde, result_serde: Serde) -> None:
        self.processes = processes
        self._init = partial(enter_pool_process, handler, payload_serde, result_serde)
        self._context: Any = None
        self._limiter: trio.CapacityLimiter | None = None

    @asynccontextmanager
    async def open(self) -> AsyncIterator[ProcessPool]:
        """Open the pool; on exit (a cancelled run included) its running attempts are
        killed and its idle processes stopped (killed after :data:`GRACE_PERIOD`)."""
        import trio_parallel

        self._limiter = trio.CapacityLimiter(self.processes)
        manager = trio_parallel.open_worker_context(init=partial(self._init, os.getpid()), grace_period=GRACE_PERIOD)
        self._context = await manager.__aenter__()
        try:
            yield self
        finally:
            self._context = None
            try:
                await manager.__aexit__(None, None, None)  # shielded by trio-parallel
            except trio_parallel.BrokenWorkerError as exc:
                logger.warning("process pool closed uncleanly: %s", exc)

    async def run(self, job: Job[Any], payload: bytes, leases: Leases | None = None, token: str | None = None) -> Encoded:
        """Run one attempt of ``job`` (its payload as stored) in a pool process; its
        result, encoded. A cancellation kills the process. ``leases`` and ``token``: the
        worker's lease estimates and the attempt's claim, whose deadline (and renewals)
        the pool process gets: it stops the handler by then on its own."""
        import trio_parallel

        context = self._context
        if context is None:
            raise TrioQueueError("the process pool is not open (the queue is not running)")
        fields = (job.id, job.attempts, job.max_attempts, job.created_at, job.worker_id, job.correlation_id)
        deadline = None if leases is None or token is None else leases.deadlines.get(token)
        if deadline is None:
            data = await context.run_sync(run_job, fields, payload, kill_on_cancel=True, limiter=self._limiter)
            return Encoded(data)
        assert leases is not None and token is not None
        shared = LeaseDeadline(deadline)
        leases.shared[token] = shared.set
        try:
            data = await context.run_sync(run_job, fields, payload, shared.path, kill_on_cancel=True, limiter=self._limiter)
        except trio_parallel.BrokenWorkerError as exc:
            if _DEADLINE.unpack(os.pread(shared.fd, _DEADLINE.size, 0))[0] <= time.monotonic():
                raise TrioQueueError(
                    f"job {job.id!r}: its pool process stopped the handler at the lease deadline (the lease was not"
                    " renewed in time: the worker was frozen or could not reach the storage)"
                ) from exc
            raise
        finally:
            leases.shared.pop(token, None)
            shared.close()
        return Encoded(data)
