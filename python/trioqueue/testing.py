"""Fault injection for testing code built on trioqueue (and trioqueue itself).

:class:`FaultyStorage` wraps any :class:`~trioqueue.Storage` and, drawing from a seeded
RNG, delays, fails or cancels its calls — before the call reached the backend (nothing
happened) or after (it happened; the reply is lost) — and can drop events from its
subscriptions (announcing the loss with a ``resync``, as a real backend must). The same
seed and the same sequence of calls give the same faults; :attr:`FaultyStorage.log` says
which were injected, so a failing run can be replayed and explained.

Every storage method of the interface is wrapped generically (a method added to
:class:`~trioqueue.Storage` or to a capability later is covered without edits), except the
lifecycle (which is delegated untouched) and :meth:`~trioqueue.Storage.subscribe` (events
only).

A :class:`FaultyStorage` has exactly the capabilities of the storage it wraps
(``isinstance(FaultyStorage(PostgresStorage(...)), Transactions)`` holds, and
``isinstance(FaultyStorage(MemoryStorage()), Transactions)`` does not), each capability's
calls wrapped as the core's are; ``Transactions.transaction`` is delegated untouched. One
exception: :class:`~trioqueue.storage.NonBlockingStart` is withheld, because its
``start_nowait`` is a plain call that no fault can delay or cancel: a Queue on a
FaultyStorage counts every attempt with the faulted :meth:`~trioqueue.Storage.start`.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self, cast

import trio

from ._model._errors import StorageError, ValidationError
from .storage._base import FlowJob, NewJob, Storage, StorageEvent
from .storage._capabilities import CAPABILITIES, NonBlockingStart, Transactions, capabilities_of

__all__ = ["Fault", "FaultPlan", "FaultyStorage", "InjectedFault", "STORAGE_METHODS"]


class Fault(StrEnum):
    DELAY = "delay"  # the call is delayed (trio.sleep: virtual time under MockClock)
    FAIL_BEFORE = "fail_before"  # StorageError; the backend never saw the call
    FAIL_AFTER = "fail_after"  # the call completed, then StorageError: the reply is lost
    CANCEL_BEFORE = "cancel_before"  # the caller is cancelled before the call
    CANCEL_AFTER = "cancel_after"  # the call completed, then the caller is cancelled
    DROP_EVENTS = "drop_events"  # an event batch of a subscription is lost (resync instead)


def _calls_of(interface: type) -> tuple[str, ...]:
    """The storage calls ``interface`` declares itself: its public coroutine methods."""
    return tuple(
        sorted(
            name
            for name, fn in vars(interface).items()
            if not name.startswith("_")
            and inspect.iscoroutinefunction(fn)
            and name not in ("open", "aclose", "watchdog")  # lifecycle, not calls
        )
    )


# The storage calls that are wrapped: every public coroutine method of the core interface
# and of every capability (a wrapper has those of the capabilities its storage has), but
# NonBlockingStart's, which a wrapper never has.
_INTERFACES: tuple[type, ...] = (Storage, *(c for c in CAPABILITIES if c is not NonBlockingStart))
STORAGE_METHODS: tuple[str, ...] = tuple(sorted({name for i in _INTERFACES for name in _calls_of(i)}))


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Probabilities (per call) of each fault, and which methods may be faulted (all of
    :data:`STORAGE_METHODS` when ``methods`` is ``None``). Cancellation faults need a
    ``cancel_scope`` on the :class:`FaultyStorage` (the scope they cancel)."""

    delay: float = 0.0
    max_delay: float = 0.05
    fail_before: float = 0.0
    fail_after: float = 0.0
    cancel_before: float = 0.0
    cancel_after: float = 0.0
    drop_events: float = 0.0
    methods: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for name in ("delay", "fail_before", "fail_after", "cancel_before", "cancel_after", "drop_events"):
            p = getattr(self, name)
            if not (isinstance(p, int | float) and 0.0 <= p <= 1.0):
                raise ValidationError(f"FaultPlan.{name} must be a probability in [0, 1], got {p!r}")
        if self.methods is not None:
            unknown = set(self.methods) - set(STORAGE_METHODS)
            if unknown:
                raise ValidationError(f"FaultPlan.methods: not storage methods: {sorted(unknown)}")


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One injected fault: the call's number (0-based, over all calls), method, fault,
    and the job ids the call was about (when its arguments name some)."""

    call: int
    method: str
    fault: Fault
    job_ids: tuple[str, ...] = ()


def _job_ids(method: str, args: tuple[Any, ...]) -> tuple[str, ...]:
    """Best effort: the job ids a call's arguments name (for the log)."""
    ids: list[str] = []
    for a in args[1:]:
        if isinstance(a, str) and method in ("cancel", "get_job", "update_result_ttl"):
            ids.append(a)
            break
        if isinstance(a, NewJob):  # tick_schedule's job
            ids.append(a.id)
        elif isinstance(a, list | tuple) and a and isinstance(a[0], FlowJob):  # a tree's jobs
            ids.extend(fj.job.id for fj in a)
        elif isinstance(a, list | tuple):
            for item in a:
                job_id = getattr(item, "id", None)
                if isinstance(job_id, str):
                    ids.append(job_id)
                elif isinstance(item, str) and method in ("release", "get_jobs"):
                    ids.append(item)
                elif isinstance(item, tuple) and item and isinstance(item[0], str):
                    ids.append(item[0])
    return tuple(ids)


