"""The key layout of :class:`~trioqueue.storage.redis.RedisStorage`, declared once: every
key name the storage sends (as a command's key or in a script's ``KEYS``) is built here,
and the scripts' key variables are generated from :data:`QUEUE_KEYS` (:mod:`._lua`).

- a queue's keys: ``{prefix:queue}:<suffix>`` (:func:`queue_base`, :func:`queue_key`),
  the suffixes of :data:`QUEUE_KEYS` in the scripts' KEYS order, then its flow keys
  (:data:`FLOW_KEY_NAMES`) and a worker's processing list
  (``{prefix:queue}:processing:<worker>``, :func:`processing_key`);
- the set of queue names: ``{prefix:}:queues`` (:func:`names_key`);
- a named lock (the reaper's leader election...): ``{prefix:lock:<name>}`` (:func:`lock_key`).

Everything of one queue shares one hash tag (one Redis Cluster slot); per-job data lives
in fields of per-queue hashes, so no key is derived from data at run time.
"""

from __future__ import annotations

import binascii

from ..._model._types import DEFAULT_PRIORITY, MAX_PRIORITY

__all__ = [
    "FLOW_KEY_NAMES",
    "QUEUE_KEYS",
    "QUEUE_KEY_NAMES",
    "SIGNAL_FIELD",
    "STEP_FIELD",
    "flow_keys",
    "hash_slot",
    "lock_key",
    "names_key",
    "processing_key",
    "queue_base",
    "queue_key",
    "queue_keys",
]

# The queue keys, in the KEYS order of the full layout: (the name the scripts give it, its
# suffix after ``{prefix:queue}:``). The one declaration of the layout: the prelude's key
# variables and its ready-list lanes are generated from it at load time (``--@layout``).
QUEUE_KEYS: tuple[tuple[str | None, str], ...] = (
    ("JOBS", "jobs"),  # hash id -> state string (the registry); a terminal job's: its whole record
    ("META", "meta"),  # hash id -> JSON metadata (attempts, tokens, worker, ...) of an active job
    ("ENV", "env"),  # hash id -> envelope (until completed; a failed/cancelled job's until forgotten: retry)
    ("LISTENING", "listening"),  # string with a TTL, present while a subscriber listens to ``events``
    ("ERRORS", "errors"),  # hash id -> serialized error (failing/failed, until expiry)
    # hash id -> last reported progress; STEP_FIELD + id -> the job's stored steps and
    # SIGNAL_FIELD + id -> its mailbox (``storage._steps``, until it is forgotten): bytes no
    # UTF-8 id holds, so no key more
    ("PROGRESS", "progress"),
    ("Q", "queue"),  # list: the ready list of entries <entry token>:<id> (the default priority's lane)
    ("D", "delayed"),  # zset id -> due time (ms) of failing and delayed jobs
    ("L", "leases"),  # zset id -> lease deadline (ms)
    ("SWEEP_AT", "sweep_at"),  # string: a lower bound of when the next kept terminal job is due
    ("WK", "workers"),  # zset worker -> heartbeat expiry (ms)
    ("PROCS", "procs"),  # set of workers that may have a processing list
    ("SEQ", "seq"),  # counter of entry tokens
    ("PAUSED", "paused"),  # present while claiming is paused
    ("CTL", "ctl"),  # stream: resume notices (waiting claimers XREAD it)
    ("SCHED", "schedules"),  # hash name -> schedule spec
    ("SCHED_LAST", "schedule_ticks"),  # hash name -> last tick (seconds since the epoch)
    ("EVENTS", "events"),  # pub/sub channel of the queue's events
    ("STATES", "states"),  # zset id -> kind * 2**44 + ms it entered its state (terminal: it is forgotten)
    # the ready lists of the other priorities (``queue`` is the default priority's): LANES
    *((None, f"queue:{p}") for p in range(MAX_PRIORITY + 1) if p != DEFAULT_PRIORITY),
    ("NOTICES", "notices"),  # pub/sub channel of the notice kinds only (``NOTICE_KINDS``: waiters, holders)
    ("TREE", "tree"),  # hash id -> JSON of a tree's job: pa parent, ch children, po on_child_failure, t result TTL (ms)
    ("TNOTES", "tree_notes"),  # set of notes of trees' jobs to act on (include tree: tree_note)
    ("TQS", "tree_queues"),  # set: the queues trees with a job on this queue span (absent: this one only)
    # groups (include groups): ready entries of grouped jobs, rings of groups, claimed jobs
    # per group, paused groups (groups out of the rings for their limit: fields b:<group>
    # of the flow hash)
    ("GREADY", "gready"),  # zset (lex) <priority><group>\0<order><entry> of grouped ready jobs
    ("RING", "ring"),  # zset '<priority>:<group>' -> priority * 2**44 + turn ('<p>:': the ungrouped lane)
    ("GRUN", "grun"),  # zset (lex) <group>\0<id> of the claimed jobs of groups
    ("GPAUSED", "gpaused"),  # set of paused groups
    ("GRATE", "grate"),  # zset (lex) <group>\0<ms: 13 hex>\0<id> of recent claims of groups (group_rate)
    ("GSLEEP", "gsleep"),  # zset group -> ms its next token is due, of groups over their rate
)
QUEUE_KEY_NAMES = tuple(suffix for _, suffix in QUEUE_KEYS)
# The keys of flow control, after the queue keys (and a worker's processing list) in the
# KEYS of the scripts that apply or free it: the rate limit's log, then the flow hash (the
# RateLimited hold ``h``; ``w`` while a claimer waits for a concurrency slot).
FLOW_KEY_NAMES = ("rate", "flow")
# The field of a job's steps in the PROGRESS hash: this byte (never in UTF-8), then the id.
STEP_FIELD = b"\xff"
# The field of a job's mailbox (Job.wait_for_signal) in the PROGRESS hash: this byte (never
# in UTF-8 either), then the id.
SIGNAL_FIELD = b"\xfe"
_SUFFIXES = frozenset(QUEUE_KEY_NAMES + FLOW_KEY_NAMES)
PROCESSING = "processing"  # a worker's processing list: {prefix:queue}:processing:<worker>


