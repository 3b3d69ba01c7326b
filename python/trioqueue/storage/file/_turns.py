"""FileStorage's claims across groups: one claim's walk of the rings (see ``_groups``).

:class:`GroupTurns` is made per claim (queue lock held): for each priority whose ring has
entries it hands out the next ready marker in turn (a group's, or the ungrouped lane's),
passing over paused groups and groups at their ``group_concurrency`` (they leave the
ring), and it lists the ungrouped lanes as the claim did before groups (once per claim).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from .._base import PROCESSING as _PROCESSING
from .._base import ClaimLimits
from ..._model._types import DEFAULT_PRIORITY
from ._fsutil import Rec, encode_name
from ._layout import LANE_RECHECK, FileQueue, is_lane_dir, unlink_quiet

__all__ = ["GroupTurns"]

_SKIP = ("", "", "")  # a turn that yields no marker


class GroupTurns:
    __slots__ = ("q", "limit", "now", "read", "listed", "dry", "joined", "counts", "mine", "rate", "per", "logs", "wake_at")

    def __init__(self, q: FileQueue, limits: ClaimLimits | None, now: float, read: Callable[[FileQueue, str], Rec | None]) -> None:
        self.q = q
        self.limit = limits.group_concurrency if limits is not None else 0
        self.now = now
        self.read = read
        self.listed: set[int] = set()  # ungrouped lanes listed by this claim
        self.dry: set[int] = set()  # priorities whose ring a listing of this claim found empty
        self.joined: set[int] = set()  # priorities whose ungrouped lane was checked for the ring
        self.counts: dict[str, int] = {}  # group -> its claimed jobs (as far as looked up)
        self.mine: set[str] = set()  # jobs this claim took (their records are written at its end)
        self.rate = limits.group_rate if limits is not None else 0
        self.per = limits.group_per if limits is not None else 1.0
        self.logs: dict[str, list[float]] = {}  # group -> its recent claim times (as far as read)
        # when a group over its rate may be claimed again, once woken ones are back, or a ring
        # found empty just before a change may be listed again (inf: none)
        self.wake_at = q.grp.wake(now, q.lane_empty, q.bump) if self.rate else math.inf

    def list_lane(self, lane: int, now: float) -> bool:
        """List ungrouped lane ``lane`` into its cache (once per claim, and not while it
        was found empty recently): whether it has names now."""
        q = self.q
        empty = q.lane_empty
        if lane in self.listed or (lane in empty and 0 <= now - empty[lane] < LANE_RECHECK):
            return bool(q.cache[lane])
        self.listed.add(lane)
        names = os.listdir(q.lanes[lane])
        if lane == DEFAULT_PRIORITY:
            names = [n for n in names if not is_lane_dir(n)]
        if names:
            empty.pop(lane, None)
            q.cache[lane].extend(sorted(names))
        else:
            empty[lane] = now
        return bool(q.cache[lane])

    def pick(self, lane: int) -> tuple[str, str, str] | None:
        """The next marker ``(directory, name, mk)`` of priority ``lane`` by the ring,
        :data:`_SKIP` for a turn without one, ``None`` when the ring is empty."""
        q, g = self.q, self.q.grp
        ring = g.rings[lane]
        if not ring:
            if lane in self.dry:
                return None
            when = g.list_at(lane, q.lane_empty, self.now, LANE_RECHECK)
            if when > self.now:  # (a blocked claim comes back then: see list_at)
                self.wake_at = min(self.wake_at, when)
                return None
            g.list_rings(q.lane_empty, self.now)
            self.dry.update(p for p, r in enumerate(g.rings) if not r)
            if not ring:
                return None
        if lane not in self.joined:
            self.joined.add(lane)  # jobs without a group that arrived meanwhile: their turn comes
            if q.cache[lane] or self.list_lane(lane, self.now):
                g.join(lane, "", q.lane_empty)
        entry = ring.popleft()
        encg = entry[18:]
        new = g.rotate(lane, entry)
        if new is None:
            return _SKIP  # another process took this turn since the listing
        if not encg:
            cache = q.cache[lane]
            if not cache and not self.list_lane(lane, self.now):
                g.leave(lane, new, encg)
                return _SKIP
            name = cache.popleft()
            return q.lanes[lane], name, (name if lane == DEFAULT_PRIORITY else f"p{lane}/{name}")
        if self._refuses(encg):
            g.leave(lane, new, encg)  # back when resumed, or when a slot of it is freed
            return _SKIP
        marker = g.next_marker(lane, encg)
        if marker is None:
            g.leave(lane, new, encg)
            return _SKIP
        g.drop_marker(lane, encg)
        return g.lane_dir(lane, encg), marker, f"g/{encg}/p{lane}/{marker}"

    def _refuses(self, encg: str) -> bool:
        """Whether the group is paused, or at its concurrency limit (then marked blocked)."""
        g = self.q.grp
        if g.is_paused(encg):
            return True
        if not self.limit:
            return self._over_rate(encg)
        n = self.counts.get(encg)
        if n is None:
            n = self.counts[encg] = len(g.running(encg))
        if n < self.limit:
            return self._over_rate(encg)
        for enc in g.running(encg):  # full: drop the entries of jobs no longer claimed
            if enc in self.mine:
                continue
            r = self.read(self.q, enc)
            if r is None or r.kind != _PROCESSING or r.group is None or encode_name(r.group) != encg:
                unlink_quiet(f"{g.run}/{encg}/{enc}")
        n = self.counts[encg] = len(g.running(encg))
        if n < self.limit:
            return self._over_rate(encg)
        g.block(encg)
        return True

    def _over_rate(self, encg: str) -> bool:
        """Whether the group had ``rate`` claims in the last window (then it rests)."""
        if not self.rate:
            return False
        log = self.logs.get(encg)
        if log is None:
            log = self.logs[encg] = self.q.grp.rate_log(encg, self.now, self.per)
        if len(log) < self.rate:
            return False
        until = min(log) + self.per
        self.q.grp.rest(encg, until)
        self.wake_at = min(self.wake_at, until)
        return True

    def took(self, group: str, enc: str) -> None:
        encg = encode_name(group)
        self.q.grp.took(encg, enc)
        self.mine.add(enc)
        if self.rate:
            log = self.logs.get(encg)
            if log is None:
                log = self.logs[encg] = self.q.grp.rate_log(encg, self.now, self.per)
            self.q.grp.rate_took(encg, log, self.now)
        if encg in self.counts:
            self.counts[encg] += 1
