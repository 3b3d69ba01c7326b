"""MemoryStorage's per-state index: counts, newest-first listing and purge by age.

Each state kind has an append-only log of ``(seq, record)`` entries (two parallel lists:
the sequence numbers in an ``array``, the records in a list, so that an entry allocates
no object for the garbage collector to walk); a record entering a state gets the next
sequence number and an entry at the end of that state's log, so each log is in the order
jobs entered the state. An entry is live while the record's ``iseq``
is still its ``seq`` (a record that moves on, or is forgotten, leaves a stale entry
behind); a log is compacted when its stale entries outnumber its live ones, so memory stays
proportional to the live jobs. Used with the storage's lock held.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from itertools import compress
from typing import Any, Protocol

from .._base import STATE_KINDS

__all__ = ["StateIndex"]

_SLACK = 1024  # stale entries tolerated before a log is compacted


class _Indexed(Protocol):
    iseq: int
    ts: int

    @property
    def kind(self) -> str: ...


class _Log:
    """One state's log: ``seqs[i]`` is the sequence number of the entry of ``recs[i]``."""

    __slots__ = ("seqs", "recs", "head", "spared")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.recs: list[Any] = []
        self.head = 0  # entries before it are stale or left alone by trim(): not looked at again
        self.spared = 0  # the live entries before the head (all left alone by trim())

    def __len__(self) -> int:
        return len(self.recs)


class StateIndex:
    """The per-state logs and live counts of one queue."""

    __slots__ = ("logs", "live", "seq")

    def __init__(self) -> None:
        self.logs: dict[str, _Log] = {k: _Log() for k in STATE_KINDS}
        self.live: dict[str, int] = dict.fromkeys(STATE_KINDS, 0)
        self.seq = 0

    def enter(self, rec: _Indexed, old: str | None, new: str) -> None:
        """``rec`` moves from state ``old`` (``None``: a new record) into ``new``."""
        if old is not None:
            if rec.iseq:
                self._left(old, rec.iseq)
            self.live[old] -= 1
            self._maybe_compact(old)
        self.seq += 1
        rec.iseq = self.seq
        self.live[new] += 1
        log = self.logs[new]
        log.seqs.append(self.seq)
        log.recs.append(rec)
        self._maybe_compact(new)

    def add(self, recs: list[Any], kind: str) -> None:
        """The new records ``recs`` enter state ``kind``, in order (a batch of
        :meth:`enter` with no old state)."""
        if not recs:
            return
        first = self.seq + 1
        seq = self.seq = self.seq + len(recs)
        for s, rec in zip(range(first, seq + 1), recs):
            rec.iseq = s
        log = self.logs[kind]
        log.seqs.extend(range(first, seq + 1))
        log.recs.extend(recs)
        self.live[kind] += len(recs)
        self._maybe_compact(kind)

    def move(self, recs: list[Any], old: str, new: str) -> None:
        """Each of ``recs`` moved from state ``old`` into ``new`` (a batch of
        :meth:`enter`, for records whose kinds the caller has already set)."""
        if not recs:
            return
        if self.logs[old].spared:
            for rec in recs:
                self._left(old, rec.iseq)
        first = self.seq + 1
        seq = self.seq = self.seq + len(recs)
        for s, rec in zip(range(first, seq + 1), recs):
            rec.iseq = s
        log = self.logs[new]
        log.seqs.extend(range(first, seq + 1))
        log.recs.extend(recs)
        n = len(recs)
        self.live[old] -= n
        self.live[new] += n
        self._maybe_compact(old)
        self._maybe_compact(new)

    def drop(self, rec: _Indexed) -> None:
        """``rec`` is forgotten (expired, purged, removed or replaced)."""
        if rec.iseq > 0:
            self._left(rec.kind, rec.iseq)
            rec.iseq = 0
            self.live[rec.kind] -= 1
            self._maybe_compact(rec.kind)

    def _left(self, kind: str, seq: int) -> None:
        """The live entry ``seq`` of ``kind``'s log goes stale: one spared entry fewer
        before the head if it is one of them."""
        log = self.logs[kind]
        if log.spared and (log.head >= len(log.seqs) or seq < log.seqs[log.head]):
            log.spared -= 1

    def _maybe_compact(self, kind: str) -> None:
        log = self.logs[kind]
        if len(log.recs) > 2 * self.live[kind] + _SLACK:
            keep = [r.iseq == s for s, r in zip(log.seqs, log.recs)]  # no tuple per entry
            log.seqs = array("q", compress(log.seqs, keep))
            log.recs = list(compress(log.recs, keep))
            log.head = log.spared = 0

    def page(self, kind: str, limit: int, cursor: int | None) -> tuple[list[Any], int | None]:
        """Up to ``limit`` live records of ``kind`` that entered it before ``cursor`` (a
        sequence number; ``None``: from the newest), newest first, and the next cursor."""
        log = self.logs[kind]
        seqs, recs = log.seqs, log.recs
        i = len(recs) if cursor is None else bisect_left(seqs, cursor)
        out: list[Any] = []
        last = 0
        while i > 0:
            i -= 1
            seq, rec = seqs[i], recs[i]
            if rec.iseq != seq:
                continue
            if len(out) == limit:
                return out, last  # a live one remains: there is a next page
            out.append(rec)
            last = seq
        return out, None

    def oldest(self, kind: str) -> int | None:
        """When (ms) the live record that entered ``kind`` first entered it."""
        log = self.logs[kind]
        for seq, rec in zip(log.seqs, log.recs):
            if rec.iseq == seq:
                return rec.ts  # type: ignore[no-any-return]
        return None

    def purge(self, kind: str, cutoff_ms: int | None, forget: Callable[[Any], None], spare: Callable[[Any], bool]) -> int:
        """Forget (``forget(rec)``, which must :meth:`drop` it) the live records of ``kind``
        that entered it at or before ``cutoff_ms`` (all when ``None``), oldest first,
        except those ``spare(rec)`` keeps."""
        log = self.logs[kind]
        n = 0
        for seq, rec in list(zip(log.seqs, log.recs)):
            if rec.iseq != seq:
                continue
            if cutoff_ms is not None and rec.ts > cutoff_ms:
                break
            if spare(rec):
                continue
            forget(rec)
            n += 1
        return n

    def trim(self, kind: str, keep: int, forget: Callable[[Any], None], spare: Callable[[Any], bool]) -> int:
        """Forget (``forget(rec)``, which must :meth:`drop` it) the live records of
        ``kind`` older than the newest ``keep``, except those ``spare(rec)`` keeps (jobs of
        trees: they go by their TTL, and count among the newest ``keep`` while they are),
        so the newest ``keep`` are never forgotten; how many. Each entry is looked at once
        over the log's life (a head moves past them; the spared ones it passed are
        counted), so trimming at every settlement costs what it forgets."""
        log = self.logs[kind]
        excess = self.live[kind] - keep - log.spared  # (the live entries before the head are older)
        if excess <= 0:
            return 0
        seqs, recs = log.seqs, log.recs
        i, end = log.head, len(recs)
        victims = []
        spared = 0
        while excess > 0 and i < end:
            rec = recs[i]
            if rec.iseq == seqs[i]:
                excess -= 1
                if spare(rec):
                    spared += 1
                else:
                    victims.append(rec)
            i += 1
        for rec in victims:  # (before the head moves: they are not counted as spared)
            forget(rec)
        if log.seqs is seqs:  # (forgetting may compact the log, which sets the head back to 0)
            log.head = i
            log.spared += spared
        return len(victims)
