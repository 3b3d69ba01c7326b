"""The Lua scripts of :class:`~trioqueue.storage.redis.RedisStorage`, one ``.lua`` file per
atomic command in ``redis_scripts/`` (shipped as package data), BullMQ-style.

A line ``--@include <name>`` splices in the shared fragment ``redis_scripts/<name>.lua``
(``_prelude``: the key layout, event encoding and helpers; ``_promote``, ``_cancel``,
``_flow_claim``/``_flow_free``: flow control, whose keys come last in KEYS).
Every key a script touches is declared in ``KEYS`` (Redis Cluster and ACL key patterns
depend on it), all under the queue's hash tag ``{prefix:queue}``, in the order of
:func:`queue_keys`; a script that touches a worker's processing list gets it after them.
Per-job data lives in fields of per-queue hashes, so no key is ever derived from data at
run time. Scripts are loaded once per process (EVALSHA; reloaded on NOSCRIPT).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = ["QUEUE_KEY_NAMES", "SCRIPT_NAMES", "SMALL", "queue_keys", "source"]

SMALL = 65536  # results/errors up to this size ride along in events

# KEYS[1..29] of every queue script, as suffixes of ``{prefix:queue}``.
QUEUE_KEY_NAMES = (
    "jobs",  # hash id -> state string (the registry); a terminal job's: its whole record
    "meta",  # hash id -> JSON metadata (attempts, tokens, worker, ...) of an active job
    "env",  # hash id -> envelope (until completed; a failed/cancelled job's until forgotten: retry)
    "results",  # unused (results live in the completed jobs' records); kept: KEYS positions
    "errors",  # hash id -> serialized error (failing/failed, until expiry)
    "progress",  # hash id -> last reported progress
    "queue",  # list: the ready list of entries <entry token>:<id>
    "delayed",  # zset id -> due time (ms) of failing and delayed jobs
    "leases",  # zset id -> lease deadline (ms)
    "sweep_at",  # string: a lower bound of when the next kept terminal job is due (sweeps skip until then)
    "workers",  # zset worker -> heartbeat expiry (ms)
    "procs",  # set of workers that may have a processing list
    "seq",  # counter of entry tokens
    "paused",  # present while claiming is paused
    "ctl",  # stream: resume notices (waiting claimers XREAD it)
    "schedules",  # hash name -> schedule spec
    "schedule_ticks",  # hash name -> last tick (seconds since the epoch)
    "events",  # pub/sub channel of the queue's events
    "states",  # zset id -> kind * 2**44 + ms it entered its state (terminal: it is forgotten)
    # the ready lists of the other priorities (``queue`` is the default priority's, 5)
    *(f"queue:{p}" for p in (0, 1, 2, 3, 4, 6, 7, 8, 9)),
    "notices",  # pub/sub channel of the notice kinds only (``NOTICE_KINDS``: waiters, holders)
)

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "settle",
    "release",
    "start",
    "cancel",
    "get_job",
    "get_envelope",
    "update_ttl",
    "heartbeat",
    "unregister",
    "workers",
    "recover",
    "sweep",
    "progress",
    "pause",
    "schedule_put",
    "schedule_remove",
    "schedule_get",
    "schedule_advance",
    "lock_acquire",
    "lock_release",
    "counts",
    "list_jobs",
    "retry",
    "purge",
    "remove",
)

_INCLUDE = re.compile(r"^--@include (\w+)$", re.MULTILINE)


def queue_keys(base: str) -> list[str]:
    """KEYS[1..29] of a queue whose keys start with ``base`` (``{prefix:queue}``)."""
    return [f"{base}:{name}" for name in QUEUE_KEY_NAMES]


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("redis_scripts", f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """The full text of script ``name``, its ``--@include`` lines replaced by the fragments."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Redis script named {name!r}")
    return _INCLUDE.sub(lambda m: _read(m.group(1)), _read(name))
