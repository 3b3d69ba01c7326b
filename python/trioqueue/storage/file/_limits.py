"""FileStorage's flow control state (see :class:`~.._base.ClaimLimits`), kept in the
queue's ``flow/`` directory and only touched with the queue lock held:

- ``flow/state``: the rate limit's log of claim times and the ``RateLimited`` hold
  (:class:`~.._flowstate.FlowState` as JSON, replaced atomically; not fsynced: it is a limiter,
  and a killed process leaves it in the page cache);
- ``flow/slotwait``: present while a claimer waits for a concurrency slot; whoever frees a
  slot removes it and wakes the claimers (a file created in ``ready/``, which they watch).

The concurrency count is the number of entries in ``proc/*/`` (the jobs claimed now).
"""

from __future__ import annotations

import os

from .._base import ClaimLimits
from .._flowstate import FlowState
from ._fsutil import tmp_name, write_atomic
from ._layout import FileQueue, unlink_quiet

__all__ = ["claim_allowance", "count_claims", "hold_claims", "slot_freed"]


def _dir(q: FileQueue) -> str:
    d = os.path.join(q.path, "flow")
    os.makedirs(d, exist_ok=True)
    return d


def _load(q: FileQueue) -> FlowState:
    try:
        with open(os.path.join(q.path, "flow", "state"), "rb") as f:
            return FlowState.loads(f.read())
    except FileNotFoundError:
        return FlowState()


def _save(q: FileQueue, st: FlowState) -> None:
    write_atomic(_dir(q), "state", st.dumps(), False)


def _held(q: FileQueue) -> int:
    n = 0
    for enc_w in os.listdir(q.proc):
        try:
            n += sum(1 for name in os.listdir(os.path.join(q.proc, enc_w)) if not name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            pass
    return n


def claim_allowance(q: FileQueue, limits: ClaimLimits | None, now: float, max_jobs: int) -> tuple[int, float, FlowState]:
    """``(jobs the claim may take, when a refused claim may succeed, state)``."""
    st = _load(q)
    held = _held(q) if limits is not None and limits.concurrency else 0
    allow = st.allowance(limits, now, max_jobs, held)
    if st.slot_wait:
        os.close(os.open(os.path.join(_dir(q), "slotwait"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    return allow, st.wake, st


def count_claims(q: FileQueue, st: FlowState, limits: ClaimLimits | None, now: float, n: int) -> None:
    """Count ``n`` claims made now against the rate limit."""
    if n and limits is not None and limits.rate:
        st.claimed(limits, now, n)
        _save(q, st)


def hold_claims(q: FileQueue, until: float) -> None:
    """``RateLimited``: no claim on this queue before ``until``."""
    st = _load(q)
    st.hold_until(until)
    _save(q, st)


def slot_freed(q: FileQueue) -> None:
    """Slots were freed: wake the claimers waiting for one, if any."""
    if unlink_quiet(os.path.join(q.path, "flow", "slotwait")):
        wake = os.path.join(q.ready, tmp_name())
        os.close(os.open(wake, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        unlink_quiet(wake)
