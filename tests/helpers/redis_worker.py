"""Subprocess worker for tests/backends/redis/test_redis_resilience.py (raw RedisStorage API).

    python redis_worker.py claim-and-hang URL PREFIX QUEUE WORKER LEASE TTL

Registers WORKER, claims one job (waiting up to 30 s), prints ``CLAIMED <id>`` and then
keeps heartbeating without ever settling, until it is killed.
"""

from __future__ import annotations

import sys

import trio

from trioqueue.storage.redis import RedisStorage


async def claim_and_hang(url: str, prefix: str, queue: str, worker: str, lease: float, ttl: float) -> None:
    async with RedisStorage(url, prefix=prefix) as st:
        await st.heartbeat(queue, worker, ttl, [], lease)
        claims = await st.dequeue(queue, worker, 1, 30.0, lease)
        print("CLAIMED", claims[0].id if claims else "", flush=True)
        while True:
            await st.heartbeat(queue, worker, ttl, [(c.id, c.token) for c in claims], lease)
            await trio.sleep(ttl / 4)


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "claim-and-hang":
        url, prefix, queue, worker, lease, ttl = args
        trio.run(claim_and_hang, url, prefix, queue, worker, float(lease), float(ttl))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
