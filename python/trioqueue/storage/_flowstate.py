"""Flow control state kept by the in-process and file backends (Redis keeps the same in
its claim script): a sliding-window log of claim times for the rate limit, the
``RateLimited`` hold, and whether a claimer waits for a concurrency slot.

See :class:`~._base.ClaimLimits` for the rules; all of this runs with the queue's lock
held, so it is atomic with the claim it limits."""

from __future__ import annotations

import json
import math
from collections import deque

from ._base import ClaimLimits

__all__ = ["FlowState"]


class FlowState:
    """``log``: claim times (seconds) within the last window, oldest first; ``hold``: no
    claim before this time (``RateLimited``); ``slot_wait``: a claimer found every
    concurrency slot taken (a settlement that frees one must wake it); ``wake``: when the
    last refused claim may succeed (rate or hold; ``inf``: not by time)."""

    __slots__ = ("log", "hold", "slot_wait", "wake")

    def __init__(self) -> None:
        self.log: deque[float] = deque()
        self.hold = 0.0
        self.slot_wait = False
        self.wake = math.inf

    def allowance(self, limits: ClaimLimits | None, now: float, max_jobs: int, held: int) -> int:
        """How many jobs a claim may take now (<= ``max_jobs``); sets :attr:`wake` and
        :attr:`slot_wait` when that is 0. ``held``: jobs of the queue claimed now (only
        read with a concurrency limit)."""
        self.wake = math.inf
        if self.hold > now:
            self.wake = self.hold
            return 0
        allow = max_jobs
        if limits is not None and limits.rate:
            log = self.log
            while log and log[0] <= now - limits.per:
                log.popleft()
            free = limits.rate - len(log)
            if free <= 0:
                self.wake = log[0] + limits.per
                return 0
            allow = min(allow, free)
        if limits is not None and limits.concurrency:
            free = limits.concurrency - held
            if free <= 0:
                self.slot_wait = True
                return 0
            allow = min(allow, free)
        return allow

    def claimed(self, limits: ClaimLimits | None, now: float, n: int) -> None:
        """Count ``n`` claims made at ``now`` against the rate."""
        if n and limits is not None and limits.rate:
            self.log.extend([now] * n)
            while len(self.log) > limits.rate:
                self.log.popleft()

    def hold_until(self, until: float) -> None:
        self.hold = max(self.hold, until)

    def freed(self) -> bool:
        """A slot was freed: True (and the flag is cleared) when a claimer waits for one."""
        waiting, self.slot_wait = self.slot_wait, False
        return waiting

    # -- persistence (FileStorage keeps it in a small file) --------------------------------

    def dumps(self) -> bytes:
        return json.dumps({"log": list(self.log), "hold": self.hold, "wait": self.slot_wait}).encode()

    @classmethod
    def loads(cls, data: bytes | None) -> FlowState:
        st = cls()
        if data:
            try:
                d = json.loads(data)
                st.log = deque(float(t) for t in d.get("log", ()))
                st.hold = float(d.get("hold", 0.0))
                st.slot_wait = bool(d.get("wait", False))
            except (ValueError, TypeError, AttributeError):
                pass  # unreadable: start afresh (a limiter, not data)
        return st
