"""The ``list_jobs`` cursor of the backends that order a state by ``(entry ms, job id)``
(FileStorage, RedisStorage): the key of the last job of a page, ``"<ms>:<id>"``."""

from __future__ import annotations

__all__ = ["decode_cursor", "encode_cursor"]


def encode_cursor(ms: int, job_id: str) -> str:
    return f"{ms}:{job_id}"


def decode_cursor(cursor: str | None) -> tuple[int, str] | None:
    """``(ms, id)``, or ``None`` for no cursor; ``ValueError`` naming a malformed one."""
    if cursor is None:
        return None
    ms, sep, job_id = cursor.partition(":")
    if not sep or not ms.isdigit() or not job_id:
        raise ValueError(f"invalid cursor {cursor!r}: pass back a cursor returned by list_jobs")
    return int(ms), job_id
