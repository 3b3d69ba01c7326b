"""FileStorage's groups (fair queuing): on-disk layout and the per-process caches.

In a queue directory:

- ``ready/g/<group>/p<n>/<number>-<id>``: the ready markers of a group's jobs of priority
  ``n`` (a FIFO by number, as a lane of ``ready/``; ``Rec.mk`` is the path from ``ready/``);
- ``ready/ring/<n><number>-<group>``: the *ring* of priority ``n``, one entry per group
  with ready jobs (``<group>`` empty: the jobs without a group), in turn order. A claim
  takes the first entry, renames it to a new number (the end of the ring), and claims
  the first job of that group's lane; a group whose lane is empty leaves the ring.
  Claimers watch ``ready/ring/``: a group joining it (an enqueue, a resume, a freed
  slot) wakes them;
- ``groups/in/<n>-<group>``: the group has an entry in ring ``n`` (created after the
  entry, removed before it: a crash leaves at worst a second entry, which costs a turn);
- ``groups/paused/<group>``: claiming the group is paused;
- ``groups/run/<group>/<id>``: the group's claimed jobs (``group_concurrency``), each
  made at the claim and removed when the job leaves processing (the directory is made with
  the group's lane, when a process first adds a ready marker of the group); when a group
  looks full its entries are checked against the records (so a crash never leaks a slot);
- ``groups/blocked/<group>``: the group left the rings for its concurrency limit; the
  first of its jobs to leave processing puts it back;
- ``groups/rate/<group>``: the group's claim times within the last window (``group_rate``,
  JSON; a limiter, not fsynced), and ``groups/sleep/<ms>-<group>``: a group over its rate,
  out of the rings until then (the claims put it back).

Groups are encoded as ids are (``encode_name``). A process caches each ring's listing
and each group lane's (as it does the lanes of ``ready/``): a ring's listing is consumed
once around, then listed again, so a claim costs O(1) in the number of groups.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..._model._types import MAX_PRIORITY
from ._fsutil import unlink_quiet, encode_name, write_atomic

__all__ = ["GroupDisk", "group_marker"]

_RING_LISTED = -2  # the ring's key in FileQueue.lane_empty (listed and found empty)


def group_marker(name: str, priority: int, group: str) -> str:
    """A grouped job's ready marker, from ``ready/`` (``name``: ``<number>-<id>``)."""
    return f"g/{encode_name(group)}/p{priority}/{name}"


def _listdir(path: str) -> list[str]:
    """The names in directory ``path`` but dot names (none if it does not exist)."""
    try:
        return [n for n in os.listdir(path) if not n.startswith(".")]
    except FileNotFoundError:
        return []


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