class _FaultyBase(Storage):
    """See :class:`FaultyStorage`; the interface's methods are added by ``_delegate``."""

    def __init__(self, inner: Storage, plan: FaultPlan, *, seed: int) -> None:
        super().__init__()
        if not isinstance(inner, Storage):
            raise ValidationError(f"inner must be a Storage, got {type(inner).__name__}")
        self.inner = inner
        self.plan = plan
        self.rng = random.Random(seed)
        self.log: list[InjectedFault] = []
        self.calls = 0
        self.enabled = True  # False: a transparent wrapper
        self.dead = False  # True: every call fails before reaching the backend (a lost server)
        self.cancel_scope: trio.CancelScope | None = None  # what cancellation faults cancel

    def __repr__(self) -> str:
        return f"FaultyStorage({self.inner!r}, calls={self.calls}, faults={len(self.log)})"

    async def _connect(self) -> None:
        await self.inner.open()

    async def _disconnect(self) -> None:
        await self.inner.aclose()

    async def watchdog(self) -> None:
        await self.inner.watchdog()

    def _draw(self, method: str, faults: Iterable[tuple[Fault, float]]) -> Fault | None:
        for fault, p in faults:
            if p > 0.0 and self.rng.random() < p:
                return fault
        return None

    async def _cancel_caller(self) -> None:
        assert self.cancel_scope is not None
        self.cancel_scope.cancel()
        await trio.lowlevel.checkpoint()  # raises Cancelled up to that scope

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        n = self.calls
        self.calls += 1
        fn: Callable[..., Any] = getattr(self.inner, method)
        if self.dead:
            self.log.append(InjectedFault(n, method, Fault.FAIL_BEFORE, _job_ids(method, args)))
            await trio.lowlevel.checkpoint()
            raise StorageError(f"injected fault: storage unreachable ({method})")
        plan = self.plan
        if not self.enabled or (plan.methods is not None and method not in plan.methods):
            return await fn(*args, **kwargs)
        can_cancel = self.cancel_scope is not None
        before = self._draw(
            method,
            (
                (Fault.FAIL_BEFORE, plan.fail_before),
                (Fault.CANCEL_BEFORE, plan.cancel_before if can_cancel else 0.0),
                (Fault.DELAY, plan.delay),
            ),
        )
        after = self._draw(
            method,
            ((Fault.FAIL_AFTER, plan.fail_after), (Fault.CANCEL_AFTER, plan.cancel_after if can_cancel else 0.0)),
        )
        ids = _job_ids(method, args)
        if before is not None:
            self.log.append(InjectedFault(n, method, before, ids))
            if before is Fault.FAIL_BEFORE:
                await trio.lowlevel.checkpoint()
                raise StorageError(f"injected fault: {method} failed before reaching the storage")
            if before is Fault.CANCEL_BEFORE:
                await self._cancel_caller()
            if before is Fault.DELAY:
                await trio.sleep(self.rng.uniform(0.0, plan.max_delay))
        result = await fn(*args, **kwargs)
        if after is not None:
            self.log.append(InjectedFault(n, method, after, ids))
            if after is Fault.FAIL_AFTER:
                raise StorageError(f"injected fault: the reply of {method} was lost")
            await self._cancel_caller()
        return result

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        async with self.inner.subscribe(queue, kinds) as inner, trio.open_nursery() as nursery:

            async def pump() -> None:
                async with send:
                    async for batch in inner:
                        if self.enabled and self.plan.drop_events and self.rng.random() < self.plan.drop_events:
                            ids = tuple(e.job_id for e in batch if e.job_id)
                            self.log.append(InjectedFault(-1, "subscribe", Fault.DROP_EVENTS, ids))
                            batch = [StorageEvent("resync", "")]
                        send.send_nowait(batch)

            nursery.start_soon(pump)
            try:
                yield receive
            finally:
                nursery.cancel_scope.cancel()

    def faults_on(self, job_id: str, method: str | None = None) -> list[InjectedFault]:
        """The injected faults of calls about ``job_id`` (of ``method`` only, if given)."""
        return [f for f in self.log if job_id in f.job_ids and (method is None or f.method == method)]


