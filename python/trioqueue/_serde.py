"""Pluggable serialization of payloads and results, and the fixed encoding of errors."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from ._models import JobError

__all__ = ["JsonSerde", "Serde", "decode_error", "encode_error"]


@runtime_checkable
class Serde(Protocol):
    """Turns Python values into bytes and back. ``dumps`` raises on values it cannot encode."""

    def dumps(self, value: Any, /) -> bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


class JsonSerde:
    """Compact UTF-8 JSON (the default). Tuples come back as lists, as with ``json``."""

    __slots__ = ("_encoder", "_decoder", "_scan")

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
        decoder = json.JSONDecoder()
        self._decoder = decoder.decode
        self._scan = decoder.scan_once  # type: ignore[attr-defined]  # its own scanner (C)

    def dumps(self, value: Any, /) -> bytes:
        if value is None:
            return b"null"  # the common result of a handler: skip the encoder
        return self._encoder(value).encode()

    def loads(self, data: bytes, /) -> Any:
        text = data.decode()
        # The scanner alone, as the decoder would call it, when the document is one value
        # with nothing around it (what dumps makes): a fifth of the decoder's cost.
        # Anything else (whitespace, trailing data, an error) goes through the decoder.
        try:
            value, end = self._scan(text, 0)
        except StopIteration:
            return self._decoder(text)
        if end != len(text):
            return self._decoder(text)
        return value


_error_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def encode_error(error: JobError) -> bytes:
    """Errors are always stored as JSON ``{"type", "message", "traceback"}`` so that every
    backend (including Lua scripts, which build stalled-job errors) can write them."""
    return _error_encoder({"type": error.type, "message": error.message, "traceback": error.traceback}).encode()


def decode_error(data: bytes) -> JobError:
    """Inverse of :func:`encode_error`; never raises (damage becomes a readable error)."""
    try:
        obj = json.loads(data)
        return JobError(str(obj.get("type", "Error")), str(obj.get("message", "")), str(obj.get("traceback", "")))
    except (ValueError, AttributeError, UnicodeDecodeError):
        return JobError("CorruptError", f"stored error could not be decoded: {data[:200]!r}")
