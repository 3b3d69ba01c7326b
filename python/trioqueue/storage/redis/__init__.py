"""RedisStorage: the reliable queue on Redis >= 7 / Valkey, standalone, Cluster or Sentinel.

The parts: :mod:`._storage` (the storage, one class: enqueues, claims, settlements,
leases, workers, pause, schedules), which builds and delegates to :mod:`._events`
(subscriptions), :mod:`._flows` (trees of jobs) and :mod:`._admin` (listing, counts,
purge, clear), all handed the script runner and the settings of :mod:`._runner`;
:mod:`._enqueue` (a job's arguments, the enqueue batches of :mod:`._coalesce`);
:mod:`._lua` (the scripts in ``scripts/``, their shared fragments in
``scripts/include/``) and :mod:`._keys` (the key layout). The connection to the server is the RESP
driver's (``trioqueue._drivers.resp``: the transport interface, the lean client,
valkey-glide, Redis Sentinel); the storage chooses its transport once.
"""

from ._storage import RedisStorage

__all__ = ["RedisStorage"]