def _wrap(interface: type, name: str) -> Callable[..., Any]:
    async def method(self: _FaultyBase, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(interface, name).__doc__
    return method


class FaultyStorage(_FaultyBase):
    """A :class:`~trioqueue.Storage` that injects faults into the calls it passes to
    ``inner`` (see the module docstring). ``plan`` gives the probabilities, ``seed`` makes
    the run reproducible; set :attr:`cancel_scope` to enable cancellation faults, flip
    :attr:`enabled` off for a clean phase, or :attr:`dead` on to simulate a lost server.

    It has the capabilities of ``inner`` (but :class:`~trioqueue.storage.NonBlockingStart`):
    the object made is of a subclass of this class (or of the subclass of it being
    instantiated) that also derives from those capabilities."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        inner = args[0] if args else kwargs.get("inner")
        if isinstance(inner, Storage) and "_capabilities" not in cls.__dict__:
            caps = tuple(c for c in capabilities_of(inner) if c is not NonBlockingStart)
            return cast(Self, super().__new__(_with_capabilities(cls, caps)))
        return super().__new__(cls)

    def __init__(self, inner: Storage, plan: FaultPlan | None = None, *, seed: int = 0) -> None:
        super().__init__(inner, plan or FaultPlan(), seed=seed)


for _name in _calls_of(Storage):
    setattr(FaultyStorage, _name, _wrap(Storage, _name))
FaultyStorage.__abstractmethods__ = frozenset()


def _transaction(self: _FaultyBase) -> AbstractAsyncContextManager[object]:
    assert isinstance(self.inner, Transactions)
    return self.inner.transaction()


@functools.cache
def _faulty(capability: type[Storage]) -> type[Storage]:
    """The capability with its calls wrapped as :class:`FaultyStorage` wraps the core's."""
    namespace: dict[str, Any] = {name: _wrap(capability, name) for name in _calls_of(capability)}
    if capability is Transactions:
        namespace["transaction"] = _transaction
    namespace["__module__"] = __name__
    return type(f"Faulty{capability.__name__}", (capability,), namespace)


@functools.cache
def _with_capabilities(cls: type[FaultyStorage], caps: tuple[type[Storage], ...]) -> type[FaultyStorage]:
    """``cls`` that also has ``caps`` (each wrapped; ``cls``'s own methods come first)."""
    made = type(cls.__name__, (cls, *(_faulty(c) for c in caps)), {"_capabilities": caps})
    made.__qualname__, made.__module__ = cls.__qualname__, cls.__module__
    return made
