"""Retry policies, serialization and the error encoding (no storage involved)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioqueue import ExponentialBackoff, JobError, JsonSerde, ValidationError
from trioqueue._model._retry import retry_policy
from trioqueue._model._serde import decode_error, encode_error


def test_exponential_backoff_grows_and_caps() -> None:
    policy = ExponentialBackoff(base=0.5, factor=2.0, max=3.0, jitter=0.0)
    assert [policy(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy(10_000) == 3.0  # no overflow on absurd attempt numbers


def test_backoff_jitter_stays_in_band() -> None:
    policy = ExponentialBackoff(base=1.0, factor=1.0, max=10.0, jitter=0.25)
    delays = {policy(1) for _ in range(200)}
    assert all(0.75 <= d <= 1.25 for d in delays) and len(delays) > 1


@pytest.mark.parametrize(
    "kwargs", [{"base": -1}, {"factor": 0.5}, {"jitter": 2}, {"max": math.inf}, {"base": math.nan}]
)
def test_backoff_rejects_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        ExponentialBackoff(**kwargs)


def test_retry_policy_accepts_constants_and_callables() -> None:
    assert retry_policy(0)(7) == 0.0
    assert retry_policy(lambda n: n * 0.1)(3) == pytest.approx(0.3)
    with pytest.raises(ValidationError, match="retry_delay"):
        retry_policy(-1)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_json_serde_round_trips(value: object) -> None:
    serde = JsonSerde()
    data = serde.dumps(value)
    assert isinstance(data, bytes)
    assert serde.loads(data) == value


def _outcome(fn: object, data: bytes) -> tuple[str, object]:
    try:
        return "value", fn(data)  # type: ignore[operator]
    except Exception as exc:
        return type(exc).__name__, str(exc)


@given(
    st.one_of(
        json_values.map(lambda v: json.dumps(v)),
        json_values.map(lambda v: f" {json.dumps(v, indent=1)}\n"),
        json_values.map(lambda v: json.dumps(v) + " x"),
        st.text(alphabet=' \t\n"[]{},:0123456789.eE+-truefalsnNIfiy\\', max_size=12),
    )
)
def test_json_serde_decodes_exactly_as_json_loads(text: str) -> None:
    """loads() calls the decoder's scanner directly when it can: same values, same errors
    as ``json.loads`` (whitespace around a value, trailing data, malformed documents)."""
    data = text.encode()
    assert _outcome(JsonSerde().loads, data) == _outcome(json.loads, data)


@given(st.one_of(json_values, st.tuples(json_values, json_values), st.integers(min_value=2**64)))
def test_json_serde_encodes_exactly_as_the_compact_json_encoder(value: object) -> None:
    """dumps() keeps one C encoder instead of setting it up per call: the same bytes as
    the ``JSONEncoder`` it stands for."""
    expected = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(value)
    assert JsonSerde().dumps(value) == expected.encode()


@given(st.one_of(json_values, st.floats(), st.lists(st.one_of(st.floats(), st.text()))))
def test_the_ascii_encoder_of_file_records_encodes_exactly_as_json(value: object) -> None:
    """FileStorage's record headers and segment indexes use the kept C encoder with
    ``ensure_ascii`` and NaN allowed: the same text as the ``JSONEncoder`` it stands for."""
    from trioqueue._model._serde import compact_json_encoder

    expected = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode(value)
    assert compact_json_encoder(ensure_ascii=True, allow_nan=True)(value) == expected


def test_json_serde_encodes_again_after_a_failure_midway() -> None:
    """A failure inside a container leaves the containers being encoded marked in the
    kept encoder; encoding them again (the payload fixed) must work, not be "circular"."""
    serde = JsonSerde()
    payload = {"items": [1, {2}]}
    with pytest.raises(TypeError):
        serde.dumps(payload)
    payload["items"][1] = 2  # type: ignore[index]
    assert serde.dumps(payload) == b'{"items":[1,2]}'
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        serde.dumps(loop)
    loop.clear()
    assert serde.dumps(loop) == b"[]"


def test_json_serde_rejects_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError):
        JsonSerde().dumps(math.nan)
    with pytest.raises(TypeError):
        JsonSerde().dumps({1, 2})


@given(st.text(), st.text(), st.text())
def test_error_encoding_round_trips(kind: str, message: str, tb: str) -> None:
    err = JobError(kind, message, tb)
    assert decode_error(encode_error(err)) == err


@pytest.mark.parametrize("garbage", [b"", b"\xff\xfe", b"[1,2]", b'{"type": 3}', b"null"])
def test_decode_error_never_raises(garbage: bytes) -> None:
    err = decode_error(garbage)
    assert isinstance(err, JobError) and isinstance(err.type, str)
