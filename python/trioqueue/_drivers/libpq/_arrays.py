"""Array parameters in PostgreSQL's binary array format, encoded here.

The storage passes its batches as arrays (a settlement's ids, tokens, results, TTLs; an
``enqueue_many``'s columns) and unnests them in SQL. psycopg's list dumper, driven from
its Python layer, took about 7 us an element (a settlement of 100 jobs spent 0.7 ms of
client CPU on its five arrays); a list of ``str``, ``bytes``, ``float`` or ``int``
(``None`` allowed; ints as ``int8``, which the statement casts to its column's type) is
encoded here instead, in one pass (``array_send``'s layout: dimensions, then
each element's length and bytes), and handed to psycopg as a value of a type of ours
that it sends as it is. Anything else (an empty list, bools, mixed types, an int past
``int8``, a string that is not valid UTF-8) is left to psycopg.
"""

from __future__ import annotations

import struct
from typing import Any

from psycopg import abc, postgres, pq
from psycopg.adapt import AdaptersMap, Dumper, Transformer

__all__ = ["encode_arrays", "transformer"]

_HEAD = struct.Struct("!iiiii")  # ndim (1), has nulls, element type, length, lower bound (1)
_LEN = struct.Struct("!i")
_FLOAT = struct.Struct("!id")  # an element's length (8) and value
_INT8 = struct.Struct("!iq")
_NULL = _LEN.pack(-1)
_TEXT, _BYTEA, _FLOAT8, _INT8_OID = 25, 17, 701, 20


class _Encoded(bytes):
    """An array parameter already in binary form (its type: the subclass's dumper)."""


class _TextArray(_Encoded):
    pass


class _ByteaArray(_Encoded):
    pass


class _Float8Array(_Encoded):
    pass


class _Int8Array(_Encoded):
    pass


def _dumper(array_oid: int) -> type[Dumper]:
    class _AsIs(Dumper):
        format = pq.Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    return _AsIs


_ADAPTERS = AdaptersMap(postgres.adapters)
for _cls, _oid in ((_TextArray, 1009), (_ByteaArray, 1001), (_Float8Array, 1022), (_Int8Array, 1016)):
    _ADAPTERS.register_dumper(_cls, _dumper(_oid))


class _Context:
    """What a :class:`Transformer` needs of a context: the adapters (no connection)."""

    adapters = _ADAPTERS
    connection = None


def transformer() -> abc.Transformer:
    """A psycopg :class:`Transformer` that knows the arrays encoded here."""
    return Transformer(_Context())


def _pack(element: int, items: list[bytes | None], nulls: bool) -> bytes:
    out = [_HEAD.pack(1, int(nulls), element, len(items), 1)]
    for item in items:
        if item is None:
            out.append(_NULL)
        else:
            out.append(_LEN.pack(len(item)))
            out.append(item)
    return b"".join(out)


def _encode(value: list[Any]) -> Any:
    kind = None
    nulls = False
    for v in value:
        if v is None:
            nulls = True
        elif kind is None:
            kind = type(v)
        elif type(v) is not kind:
            return value  # mixed: psycopg's
    if kind is str:
        try:
            return _TextArray(_pack(_TEXT, [None if v is None else v.encode() for v in value], nulls))
        except UnicodeEncodeError:
            return value  # (psycopg raises its own error)
    if kind is bytes:
        return _ByteaArray(_pack(_BYTEA, value, nulls))
    if kind is float:
        head = _HEAD.pack(1, int(nulls), _FLOAT8, len(value), 1)
        return _Float8Array(head + b"".join(_NULL if v is None else _FLOAT.pack(8, v) for v in value))
    if kind is int:  # (not bool: its type is bool)
        head = _HEAD.pack(1, int(nulls), _INT8_OID, len(value), 1)
        try:
            return _Int8Array(head + b"".join(_NULL if v is None else _INT8.pack(8, v) for v in value))
        except struct.error:
            return value  # past int8: psycopg's (numeric)
    return value


def encode_arrays(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """``params`` with each list of ``str``, ``bytes``, ``float`` or ``int`` (``None``
    allowed) encoded as a binary array of ``text``, ``bytea``, ``float8`` or ``int8``."""
    if not any(type(p) is list and p for p in params):
        return params
    return tuple(_encode(p) if type(p) is list and p else p for p in params)
