"""Exceptions of the PostgreSQL driver: every server error carries its SQLSTATE."""

from __future__ import annotations

from ..._model._errors import StorageError

__all__ = [
    "CallTimeout",
    "ConnectionLost",
    "DeadlockDetected",
    "PostgresError",
    "QueryCanceled",
    "SerializationFailure",
    "UniqueViolation",
    "error_for",
]


class PostgresError(StorageError):
    """An error reported by PostgreSQL (or by libpq about the connection): a
    :class:`~trioqueue.StorageError`, so that Queues and workers handle it as any storage
    failure (reported as an ``error`` event, retried with backoff).

    ``sqlstate`` is the five-character SQLSTATE code (``"23505"``: unique violation, ...;
    see the PostgreSQL manual's appendix "PostgreSQL Error Codes"), ``None`` when libpq
    reported the error without one. ``detail`` and ``hint`` are the server's, if any.
    """

    def __init__(
        self, message: str, *, sqlstate: str | None = None, detail: str | None = None, hint: str | None = None
    ) -> None:
        self.message = message
        self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        text = f"{message} (SQLSTATE {sqlstate})" if sqlstate else message
        if detail:
            text += f"\nDETAIL: {detail}"
        if hint:
            text += f"\nHINT: {hint}"
        super().__init__(text)


class ConnectionLost(PostgresError):
    """The connection is broken (server restart, ``pg_terminate_backend``, network): it is
    closed and cannot be used again. Whether a statement in flight took effect is
    unknown, as with any lost connection."""


class CallTimeout(ConnectionLost):
    """The server did not answer within the call's time limit (``PostgresStorage``'s
    ``call_timeout``): the connection was discarded (a cancel request was sent, best
    effort). Whether the statement in flight took effect is unknown."""


class UniqueViolation(PostgresError):
    """SQLSTATE 23505."""


class QueryCanceled(PostgresError):
    """SQLSTATE 57014: the statement was cancelled (a cancel request, a statement timeout)."""


class SerializationFailure(PostgresError):
    """SQLSTATE 40001: retry the transaction."""


class DeadlockDetected(PostgresError):
    """SQLSTATE 40P01: retry the transaction."""


_CLASSES: dict[str, type[PostgresError]] = {
    "23505": UniqueViolation,
    "57014": QueryCanceled,
    "40001": SerializationFailure,
    "40P01": DeadlockDetected,
}


def error_for(
    message: str, sqlstate: str | None, detail: str | None = None, hint: str | None = None
) -> PostgresError:
    """The exception for an error with this SQLSTATE (connection-class codes, ``08xxx``
    and ``57P01``-``57P03``, are :class:`ConnectionLost`)."""
    if sqlstate and (sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03")):
        return ConnectionLost(message, sqlstate=sqlstate, detail=detail, hint=hint)
    cls = _CLASSES.get(sqlstate or "", PostgresError)
    return cls(message, sqlstate=sqlstate, detail=detail, hint=hint)