def queue_base(prefix: str, queue: str) -> str:
    """What the keys of ``queue`` start with: ``{prefix:queue}``, so that its keys share
    one hash tag (one Redis Cluster slot); for a queue whose name holds a ``{tag}`` part
    (a non-empty one, the first), ``{prefix:tag}:queue``: queues with the same tag share
    a slot (what a tree of jobs across queues needs on Cluster)."""
    i = queue.find("{")
    if i >= 0:
        j = queue.find("}", i + 1)
        if j > i + 1:
            return "{" + prefix + ":" + queue[i + 1 : j] + "}:" + queue
    return "{" + prefix + ":" + queue + "}"


def hash_slot(base: str) -> int:
    """The Redis Cluster slot of the keys starting with ``base`` (a :func:`queue_base`)."""
    return binascii.crc_hqx(base[1 : base.index("}")].encode(), 0) % 16384


def queue_keys(base: str) -> list[str]:
    """All the queue keys of a queue whose keys start with ``base`` (``{prefix:queue}``)."""
    return [f"{base}:{name}" for name in QUEUE_KEY_NAMES]


def queue_key(base: str, name: str) -> str:
    """The queue key ``name`` (a suffix of :data:`QUEUE_KEYS` or :data:`FLOW_KEY_NAMES`)
    of the queue whose keys start with ``base``; ``KeyError`` for a name the layout
    does not declare."""
    if name not in _SUFFIXES:
        raise KeyError(f"no queue key {name!r} in the layout")
    return f"{base}:{name}"


def flow_keys(base: str) -> list[str]:
    """The flow keys of the queue whose keys start with ``base``, in KEYS order."""
    return [f"{base}:{name}" for name in FLOW_KEY_NAMES]


def processing_key(base: str, worker_id: str) -> str:
    """The processing list of worker ``worker_id`` on the queue whose keys start with ``base``."""
    return f"{base}:{PROCESSING}:{worker_id}"


def names_key(prefix: str) -> str:
    """The set of the queue names under ``prefix``."""
    return "{" + prefix + ":}:queues"


def lock_key(prefix: str, name: str) -> str:
    """The key of the named lock ``name`` under ``prefix``."""
    return "{" + prefix + ":lock:" + name + "}"
