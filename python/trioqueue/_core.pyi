"""Rust core of trioqueue: envelope codec, job-state strings, a lock-free MPMC queue and
the Redis protocol (RESP2) codec."""

from collections.abc import Iterable
from typing import Final, Generic, Literal, TypeVar, final

_T = TypeVar("_T")

__all__ = [
    "ENVELOPE_VERSION",
    "CodecError",
    "MpmcQueue",
    "ObjectQueue",
    "ReplyError",
    "RespProtocolError",
    "RespReader",
    "StateError",
    "decode_envelope",
    "encode_command",
    "encode_envelope",
    "envelope_id",
    "envelope_with_attempts",
    "format_state",
    "parse_state",
]

ENVELOPE_VERSION: Final[int]
"""Envelope format version written by this build (and the highest it reads): 1."""

_StateKind = Literal["queued", "processing", "failing", "completed", "failed", "cancelled", "delayed"]

class CodecError(ValueError):
    """Envelope bytes are empty, truncated, corrupt or from a newer format version."""

class StateError(ValueError):
    """A job state string is malformed, or state fields are invalid."""

class EventsError(ValueError):
    """An event-stream message is malformed."""

def decode_events(data: bytes) -> list[tuple[str, str, str | None, bytes | None, bytes | None, str | None]]:
    """Split an event-stream message (as published by the Redis backend's scripts) into
    ``(kind, job_id, worker_id, result, error, token)`` tuples. Each event is six fields, each
    ``-`` (absent) or ``<decimal length>:<bytes>``. Raises ``EventsError`` on malformed
    input (truncated, bad length, non-UTF-8 kind/id/worker/token)."""

def encode_envelope(
    id: str,
    payload: bytes,
    created_at_ms: int,
    attempts: int,
    max_attempts: int,
    result_ttl_ms: int,
    correlation_id: str | None = None,
    options: bytes | None = None,
) -> bytes:
    """Encode a job envelope. ``options`` is an opaque optional field (per-job settings
    serialized by the Python layer).

    Ints must be >= 0 (``ValueError`` otherwise); ``created_at_ms`` and
    ``result_ttl_ms`` must fit in 64 bits, ``attempts`` and ``max_attempts`` in
    32 bits (``OverflowError`` otherwise).
    """

def decode_envelope(
    data: bytes,
) -> tuple[str, bytes, int, int, int, int, str | None, bytes | None]:
    """Decode an envelope into
    ``(id, payload, created_at_ms, attempts, max_attempts, result_ttl_ms, correlation_id, options)``.

    Raises ``CodecError`` for bad bytes; unknown optional fields are skipped.
    """

def envelope_id(data: bytes) -> str:
    """Return the envelope's id without copying its payload (raises ``CodecError``)."""

def envelope_with_attempts(data: bytes, attempts: int) -> bytes:
    """Return the same envelope with ``attempts`` replaced; every other byte,
    including unknown optional fields, is kept (raises ``CodecError``)."""

def parse_state(s: str) -> tuple[_StateKind, int, str | int | None]:
    """Parse a job state string into ``(kind, ms, extra)``.

    ``queued:<ms>``, ``completed:<ms>``, ``failed:<ms>``, ``cancelled:<ms>`` -> extra ``None``;
    ``processing:<ms>:<worker_id>`` -> extra is the worker id (may contain ``:``);
    ``failing:<ms>:<attempts>`` -> extra is the attempts ``int``;
    ``delayed:<ms>:<due_ms>`` -> extra is the due time ``int`` (ms since the epoch).
    Raises ``StateError`` naming the bad string.
    """

def format_state(kind: str, ms: int, extra: str | int | None = None) -> str:
    """Inverse of :func:`parse_state`; raises ``StateError`` when ``kind``,
    ``ms`` or ``extra`` do not fit (processing needs a non-empty ``str`` worker
    id, failing an ``int`` attempts, delayed an ``int`` due time, the other kinds
    ``None``)."""

@final
class MpmcQueue:
    """Lock-free multi-producer multi-consumer FIFO of ``bytes`` objects.

    Holds the very objects pushed (``q.pop() is item``) and is safe to share
    between threads.
    """

    def __init__(self) -> None: ...
    def push(self, item: bytes) -> None:
        """Append one ``bytes`` object (``TypeError`` for anything else)."""

    def push_many(self, items: Iterable[bytes]) -> None:
        """Append every item in order; nothing is pushed if one is not ``bytes``."""

    def pop(self) -> bytes | None:
        """Remove and return the oldest item, or ``None`` if the queue is empty."""

    def pop_many(self, n: int) -> list[bytes]:
        """Remove and return up to ``n`` items, oldest first."""

    def __len__(self) -> int: ...

class RespProtocolError(ValueError):
    """Bytes from a Redis server are not a RESP2 reply (the connection is out of step)."""

class ReplyError(Exception):
    """An error reply from a Redis server; :meth:`RespReader.pop_all` returns it as a
    value (the reply of one command among many), it is never raised by the reader."""

RespValue = bytes | str | int | None | ReplyError | list["RespValue"]

def encode_command(*parts: Iterable[bytes | str | int]) -> bytes:
    """The RESP encoding of one command: every argument of every iterable in ``parts``,
    in order, as a bulk string (``str`` as UTF-8, ``int`` in decimal; ``TypeError`` for
    anything else, ``bool`` included)."""

@final
class RespReader:
    """Incremental RESP2 reply parser, free of I/O: :meth:`feed` the bytes received,
    :meth:`pop_all` the complete replies. Refuses nesting deeper than 64 and lengths
    above 512 MiB (``RespProtocolError``); never allocates an announced length up front."""

    def __init__(self) -> None: ...
    def feed(self, data: bytes | bytearray) -> None:
        """Append bytes received from the server."""

    def pop_all(self) -> list[RespValue]:
        """Every complete reply fed so far, oldest first: bulk strings as ``bytes``,
        simple strings as ``str``, integers as ``int``, nulls as ``None``, arrays as
        ``list``, error replies as :class:`ReplyError` values. Raises
        ``RespProtocolError`` when the bytes are not RESP2."""

    def buffered(self) -> int:
        """Bytes fed that are not part of a complete reply yet."""

@final
class ObjectQueue(Generic[_T]):
    """Lock-free multi-producer multi-consumer FIFO of any objects (the batch calls of
    :class:`MpmcQueue` without its ``bytes`` check): MemoryStorage's ready lanes hold
    its job records in them. Holds the very objects pushed; safe to share between
    threads."""

    def __init__(self) -> None: ...
    def push_many(self, items: Iterable[_T]) -> None:
        """Append every item in order."""

    def pop_many(self, n: int) -> list[_T]:
        """Remove and return up to ``n`` items, oldest first (``ValueError`` if ``n < 0``)."""

    def __len__(self) -> int: ...
