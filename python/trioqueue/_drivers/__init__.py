"""The drivers: how trioqueue talks to its servers, apart from what it stores there.

- :mod:`.resp`: the Redis/Valkey wire (RESP): the lean Trio client (RESP parsed and
  encoded by the Rust core), the transport interface with its two implementations (the
  lean client; valkey-glide), Sentinel discovery, script sending (FCALL/EVALSHA) and
  acknowledged writes.
- :mod:`.libpq`: PostgreSQL through ``psycopg.pq`` under Trio: connections, a pool,
  LISTEN/NOTIFY, binary array parameters, errors by SQLSTATE.

A driver knows connections, timeouts, cancellation and retries; it knows nothing of jobs
or queues. It sits below the storages (which import it) and above ``trioqueue._model``
(its errors are :class:`~trioqueue.StorageError`) and the Rust extension
``trioqueue._core`` (see the import contracts in ``pyproject.toml``). Its subpackages
import no third-party client at import time but the one they wrap (``psycopg`` for
:mod:`.libpq`; valkey-glide only in ``resp._glide``, imported when chosen).
"""
