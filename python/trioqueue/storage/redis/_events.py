"""RedisStorage's event subscriptions (:class:`RedisEvents`, a part the storage builds).

The scripts publish a queue's events on ``{prefix:queue}:events`` and the notice kinds
(``NOTICE_KINDS``: terminal outcomes, cancel requests, fenced settlements...) also on
``{prefix:queue}:notices``, where a subscriber asking for notice kinds only listens (so
a waiter or a worker never decodes ``enqueued`` events). Each :meth:`subscribe` context
has one subscription of the transport, whose messages a callback on the Trio thread
forwards into a memory channel; a watch task emits ``resync`` after a reconnect.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

import trio

from ..._core import decode_events as _decode_events
from ..._drivers.resp import Subscription
from .._base import NOTICE_KINDS, StorageEvent, select_events, wanted_kinds
from ._runner import RedisSettings, ScriptRunner, ms

__all__ = ["RedisEvents", "decode_events"]

_RESYNC = StorageEvent("resync", "")
# How long an events subscriber's listening key outlives its last refresh, in watch ticks
# (10 s at the default 0.5 s tick): the scripts skip the events channel once it is gone.
_LISTEN_TICKS = 20


def decode_events(payload: bytes) -> list[StorageEvent]:
    """Inverse of the scripts' event encoding (six ``<len>:<bytes>`` or ``-`` fields each);
    the parsing is the Rust core's (``benches/bench_core.py`` measures it against Python).
    Raises ``ValueError`` on a malformed message."""
    return [StorageEvent(*fields) for fields in _decode_events(payload)]


class _Sub:
    __slots__ = ("send", "fault")

    def __init__(self, send: trio.MemorySendChannel[list[StorageEvent]]) -> None:
        self.send = send
        self.fault = False

    def deliver(self, events: list[StorageEvent]) -> None:
        try:
            self.send.send_nowait(events)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


class RedisEvents:
    """The event subscriptions of :class:`~trioqueue.storage.RedisStorage`: each on the
    runner's transport, watched every ``settings.watch_interval``."""

    def __init__(self, runner: ScriptRunner, settings: RedisSettings) -> None:
        self._runner = runner
        self._settings = settings
        self._subs: set[_Sub] = set()

    def fault(self) -> None:
        """The transport saw a fault: every subscription resyncs once it is back."""
        for sub in self._subs:
            sub.fault = True

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        sub = _Sub(send)
        wanted = wanted_kinds(kinds)
        # Route by need: the notice kinds have a channel of their own (the scripts publish
        # them on both), so a subscriber wanting only those never receives the rest.
        notices_only = wanted is not None and wanted <= NOTICE_KINDS
        channel = self._runner.key(queue, "notices" if notices_only else "events")
        if wanted is not None and wanted == NOTICE_KINDS:
            wanted = None  # the channel carries exactly those: nothing to filter

        def on_message(payload: bytes) -> None:
            try:
                events = decode_events(payload)
            except (ValueError, UnicodeDecodeError):
                events = [_RESYNC]
            if wanted is not None:
                events = select_events(events, wanted)
                if not events:
                    return
            sub.deliver(events)

        # The scripts publish on the events channel only while its listening key lives.
        listening = None if notices_only else self._runner.key(queue, "listening")
        subscription = await self._runner.transport.subscribe(channel, on_message)
        self._subs.add(sub)
        try:
            if listening is not None:
                await self._listen(listening)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscription.run)
                nursery.start_soon(self._watch, subscription, sub, listening)
                try:
                    yield receive
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._subs.discard(sub)
            send.close()
            receive.close()
            await subscription.aclose()

    async def _listen(self, key: str) -> bool:
        """Set (or refresh) a listening key; whether it was there already."""
        ttl = _LISTEN_TICKS * self._settings.watch_interval
        return await self._runner.transport.command(["SET", key, "1", "PX", str(ms(ttl)), "GET"]) is not None

    async def _watch(self, subscription: Subscription, sub: _Sub, listening: str | None) -> None:
        """Emit ``resync`` once the subscriber connection is back after a reconnect (its
        server-side id changed), after any fault seen by this storage's commands, or when
        the channel's ``listening`` key (refreshed here every tick) had gone: the scripts
        published nothing on the channel while it was missing (expired after a stall,
        evicted, flushed)."""
        conn_id = await subscription.connection_id()
        while True:
            await trio.sleep(self._settings.watch_interval)
            now_id = await subscription.connection_id()
            if now_id is None:
                sub.fault = True
                continue
            gap = False
            if listening is not None:
                try:
                    gap = not await self._listen(listening)
                except Exception:  # noqa: BLE001 - a fault: resync once it is back
                    sub.fault = True
                    continue
            if gap and not sub.fault and now_id == conn_id:
                sub.deliver([_RESYNC])
            elif now_id != conn_id or sub.fault:
                try:
                    await subscription.wait_subscribed()
                except Exception:  # noqa: BLE001 - not yet: try again next tick
                    sub.fault = True
                    continue
                conn_id = now_id
                sub.fault = False
                sub.deliver([_RESYNC])
