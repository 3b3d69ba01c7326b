"""The PostgreSQL driver: libpq (``psycopg.pq``) under Trio, with no thread per query.

:mod:`._conn` (one connection: non-blocking libpq calls waited on with Trio, statements
prepared by need, cancellation sent to the server), :mod:`._pool` (a small pool with
reconnection and backoff; transactions), :mod:`._listen` (LISTEN/NOTIFY: one listening
connection read by whoever waits), :mod:`._arrays` (list parameters in PostgreSQL's
binary array format) and :mod:`._errors` (exceptions by SQLSTATE). Needs the
``postgres`` extra (psycopg with its bundled libpq).
"""

from ._conn import Connection, Notification, Result, resolve_conninfo
from ._errors import (
    CallTimeout,
    ConnectionLost,
    DeadlockDetected,
    PostgresError,
    QueryCanceled,
    SerializationFailure,
    UniqueViolation,
)
from ._listen import Hub
from ._pool import Pool, Transaction

__all__ = [
    "CallTimeout",
    "Connection",
    "ConnectionLost",
    "DeadlockDetected",
    "Hub",
    "Notification",
    "Pool",
    "PostgresError",
    "QueryCanceled",
    "Result",
    "SerializationFailure",
    "Transaction",
    "UniqueViolation",
    "resolve_conninfo",
]
