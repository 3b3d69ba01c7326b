"""PostgreSQL storage. Its Trio-native driver over libpq (``psycopg.pq``) and its pool
are in ``trioqueue._drivers.libpq``; the connection, pool and error classes are
re-exported here (the application's own SQL runs on :attr:`PostgresStorage.pool`).

Needs the ``postgres`` extra (``pip install 'trioqueue[postgres]'``: psycopg with its
bundled libpq).
"""

from ..._drivers.libpq import (
    CallTimeout,
    Connection,
    ConnectionLost,
    DeadlockDetected,
    Notification,
    Pool,
    PostgresError,
    QueryCanceled,
    Result,
    SerializationFailure,
    Transaction,
    UniqueViolation,
)
from ._schema import SCHEMA_VERSION, migrate
from ._storage import PostgresStorage

__all__ = [
    "SCHEMA_VERSION",
    "CallTimeout",
    "Connection",
    "ConnectionLost",
    "DeadlockDetected",
    "Notification",
    "Pool",
    "PostgresError",
    "PostgresStorage",
    "QueryCanceled",
    "Result",
    "SerializationFailure",
    "Transaction",
    "UniqueViolation",
    "migrate",
]
