"""The Redis/Valkey driver (RESP) under Trio.

:mod:`._client` (the lean client: one Trio socket per connection, commands pipelined,
RESP2 parsed and encoded by the Rust core), :mod:`._transport` (the one interface a
storage talks to, with the connection parameters, URL parsing, backoff, script policy
and acknowledged writes its two implementations share), :mod:`._lean` (the transport
over the lean client; needs no valkey-glide), :mod:`._glide` (the transport over
valkey-glide: Cluster, an application's own client; imported only when chosen, it needs
the ``redis`` extra) and :mod:`._sentinel` (Redis Sentinel: where the primary is, and
when it moves).
"""

from ._sentinel import Address, Sentinels, sentinel_url
from ._transport import ConnParams, Script, Subscription, Transport, parse_url

__all__ = ["Address", "ConnParams", "Script", "Sentinels", "Subscription", "Transport", "parse_url", "sentinel_url"]