class GroupDisk:
    """One process's view of a queue's groups: paths, and caches of listings."""

    __slots__ = (
        "ready", "ring", "base", "member", "paused", "run", "blocked", "rate", "sleep", "rings", "dry", "lanes", "made", "last",
        "changes", "listed_at",
    )  # fmt: skip

    def __init__(self, path: str, ready: str) -> None:
        self.ready = ready
        self.ring = os.path.join(ready, "ring")
        self.base = os.path.join(path, "groups")
        self.member = os.path.join(self.base, "in")
        self.paused = os.path.join(self.base, "paused")
        self.run = os.path.join(self.base, "run")
        self.blocked = os.path.join(self.base, "blocked")
        self.rate = os.path.join(self.base, "rate")
        self.sleep = os.path.join(self.base, "sleep")
        for d in (self.ring, self.member, self.paused, self.run, self.blocked, self.rate, self.sleep):
            os.makedirs(d, exist_ok=True)
        self.rings: list[deque[str]] = [deque() for _ in range(MAX_PRIORITY + 1)]  # per priority: listed entries
        # per priority: when a listing found its ring empty (not listed again for that long,
        # nor after it until another process changes the queue: see list_at; an entry this
        # process adds forgets it)
        self.dry: list[float] = [-1.0] * (MAX_PRIORITY + 1)
        # other processes' changes seen (the generation moved, the watch of ready/ fired),
        # and their count at the last listing: see list_at
        self.changes = 0
        self.listed_at = 0
        self.lanes: dict[tuple[int, str], deque[str]] = {}  # (priority, group) -> listed marker names
        self.made: set[str] = set()  # group lane directories known to exist
        self.last = 0  # the last ring number this process gave

    # -- the ring (call with the queue lock held) ------------------------------------------

    def number(self) -> int:
        """A ring number after every one given so far (nanoseconds; the lock orders them)."""
        self.last = max(time.time_ns(), self.last + 1)
        return self.last

    def list_rings(self, lane_empty: dict[int, float], now: float) -> None:
        """List ``ready/ring/`` into the per-priority caches (replacing them)."""
        for r in self.rings:
            r.clear()
        names = sorted(n for n in os.listdir(self.ring) if not n.startswith("."))
        for n in names:
            if len(n) >= 18 and n[0].isdigit() and n[17] == "-":
                self.rings[int(n[0])].append(n)
        for p, r in enumerate(self.rings):
            self.dry[p] = -1.0 if r else now
        self.listed_at = self.changes
        if names:
            lane_empty.pop(_RING_LISTED, None)
        else:
            lane_empty[_RING_LISTED] = now

    def list_at(self, priority: int, lane_empty: dict[int, float], now: float, recheck: float) -> float:
        """When the ring of ``priority`` may be listed: ``now`` (list it), a later time, or
        ``inf``. A listing costs O(groups) (every ring's entries), so a claim of priority 5
        that looked at the empty rings 0-4 again every ``recheck`` listed 10,000 entries
        every 50 ms with 10,000 groups: a ring (or every ring) found empty is not listed
        again until another process changes the queue (``inf`` till then), nor less than
        ``recheck`` after that listing (then: the end of that window, which the caller
        waits for no longer than, as a change seen in the window, the inotify wake-up of
        another process's enqueue, gives no second wake-up). Every writer of a ring entry
        bumps the generation (enqueues, settlements, resumes, a rest's end: see
        GroupTurns), and a blocked claim's watch of ``ready/ring/`` sees its new entries,
        so another process's first entry in an empty ring is seen within ``recheck`` of
        that (or at this process's next listing)."""
        dry = self.dry[priority]
        if dry >= 0 and self.changes == self.listed_at:
            return math.inf
        until = now
        for found_empty in (lane_empty.get(_RING_LISTED), dry if dry >= 0 else None):
            if found_empty is not None and 0 <= now - found_empty < recheck:
                until = max(until, found_empty + recheck)
        return until

    def join(self, priority: int, encg: str, lane_empty: dict[int, float]) -> None:
        """Give the group an entry at the end of ring ``priority`` unless it has one."""
        member = f"{self.member}/{priority}-{encg}"
        if os.path.exists(member):
            return
        _touch(f"{self.ring}/{priority}{self.number():016x}-{encg}")
        _touch(member)
        lane_empty.pop(_RING_LISTED, None)
        self.dry[priority] = -1.0

    def rotate(self, priority: int, entry: str) -> str | None:
        """Move ring entry ``entry`` to the end of its ring: the new entry's name, or
        ``None`` if the entry is gone (another process took its turn)."""
        new = f"{priority}{self.number():016x}{entry[17:]}"
        try:
            os.rename(f"{self.ring}/{entry}", f"{self.ring}/{new}")
        except FileNotFoundError:
            return None
        return new

    def leave(self, priority: int, entry: str, encg: str) -> None:
        """The group leaves ring ``priority`` (membership first: see the module docstring)."""
        unlink_quiet(f"{self.member}/{priority}-{encg}")
        unlink_quiet(f"{self.ring}/{entry}")

    def lane_dir(self, priority: int, encg: str) -> str:
        return f"{self.ready}/g/{encg}/p{priority}"

    def next_marker(self, priority: int, encg: str) -> str | None:
        """The first listed marker name of the group's lane (not taken from the cache)."""
        key = (priority, encg)
        cache = self.lanes.get(key)
        if not cache:
            try:
                names = sorted(n for n in os.listdir(self.lane_dir(priority, encg)) if not n.startswith("."))
            except FileNotFoundError:
                names = []
            if not names:
                self.lanes.pop(key, None)
                return None
            cache = self.lanes[key] = deque(names)
        return cache[0]

    def drop_marker(self, priority: int, encg: str) -> None:
        cache = self.lanes.get((priority, encg))
        if cache:
            cache.popleft()

    def filled(self, mk: str, lane_empty: dict[int, float]) -> None:
        """A ready marker ``mk`` (``g/<group>/p<n>/...``) is about to be added: its lane
        directory exists and the group is in the ring of its priority."""
        _, encg, pn, _ = mk.split("/", 3)
        d = f"{self.ready}/g/{encg}/{pn}"
        if d not in self.made:
            os.makedirs(d, exist_ok=True)
            # with the group's directory of claimed jobs (made here, once, rather than by
            # its first claim: a claim of a new group costs the same as any other)
            os.makedirs(f"{self.run}/{encg}", exist_ok=True)
            self.made.add(d)
        self.join(int(pn[1:]), encg, lane_empty)

    def requeue(self, encg: str, lane_empty: dict[int, float]) -> None:
        """Put the group back in the ring of each priority where it has ready jobs."""
        for p in range(MAX_PRIORITY + 1):
            try:
                with os.scandir(self.lane_dir(p, encg)) as it:
                    has = any(not e.name.startswith(".") for e in it)
            except FileNotFoundError:
                continue
            if has:
                self.join(p, encg, lane_empty)

    def forget_lanes(self) -> None:
        """Released markers went before the cached names: list the group lanes again."""
        self.lanes.clear()

    def clear(self, unlink_entries: Callable[[str], int]) -> None:
        """Forget every group's state but the paused groups (``clear``, queue lock held):
        the rings and their memberships, the group lanes' ready markers, the claimed slots,
        the groups blocked for their limit, the group_rate logs and rests (membership
        before the ring entry, as :meth:`leave` does); and this process's listings."""
        for d in (self.member, self.ring, self.blocked, self.rate, self.sleep):
            unlink_entries(d)
        for encg in _listdir(self.run):
            unlink_entries(f"{self.run}/{encg}")
        for encg in _listdir(f"{self.ready}/g"):
            for pn in _listdir(f"{self.ready}/g/{encg}"):
                unlink_entries(f"{self.ready}/g/{encg}/{pn}")
        for r in self.rings:
            r.clear()
        self.lanes.clear()
        self.dry = [-1.0] * (MAX_PRIORITY + 1)

    # -- paused groups, claimed slots ------------------------------------------------------

    def is_paused(self, encg: str) -> bool:
        return os.path.exists(f"{self.paused}/{encg}")

    def running(self, encg: str) -> list[str]:
        try:
            return [n for n in os.listdir(f"{self.run}/{encg}") if not n.startswith(".")]
        except FileNotFoundError:
            return []

    def took(self, encg: str, enc: str) -> None:
        d = f"{self.run}/{encg}"
        try:
            _touch(f"{d}/{enc}")
        except FileNotFoundError:
            os.makedirs(d, exist_ok=True)
            _touch(f"{d}/{enc}")

    def left(self, group: str, enc: str, lane_empty: dict[int, float]) -> None:
        """A claimed job of ``group`` left processing: its slot is free; a group out of
        the rings for its limit is back in them."""
        encg = encode_name(group)
        unlink_quiet(f"{self.run}/{encg}/{enc}")
        if unlink_quiet(f"{self.blocked}/{encg}"):
            self.requeue(encg, lane_empty)

    def left_all(self, recs: Iterable[tuple[str, Any]], lane_empty: dict[int, float]) -> None:
        """:meth:`left` for each ``(encoded id, record)`` of a group among ``recs``."""
        for enc, r in recs:
            if r.group is not None:
                self.left(r.group, enc, lane_empty)

    # -- group_rate --------------------------------------------------------------------------

    def rate_log(self, encg: str, now: float, per: float) -> list[float]:
        """The group's claim times within the last ``per`` seconds."""
        try:
            with open(f"{self.rate}/{encg}", "rb") as f:
                times = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return []
        return [t for t in times if isinstance(t, int | float) and t > now - per]

    def rate_took(self, encg: str, log: list[float], now: float) -> None:
        log.append(now)
        write_atomic(self.rate, encg, json.dumps(log).encode(), False)

    def rest(self, encg: str, until: float) -> None:
        """The group (over its rate) is out of the rings until ``until``."""
        _touch(f"{self.sleep}/{int(until * 1000):016x}-{encg}")

    def wake(self, now: float, lane_empty: dict[int, float], bump: Callable[[], None]) -> float:
        """Groups whose rest is over go back in the rings (``bump``: the generation first,
        see list_at); when the next one's is (inf: none)."""
        for name in sorted(n for n in os.listdir(self.sleep) if not n.startswith(".")):
            at = int(name[:16], 16) / 1000
            if at > now:
                return at
            bump()
            if unlink_quiet(f"{self.sleep}/{name}"):
                self.requeue(name[17:], lane_empty)
        return math.inf

    def block(self, encg: str) -> None:
        _touch(f"{self.blocked}/{encg}")
