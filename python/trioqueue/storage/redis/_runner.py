"""What every part of :class:`~trioqueue.storage.redis.RedisStorage` is handed: its
settings (:class:`RedisSettings`, one typed object) and the :class:`ScriptRunner`, which
holds the transport and calls the queue scripts (``scripts/``, :mod:`._lua`) with the
keys of the layout (:mod:`._keys`); with the encodings the scripts' arguments and replies
share (:func:`ms`, :func:`text`).

The transport itself (how calls reach the server: the lean client, valkey-glide,
Sentinel; retries, request timeouts) is the RESP driver's (``trioqueue._drivers.resp``),
chosen once by :func:`open_transport`.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._drivers.resp import ConnParams, Script, Transport
from . import _keys, _lua

__all__ = ["SHIELD_LIMIT", "RedisSettings", "ScriptRunner", "ms", "open_transport", "text"]

SHIELD_LIMIT = 5.0  # seconds a shielded mutation may hold up a cancellation
_FLOW_SCRIPTS = frozenset({"claim", "settle", "release"})  # recover adds the flow keys itself
_KEY_CACHE_SIZE = 4096  # (script, queue, worker) KEYS lists kept; cleared when full


def ms(seconds: float) -> int:
    """A duration in whole milliseconds, rounded up (never negative)."""
    return max(0, int(math.ceil(seconds * 1000)))


def text(v: Any) -> str:
    """A reply's bytes (or number) as a string."""
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """The settings of a :class:`~trioqueue.storage.redis.RedisStorage` (its constructor's
    options, ``params`` parsed from ``url``), read by every part it builds."""

    url: str
    prefix: str
    params: ConnParams
    retry_timeout: float = 30.0
    lean: bool = True
    block_chunk: float = 1.0  # a blocking claim waits in chunks of at most this long
    watch_interval: float = 0.5  # an events subscription's watch tick (resync checks)


def open_transport(
    params: ConnParams,
    *,
    client: Any = None,
    lean: bool = True,
    retry_timeout: float = 30.0,
    on_fault: Callable[[], None] | None = None,
) -> Transport:
    """The transport for these settings, chosen once: the lean client on a standalone
    server unless told otherwise (``lean=False``) or given a client of the application's
    own (``client=``, a valkey-glide client); valkey-glide on Cluster."""
    fault = on_fault or (lambda: None)
    if lean and client is None and not params.cluster:
        from ..._drivers.resp._lean import LeanTransport

        return LeanTransport(params, retry_timeout=retry_timeout, on_fault=fault)
    from ..._drivers.resp._glide import GlideTransport  # needs the ``redis`` extra (valkey-glide)

    return GlideTransport(params, client=client, retry_timeout=retry_timeout, on_fault=fault)


class _Scripts(dict[str, Script]):
    """The queue scripts by name, each assembled the first time it is asked for (the 36
    of them took 0.18 s, a CLI command's whole connect, to assemble at once)."""

    def __missing__(self, name: str) -> Script:
        acked = name not in _lua.UNACKED_SCRIPTS  # with acknowledged writes: wait for a replica
        script = self[name] = Script(name, _lua.source(name), _lua.library(name), acked=acked)
        return script


class ScriptRunner:
    """The queue scripts of one storage, called through its ``transport`` with the keys
    of the layout under ``prefix``; the set of queue names this process registered
    (``named``), and the call tokens the scripts record (unique per storage)."""

    def __init__(self, transport: Transport, prefix: str) -> None:
        self.transport = transport
        self.prefix = prefix
        self.scripts: dict[str, Script] = _Scripts()
        self.named: set[str] = set()  # queues added to the set of names (queue_names)
        self._key_cache: dict[tuple[str, str, str | None], list[str]] = {}
        self._call_seq = 0
        self._call_prefix = base64.urlsafe_b64encode(os.urandom(6)).decode()  # 8 chars: kept in records

    # -- the key layout ----------------------------------------------------------------

    def base(self, queue: str) -> str:
        """What the keys of ``queue`` start with (``{prefix:queue}``)."""
        return _keys.queue_base(self.prefix, queue)

    def key(self, queue: str, name: str) -> str:
        """The key ``name`` of ``queue`` (a suffix of the layout)."""
        return _keys.queue_key(self.base(queue), name)

    def keys(self, name: str, queue: str, *extra: str) -> list[str]:
        """KEYS of queue script ``name``: the queue keys it uses, then ``extra``
        (processing lists, flow keys)."""
        return [*_lua.keys_of(name, self.base(queue)), *extra]

    def flow_keys(self, queue: str) -> list[str]:
        """The last KEYS of the scripts that apply or free flow control (claim, settle,
        release, recover): the rate limit's log, then the flow hash (the RateLimited hold
        ``h``; ``w`` while a claimer waits for a concurrency slot)."""
        return _keys.flow_keys(self.base(queue))

    def plist(self, queue: str, worker_id: str) -> str:
        """The processing list of ``worker_id`` on ``queue``."""
        return _keys.processing_key(self.base(queue), worker_id)

    def lock_key(self, name: str) -> str:
        return _keys.lock_key(self.prefix, name)

    def names_key(self) -> str:
        return _keys.names_key(self.prefix)

    def script_keys(self, name: str, queue: str, worker: str | None) -> list[str]:
        """KEYS of script ``name`` (built once per script, queue and worker: the names
        cost more to format than the rest of a call's arguments)."""
        cache_key = (name, queue, worker)
        keys = self._key_cache.get(cache_key)
        if keys is None:
            keys = self.keys(name, queue) if worker is None else self.keys(name, queue, self.plist(queue, worker))
            if name in _FLOW_SCRIPTS:
                keys += self.flow_keys(queue)
            if len(self._key_cache) >= _KEY_CACHE_SIZE:
                self._key_cache.clear()
            self._key_cache[cache_key] = keys
        return keys

    # -- calls -------------------------------------------------------------------------

    async def run(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        """Script ``name`` on ``queue`` (and ``worker``'s processing list)."""
        return await self.transport.script(self.scripts[name], self.script_keys(name, queue, worker), args)

    async def run_shielded(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any:
        """:meth:`run` for a mutation whose reply matters (claims, acks): once sent, wait
        for its reply even if cancelled, but never longer than :data:`SHIELD_LIMIT`, so
        that cancellation is honoured within that bound even while the server is away
        (the Queue retries or reconciles)."""
        return await self.transport.script(
            self.scripts[name], self.script_keys(name, queue, worker), args, shield=SHIELD_LIMIT
        )

    def multi(self, name: str, queues: Sequence[str], args: Sequence[Any], shield: float) -> Awaitable[Any]:
        """Script ``name`` on several queues: the keys it uses of each, in turn."""
        keys = [k for q in queues for k in _lua.keys_of(name, self.base(q))]
        return self.transport.script(self.scripts[name], keys, args, shield=shield)

    def call_token(self) -> str:
        """A token unique to this call of this storage (recorded by the scripts, so that a
        retried call is recognised)."""
        self._call_seq += 1
        return f"{self._call_prefix}{self._call_seq:x}"

    async def register_name(self, queue: str) -> None:
        """Add ``queue`` to the set of names, once per process (before its first enqueue:
        in a cluster that key is in another slot than the queue's, out of the scripts'
        reach)."""
        if queue not in self.named:
            await self.transport.command(["SADD", self.names_key(), queue])
            self.named.add(queue)
