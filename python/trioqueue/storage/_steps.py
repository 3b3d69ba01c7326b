"""The stored form of a job's steps (``Job.step``), shared by every backend.

A job's steps are one ``bytes`` value kept with its record: the concatenation, in the
order they were saved, of one entry per step (:func:`encode_step`: the name's and the
value's lengths, 4 bytes each, big-endian, then the name in UTF-8 and the value as the
result serde made it). A save appends one entry, so it is one write on every backend
(Redis: a string concatenation in the step's script; PostgreSQL: ``steps || entry`` in
one UPDATE) and no backend parses the value. :func:`decode_steps` reads it back; a name
stored twice (a save retried after its first try landed) keeps its first value.
"""

from __future__ import annotations

import struct

__all__ = ["decode_signals", "decode_steps", "encode_step"]

_LENGTHS = struct.Struct(">II")


def encode_step(name: str, value: bytes) -> bytes:
    """The stored entry of step ``name`` whose return value the result serde encoded as
    ``value``."""
    raw = name.encode("utf-8")
    return _LENGTHS.pack(len(raw), len(value)) + raw + value


def decode_signals(data: bytes | None) -> list[tuple[str, bytes]]:
    """A job's mailbox (``Job.wait_for_signal``): the signals sent to it, kept in the
    steps' form (one :func:`encode_step` entry per message: its name and payload), as
    ``(name, payload)`` in the order they were sent. ``ValueError`` for a truncated value."""
    out: list[tuple[str, bytes]] = []
    if not data:
        return out
    view = memoryview(data)
    at, end = 0, len(data)
    size = _LENGTHS.size
    while at < end:
        if at + size > end:
            raise ValueError("stored signals are truncated")
        n, v = _LENGTHS.unpack_from(view, at)
        at += size
        if at + n + v > end:
            raise ValueError("stored signals are truncated")
        out.append((bytes(view[at : at + n]).decode("utf-8"), bytes(view[at + n : at + n + v])))
        at += n + v
    return out


def decode_steps(data: bytes | None) -> dict[str, bytes]:
    """The steps stored as ``data`` (``None``: none), ``name -> value`` in the order they
    were saved; a name stored twice keeps its first value. ``ValueError`` for a truncated
    value."""
    steps: dict[str, bytes] = {}
    if not data:
        return steps
    view = memoryview(data)
    at, end = 0, len(data)
    size = _LENGTHS.size
    while at < end:
        if at + size > end:
            raise ValueError("stored steps are truncated")
        n, v = _LENGTHS.unpack_from(view, at)
        at += size
        if at + n + v > end:
            raise ValueError("stored steps are truncated")
        name = bytes(view[at : at + n]).decode("utf-8")
        at += n
        if name not in steps:
            steps[name] = bytes(view[at : at + v])
        at += v
    return steps
