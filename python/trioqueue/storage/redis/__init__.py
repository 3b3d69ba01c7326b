"""RedisStorage: the reliable queue on Redis >= 7 / Valkey, standalone, Cluster or Sentinel.

The parts: :mod:`._storage` (the storage: claims, settlements, events) with its mixins
:mod:`._admin` (listing, counts, purge) and :mod:`._control` (workers, pause,
schedules); :mod:`._transport` (the one interface to the server, and what its two
implementations share), :mod:`._lean` (the lean client of :mod:`._resp`: a Trio socket,
RESP parsed in Rust; standalone servers) and :mod:`._glide` (valkey-glide: Cluster, an
application's own client, ``lean=False``); :mod:`._sentinel` (Redis Sentinel: where the
primary is, and when it moves); :mod:`._lua` (the scripts in ``scripts/``,
their shared fragments in ``scripts/include/``, and the key layout).
"""

from ._storage import RedisStorage

__all__ = ["RedisStorage"]
