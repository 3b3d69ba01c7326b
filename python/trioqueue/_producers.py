"""Producers for code that does not run under Trio: :class:`SyncProducer` (blocking calls,
for WSGI apps, scripts and threads) and :class:`AsyncioProducer` (coroutines, for asyncio
apps such as FastAPI).

Both sit on one bridge: a background thread runs a Trio loop that owns a producer
:class:`~trioqueue.Queue` (no handler) on the storage. Each call is handed to that loop
(``TrioToken.run_sync_soon``) and runs there as a task of the bridge's nursery; its outcome
comes back through a :class:`concurrent.futures.Future`, which a blocking caller waits on
and an asyncio caller awaits (``asyncio.wrap_future``). So the storage formats, the
validation and the exceptions are exactly those of :class:`~trioqueue.Queue`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, InvalidStateError
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, Unpack

import trio

from ._model._errors import QueueStoppedError, TrioQueueError
from ._supervision._execution import only_cancelled
from ._model._options import EnqueueOptions
from ._model._types import CancelResult, EnqueueResult, JobStatus
from ._supervision._queue import Queue
from .storage._base import Storage

__all__ = ["AsyncioProducer", "SyncProducer"]

P = TypeVar("P")
R = TypeVar("R")

StorageSpec = Storage | str | os.PathLike[str]
"""A :class:`~trioqueue.Storage`, a storage URL (:func:`~trioqueue.storage.from_url`) or a
directory path (a FileStorage)."""


def _resolve(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless its caller gave up on it (cancelled it)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class _Bridge:
    """A producer Queue run by Trio in a background thread; thread-safe ``submit``."""

    def __init__(self, storage: StorageSpec, name: str | None, settings: dict[str, Any]) -> None:
        if isinstance(storage, str | os.PathLike):
            from .storage import from_url

            storage = from_url(os.fspath(storage))
        if settings.get("handler") is not None:
            raise TrioQueueError("a producer has no handler: run a worker (a Queue with a handler) under Trio")
        self.queue: Queue[Any, Any] = Queue(storage, name=name, **settings)
        self.name = self.queue.name
        self._lock = threading.Lock()
        self._state = "new"  # new -> open -> closed
        self._pid = os.getpid()
        self._token: trio.lowlevel.TrioToken | None = None
        self._calls: trio.Nursery | None = None
        self._closing: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._finished: Future[None] = Future()

    # -- lifecycle (any thread) ----------------------------------------------------------

    def start(self) -> Future[None]:
        """Start the thread; the future resolves once the storage is open (or with the
        error that prevented it)."""
        ready: Future[None] = Future()
        with self._lock:
            if self._state != "new":
                raise TrioQueueError(f"producer of queue {self.name!r} was already started")
            self._state = "starting"
            self._thread = threading.Thread(
                target=self._thread_main, args=(ready,), name=f"trioqueue-producer-{self.name}", daemon=True
            )
            self._thread.start()
        return ready

    def close(self) -> Future[None]:
        """Stop accepting calls, cancel those in flight, close the storage and end the
        thread; the future resolves once the thread's Trio run has returned. Idempotent."""
        with self._lock:
            state, self._state = self._state, "closed"
            if state in ("open", "starting") and self._token is not None and self._closing is not None:
                try:
                    self._token.run_sync_soon(self._closing.set)
                except trio.RunFinishedError:
                    pass
        if state == "new":
            _resolve(self._finished)
        return self._finished

    def join(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _thread_main(self, ready: Future[None]) -> None:
        try:
            trio.run(self._main, ready)
        except BaseException as exc:
            with self._lock:
                self._state = "closed"
            _resolve(ready, error=exc)
        finally:
            _resolve(ready, error=TrioQueueError(f"producer of queue {self.name!r} was closed while starting"))
            _resolve(self._finished)

    async def _main(self, ready: Future[None]) -> None:
        async with self.queue, trio.open_nursery() as calls:
            closing = trio.Event()
            with self._lock:
                self._token, self._calls, self._closing = trio.lowlevel.current_trio_token(), calls, closing
                if self._state == "closed":  # close() came while the storage was opening
                    closing.set()
                else:
                    self._state = "open"
            _resolve(ready)
            await closing.wait()
            calls.cancel_scope.cancel()

    # -- calls -------------------------------------------------------------------------

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``await queue.<method>(*args, **kwargs)`` on the bridge's loop; its outcome
        (result or the very exception) comes back in the returned future. Cancelling the
        future cancels the call."""
        future: Future[Any] = Future()
        with self._lock:
            if self._state != "open" or self._token is None:
                what = "is closed" if self._state == "closed" else "is not open yet (use it as a context manager)"
                raise TrioQueueError(f"producer of queue {self.name!r} {what}")
            if os.getpid() != self._pid:
                raise TrioQueueError(
                    f"producer of queue {self.name!r} was created in another process (before a fork): "
                    "create producers in the process that uses them"
                )
            self._token.run_sync_soon(self._spawn, future, method, args, kwargs)
        return future

    def _spawn(self, future: Future[Any], method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # On the Trio thread. Calls submitted before close() reach here before the close.
        assert self._calls is not None
        try:
            self._calls.start_soon(self._call, future, method, args, kwargs)
        except RuntimeError as exc:  # pragma: no cover - the nursery closed (cannot happen: see close)
            _resolve(future, error=TrioQueueError(f"producer of queue {self.name!r} is closed: {exc}"))

    async def _call(self, future: Future[Any], method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        token = self._token
        assert token is not None
        with trio.CancelScope() as scope:

            def cancelled_by_caller(f: Future[Any]) -> None:
                if f.cancelled():
                    try:
                        token.run_sync_soon(scope.cancel)
                    except trio.RunFinishedError:
                        pass

            future.add_done_callback(cancelled_by_caller)
            try:
                result = await getattr(self.queue, method)(*args, **kwargs)
            except BaseException as exc:
                if only_cancelled(exc):
                    _resolve(future, error=self._closed_error(method, args))
                    raise
                _resolve(future, error=exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                _resolve(future, result)

    def _closed_error(self, method: str, args: tuple[Any, ...]) -> TrioQueueError:
        if method == "enqueue_and_wait":
            return QueueStoppedError(self.name, args[0])
        return TrioQueueError(f"producer of queue {self.name!r} was closed while {method} was in flight")


def _ids(job_ids: Iterable[str]) -> list[str] | str:
    """``job_ids`` as a list, read in the caller's thread (a generator is not shared with
    the Trio thread); a string stays one, for :meth:`Queue.get_statuses` to refuse."""
    return job_ids if isinstance(job_ids, str) else list(job_ids)


class SyncProducer(Generic[P, R]):
    """Enqueue and look up jobs from synchronous code (WSGI apps, scripts, threads).

    ``SyncProducer("redis://host:6379", name="emails")`` (a storage URL, see
    :func:`~trioqueue.storage.from_url`, a directory path, or a :class:`~trioqueue.Storage`) opens the
    storage in a background thread running Trio, and every method blocks until that
    thread has done the call. ``settings`` are :class:`~trioqueue.Queue` settings for
    producers (``max_attempts``, ``result_ttl``, ``payload_serde``, ``result_serde``...).
    Thread-safe: any number of threads may call it at once. Errors are the same
    exceptions :class:`~trioqueue.Queue` raises. Call :meth:`close` (or use ``with``):
    calls still in flight then raise (``enqueue_and_wait``: :class:`QueueStoppedError`).
    Create it in the process that uses it (after a fork, not before).
    """

    def __init__(self, storage: StorageSpec, *, name: str | None = None, **settings: Any) -> None:
        self._bridge = _Bridge(storage, name, settings)
        self.name = self._bridge.name
        try:
            self._bridge.start().result()
        except BaseException:
            self._bridge.close()
            self._bridge.join()  # the thread is gone when the error reaches the caller
            raise

    @property
    def queue(self) -> Queue[P, R]:
        """The producer Queue the background thread runs (use it only from that thread)."""
        return self._bridge.queue

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        future = self._bridge.submit(method, *args, **kwargs)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: cancel the call too
            raise

    def enqueue(self, job_id: str, payload: P, **options: Unpack[EnqueueOptions]) -> EnqueueResult:
        """:meth:`Queue.enqueue`, blocking."""
        return self._call("enqueue", job_id, payload, **options)  # type: ignore[no-any-return]

    def enqueue_many(self, jobs: list[tuple[str, P]], **options: Unpack[EnqueueOptions]) -> list[EnqueueResult]:
        """:meth:`Queue.enqueue_many`, blocking."""
        return self._call("enqueue_many", list(jobs), **options)  # type: ignore[no-any-return]

    def enqueue_and_wait(
        self, job_id: str, payload: P, *, timeout: float = 30.0, **options: Unpack[EnqueueOptions]
    ) -> R:
        """:meth:`Queue.enqueue_and_wait`, blocking until the result (or ``timeout``)."""
        return self._call("enqueue_and_wait", job_id, payload, timeout=timeout, **options)  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> CancelResult:
        """:meth:`Queue.cancel`, blocking."""
        return self._call("cancel", job_id)  # type: ignore[no-any-return]

    def signal(self, job_id: str, name: str, payload: Any = None) -> str:
        """:meth:`Queue.signal`, blocking: ``"delivered"`` or ``"not_found"``."""
        return self._call("signal", job_id, name, payload)  # type: ignore[no-any-return]

    def get_status(self, job_id: str) -> JobStatus | None:
        """:meth:`Queue.get_status`, blocking."""
        return self._call("get_status", job_id)  # type: ignore[no-any-return]

    def get_statuses(self, job_ids: Iterable[str]) -> list[JobStatus | None]:
        """:meth:`Queue.get_statuses` (many jobs, one round trip), blocking."""
        return self._call("get_statuses", _ids(job_ids))  # type: ignore[no-any-return]

    def get_result(self, job_id: str) -> R:
        """:meth:`Queue.get_result`, blocking."""
        return self._call("get_result", job_id)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the storage and stop the background thread (idempotent)."""
        self._bridge.close().result()
        self._bridge.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncProducer {self.name!r} storage={self._bridge.queue.storage!r}>"


