"""FileStorage, events: following the event log across rotations."""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

import trio

from .._base import (
    StorageEvent,
    select_events,
    wanted_kinds,
)
from ._inotify import Watch
from ._base import FileCore, FileSettings
from ._layout import (
    FileQueue,
    log_generation,
    parse_event,
)

__all__ = ["FileEvents"]


_LINE_HEAD = b'{"k":"'


def _unwanted(line: bytes, kinds: frozenset[str]) -> bool:
    """Whether a log line is a well-formed event of a kind the subscriber does not want,
    told without parsing it. A line holding two heads (a write torn by a crash, merged
    with the next one) is parsed (and becomes a ``resync``): ids and payloads are
    JSON-escaped or base64, so a head never occurs inside a well-formed line."""
    if not line.startswith(_LINE_HEAD) or line.count(_LINE_HEAD) != 1:
        return False
    end = line.find(b'"', 6)
    if end < 0:
        return False
    kind = line[6:end].decode("ascii", "replace")
    return kind not in kinds and kind != "_log"


class FileEvents:
    """The subscriptions of :class:`~trioqueue.storage.FileStorage`: each tails its queue's
    event log. A part built by the storage with the core it shares."""

    def __init__(self, core: FileCore, settings: FileSettings) -> None:
        self._core = core
        self._settings = settings

    @asynccontextmanager
    async def subscribe(
        self, queue: str, kinds: Collection[str] | None = None
    ) -> AsyncIterator[trio.MemoryReceiveChannel[list[StorageEvent]]]:
        q = self._core.q(queue)
        send, receive = trio.open_memory_channel[list[StorageEvent]](math.inf)
        watch = q.watch("events")
        fd = os.open(q.events, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        offset = os.fstat(fd).st_size
        gen = watch.gen
        await trio.lowlevel.checkpoint()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tail, q, watch, gen, fd, offset, send, wanted_kinds(kinds))
            try:
                yield receive
            finally:
                nursery.cancel_scope.cancel()
                receive.close()

    async def _tail(
        self,
        q: FileQueue,
        watch: Watch,
        gen: int,
        fd: int,
        offset: int,
        send: trio.MemorySendChannel[list[StorageEvent]],
        kinds: frozenset[str] | None = None,
    ) -> None:
        """Follow the event log across rotations without losing an event: when the path
        names a new file, the old one is read to its end *after* the rotation was seen (all
        writes to it happened before the rotation, under the lock), then the new one from
        its start. Only a reader that fell more than a whole file behind (the generation
        jumped) or a damaged line gets a ``resync``."""
        buf = b""
        log_gen = log_generation(fd)
        try:
            while True:
                await watch.wait(gen, self._settings.rescan_interval)
                gen = watch.gen
                batch: list[StorageEvent] = []
                while True:
                    data = os.pread(fd, 1 << 20, offset)
                    if data:
                        offset += len(data)
                        buf += data
                        end = buf.rfind(b"\n")
                        if end >= 0:
                            lines, buf = buf[: end + 1], buf[end + 1 :]
                            for line in lines.splitlines():
                                if kinds is not None and _unwanted(line, kinds):
                                    continue
                                ev = parse_event(line)
                                if ev is None:
                                    batch.append(StorageEvent("resync", ""))
                                elif ev.kind != "_log":
                                    batch.append(ev)
                        if len(data) == 1 << 20:
                            continue
                    fst = os.fstat(fd)
                    if fst.st_size < offset:  # truncated under us
                        batch.append(StorageEvent("resync", ""))
                        offset = 0
                        buf = b""
                        continue
                    try:
                        st = os.stat(q.events)
                    except FileNotFoundError:
                        break
                    if st.st_ino != fst.st_ino:
                        # Rotated. Finish the old file first: it may have grown since the
                        # last read (before the rotation we just saw).
                        while data := os.pread(fd, 1 << 20, offset):
                            offset += len(data)
                            buf += data
                        for line in buf.splitlines():
                            ev = parse_event(line)
                            if ev is not None and ev.kind != "_log":
                                batch.append(ev)
                        os.close(fd)
                        fd = os.open(q.events, os.O_RDONLY | os.O_CLOEXEC)
                        offset = 0
                        buf = b""
                        new_gen = log_generation(fd)
                        if new_gen != log_gen + 1:  # a whole file went by unread
                            batch.append(StorageEvent("resync", ""))
                        log_gen = new_gen
                        continue
                    break
                batch = select_events(batch, kinds)
                if batch:
                    try:
                        send.send_nowait(batch)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        return
        finally:
            os.close(fd)
            send.close()
