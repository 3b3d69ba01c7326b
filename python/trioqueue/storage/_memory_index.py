"""MemoryStorage's per-state index: counts, newest-first listing and purge by age.

Each state kind has an append-only log of ``(seq, record)`` entries; a record entering a
state gets the next sequence number and an entry at the end of that state's log, so each
log is in the order jobs entered the state. An entry is live while the record's ``iseq``
is still its ``seq`` (a record that moves on, or is forgotten, leaves a stale entry
behind); a log is compacted when its stale entries outnumber its live ones, so memory stays
proportional to the live jobs. Used with the storage's lock held.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Protocol

from ._base import STATE_KINDS

__all__ = ["StateIndex"]

_SLACK = 1024  # stale entries tolerated before a log is compacted


class _Indexed(Protocol):
    iseq: int
    ts_ms: int

    @property
    def kind(self) -> str: ...


def _seq(entry: tuple[int, Any]) -> int:
    return entry[0]


class StateIndex:
    """The per-state logs and live counts of one queue."""

    __slots__ = ("logs", "live", "seq")

    def __init__(self) -> None:
        self.logs: dict[str, list[tuple[int, Any]]] = {k: [] for k in STATE_KINDS}
        self.live: dict[str, int] = dict.fromkeys(STATE_KINDS, 0)
        self.seq = 0

    def enter(self, rec: _Indexed, old: str | None, new: str) -> None:
        """``rec`` moves from state ``old`` (``None``: a new record) into ``new``."""
        if old is not None:
            self.live[old] -= 1
            self._maybe_compact(old)
        self.seq += 1
        rec.iseq = self.seq
        self.live[new] += 1
        self.logs[new].append((self.seq, rec))
        self._maybe_compact(new)

    def drop(self, rec: _Indexed) -> None:
        """``rec`` is forgotten (expired, purged, removed or replaced)."""
        if rec.iseq > 0:
            rec.iseq = 0
            self.live[rec.kind] -= 1
            self._maybe_compact(rec.kind)

    def _maybe_compact(self, kind: str) -> None:
        log = self.logs[kind]
        if len(log) > 2 * self.live[kind] + _SLACK:
            self.logs[kind] = [e for e in log if e[1].iseq == e[0]]

    def page(self, kind: str, limit: int, cursor: int | None) -> tuple[list[Any], int | None]:
        """Up to ``limit`` live records of ``kind`` that entered it before ``cursor`` (a
        sequence number; ``None``: from the newest), newest first, and the next cursor."""
        log = self.logs[kind]
        i = len(log) if cursor is None else bisect_left(log, cursor, key=_seq)
        out: list[Any] = []
        last = 0
        while i > 0:
            i -= 1
            seq, rec = log[i]
            if rec.iseq != seq:
                continue
            if len(out) == limit:
                return out, last  # a live one remains: there is a next page
            out.append(rec)
            last = seq
        return out, None

    def purge(self, kind: str, cutoff_ms: int | None, forget: Callable[[Any], None]) -> int:
        """Forget (``forget(rec)``, which must :meth:`drop` it) the live records of ``kind``
        that entered it at or before ``cutoff_ms`` (all when ``None``), oldest first."""
        log = self.logs[kind]
        n = 0
        for seq, rec in list(log):
            if rec.iseq != seq:
                continue
            if cutoff_ms is not None and rec.ts_ms > cutoff_ms:
                break
            forget(rec)
            n += 1
        return n
