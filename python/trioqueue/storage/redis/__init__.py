"""RedisStorage: the reliable queue on Redis >= 7 / Valkey, standalone, Cluster or Sentinel.

The parts: :mod:`._storage` (the storage: claims, settlements, events) with its mixins
:mod:`._admin` (listing, counts, purge) and :mod:`._control` (workers, pause,
schedules); :mod:`._lua` (the scripts in ``scripts/``, their shared fragments in
``scripts/include/``, and the key layout). The connection to the server is the RESP
driver's (``trioqueue._drivers.resp``: the transport interface, the lean client,
valkey-glide, Redis Sentinel); the storage chooses its transport once.
"""

from ._storage import RedisStorage

__all__ = ["RedisStorage"]
