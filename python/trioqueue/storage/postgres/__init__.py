"""PostgreSQL storage: a Trio-native driver over libpq (``psycopg.pq``) and its pool.

Needs the ``postgres`` extra (``pip install 'trioqueue[postgres]'``: psycopg with its
bundled libpq).
"""

from ._conn import Connection, Notification, Result
from ._errors import (
    CallTimeout,
    ConnectionLost,
    DeadlockDetected,
    PostgresError,
    QueryCanceled,
    SerializationFailure,
    UniqueViolation,
)
from ._pool import Pool, Transaction
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