class AsyncioProducer(Generic[P, R]):
    """Enqueue and look up jobs from asyncio code (FastAPI, aiohttp...).

    ``async with AsyncioProducer("redis://host:6379", name="emails") as producer:`` —
    the same calls as :class:`SyncProducer`, as coroutines that never block the event
    loop: the work runs on a background thread running Trio. Cancelling a call (an asyncio
    timeout, a client that went away) cancels it there too. Errors are the same
    exceptions :class:`~trioqueue.Queue` raises.
    """

    def __init__(self, storage: StorageSpec, *, name: str | None = None, **settings: Any) -> None:
        self._bridge = _Bridge(storage, name, settings)
        self.name = self._bridge.name

    async def open(self) -> None:
        """Start the background thread and open the storage (``async with`` does it)."""
        import asyncio  # here, not at the top: importing trioqueue must not load asyncio

        try:
            await asyncio.wrap_future(self._bridge.start())
        except BaseException:
            self._bridge.close()
            await asyncio.to_thread(self._bridge.join)
            raise

    async def aclose(self) -> None:
        """Close the storage and stop the background thread (idempotent)."""
        import asyncio

        await asyncio.wrap_future(self._bridge.close())
        await asyncio.to_thread(self._bridge.join)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.wrap_future(self._bridge.submit(method, *args, **kwargs))

    async def enqueue(self, job_id: str, payload: P, **options: Unpack[EnqueueOptions]) -> EnqueueResult:
        """:meth:`Queue.enqueue`."""
        return await self._call("enqueue", job_id, payload, **options)  # type: ignore[no-any-return]

    async def enqueue_many(self, jobs: list[tuple[str, P]], **options: Unpack[EnqueueOptions]) -> list[EnqueueResult]:
        """:meth:`Queue.enqueue_many`."""
        return await self._call("enqueue_many", list(jobs), **options)  # type: ignore[no-any-return]

    async def enqueue_and_wait(
        self, job_id: str, payload: P, *, timeout: float = 30.0, **options: Unpack[EnqueueOptions]
    ) -> R:
        """:meth:`Queue.enqueue_and_wait`."""
        return await self._call("enqueue_and_wait", job_id, payload, timeout=timeout, **options)  # type: ignore[no-any-return]

    async def cancel(self, job_id: str) -> CancelResult:
        """:meth:`Queue.cancel`."""
        return await self._call("cancel", job_id)  # type: ignore[no-any-return]

    async def signal(self, job_id: str, name: str, payload: Any = None) -> str:
        """:meth:`Queue.signal`: ``"delivered"`` or ``"not_found"``."""
        return await self._call("signal", job_id, name, payload)  # type: ignore[no-any-return]

    async def get_status(self, job_id: str) -> JobStatus | None:
        """:meth:`Queue.get_status`."""
        return await self._call("get_status", job_id)  # type: ignore[no-any-return]

    async def get_statuses(self, job_ids: Iterable[str]) -> list[JobStatus | None]:
        """:meth:`Queue.get_statuses` (many jobs, one round trip)."""
        return await self._call("get_statuses", _ids(job_ids))  # type: ignore[no-any-return]

    async def get_result(self, job_id: str) -> R:
        """:meth:`Queue.get_result`."""
        return await self._call("get_result", job_id)  # type: ignore[no-any-return]

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncioProducer {self.name!r} storage={self._bridge.queue.storage!r}>"
