"""Pluggable serialization of payloads and results, and the fixed encoding of errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ._types import JobError

__all__ = ["JsonSerde", "Serde", "decode_error", "encode_error", "error_data"]


@runtime_checkable
class Serde(Protocol):
    """Turns Python values into bytes and back. ``dumps`` raises on values it cannot encode."""

    def dumps(self, value: Any, /) -> bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


def compact_json_encoder(*, ensure_ascii: bool = False, allow_nan: bool = False) -> Callable[[Any], str]:
    """``JSONEncoder(separators=(",", ":"), ensure_ascii=..., allow_nan=...).encode``.
    That method sets up the C encoder again on every call (about half its cost for a
    small payload); this one keeps it, and makes it again only after a failure (which
    can leave entries in its table of the containers being encoded)."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=allow_nan)
    make = getattr(json.encoder, "c_make_encoder", None)
    plain = encoder.encode
    if make is None:  # no C accelerator (another Python)
        return plain
    strings = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring

    def fresh() -> Any:
        return make({}, encoder.default, strings, None, ":", ",", False, False, allow_nan)

    c_encode = fresh()

    def encode(value: Any) -> str:
        nonlocal c_encode
        if isinstance(value, str):
            return plain(value)
        try:
            return "".join(c_encode(value, 0))
        except BaseException:
            c_encode = fresh()
            raise

    return encode


class JsonSerde:
    """Compact UTF-8 JSON (the default). Tuples come back as lists, as with ``json``."""

    __slots__ = ("_encoder", "_decoder", "_scan")

    def __init__(self) -> None:
        self._encoder = compact_json_encoder()
        decoder = json.JSONDecoder()
        self._decoder = decoder.decode
        self._scan = decoder.scan_once  # type: ignore[attr-defined]  # its own scanner (C)

    def __reduce__(self) -> tuple[type[JsonSerde], tuple[()]]:
        return (JsonSerde, ())  # pickled as a fresh one (a process pool's handlers get it)

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


_error_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _storable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can store it: dicts (string keys) and lists/tuples gone through,
    any other value JSON cannot say replaced by its ``repr`` (as is, deeper than 20)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if depth < 20 and isinstance(value, dict):
        return {str(k): _storable(v, depth + 1) for k, v in value.items()}
    if depth < 20 and isinstance(value, (list, tuple)):
        return [_storable(v, depth + 1) for v in value]
    return _repr(value)


def error_data(exc: BaseException) -> dict[str, Any] | None:
    """The ``data`` dict an exception offers, as stored with its error
    (:attr:`JobError.data`): what its ``to_dict()`` method returns, or else the attributes
    its class names in ``error_fields`` (a tuple of attribute names; one the instance
    lacks is left out); ``None`` when it offers neither. Never raises: keys become
    strings, a value JSON cannot store is kept as its ``repr``, a ``to_dict()`` that
    raises or returns something else than a dict gives ``{"repr": ...}`` of what it
    raised or returned."""
    to_dict = getattr(exc, "to_dict", None)
    if callable(to_dict):
        try:
            raw = to_dict()
        except Exception as err:  # noqa: BLE001 - stored as text, never a crash
            return {"repr": f"to_dict() raised {err!r}"}
        if not isinstance(raw, dict):
            return {"repr": _repr(raw)}
        return {str(k): _storable(v, 1) for k, v in raw.items()}
    fields = getattr(type(exc), "error_fields", None)
    if isinstance(fields, (tuple, list)) and fields:
        missing = object()
        values = {str(f): getattr(exc, str(f), missing) for f in fields}
        return {k: _storable(v, 1) for k, v in values.items() if v is not missing}
    return None


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as err:  # noqa: BLE001 - a repr that raises
        return f"<unrepresentable {type(value).__name__}: {err!r}>"


def encode_error(error: JobError) -> bytes:
    """Errors are always stored as JSON ``{"type", "message", "traceback"}`` (and
    ``"data"`` when the error has some) so that every backend (including Lua scripts,
    which build stalled-job errors) can write them."""
    obj: dict[str, Any] = {"type": error.type, "message": error.message, "traceback": error.traceback}
    if error.data is not None:
        obj["data"] = _storable(error.data) if isinstance(error.data, dict) else {"repr": _repr(error.data)}
    return _error_encoder(obj).encode()


def decode_error(data: bytes) -> JobError:
    """Inverse of :func:`encode_error`; never raises (damage becomes a readable error)."""
    try:
        obj = json.loads(data)
        extra = obj.get("data")
        return JobError(
            str(obj.get("type", "Error")),
            str(obj.get("message", "")),
            str(obj.get("traceback", "")),
            extra if isinstance(extra, dict) else None,
        )
    except (ValueError, AttributeError, UnicodeDecodeError):
        return JobError("CorruptError", f"stored error could not be decoded: {data[:200]!r}")
