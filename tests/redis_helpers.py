"""Helpers of the RedisStorage-specific tests (tests/backends/redis/test_redis_*.py): unique key
prefixes, raw jobs and their settlements, a plain socket to the server (it survives
CLIENT KILL), and readings of the server's INFO (blocked clients, command counts)."""

from __future__ import annotations

import uuid

import trio

from redis_server import raw_command

from trioqueue.storage import NewJob, Settlement, SettleKind
from trioqueue.storage.redis import RedisStorage


def _prefix() -> str:
    return f"rt-{uuid.uuid4().hex[:10]}"


def _job(i: str, ttl: float = 60.0, max_attempts: int = 3) -> NewJob:
    return NewJob(i, f"env-{i}".encode(), max_attempts, ttl, f"t-{i}")


def _done(claim, data: bytes = b"", ttl: float = 60.0) -> Settlement:
    """The completion of ``claim``, fenced by its claim token."""
    return Settlement(SettleKind.COMPLETE, claim.id, data, ttl=ttl, token=claim.token)


_raw = raw_command  # a plain socket, not a GLIDE client: it must survive CLIENT KILL


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _wait_until(pred, timeout: float = 10.0, step: float = 0.005) -> None:
    with trio.fail_after(timeout):
        while not await pred():
            await trio.sleep(step)


async def _info(st: RedisStorage, section: str, field: str) -> str | None:
    """The value of ``field`` in the server's ``INFO section`` (None if absent)."""
    info = await st._transport.command(["INFO", section])
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1]
    return None


async def _blocked_clients(st: RedisStorage) -> int:
    return int(await _info(st, "clients", "blocked_clients") or 0)


async def _is_blocked(st: RedisStorage) -> bool:
    return await _blocked_clients(st) >= 1


async def _not_blocked(st: RedisStorage) -> bool:
    return await _blocked_clients(st) == 0


async def _calls(st: RedisStorage, command: str) -> int:
    """How many times the server has run ``command``, from INFO commandstats."""
    stats = await _info(st, "commandstats", f"cmdstat_{command}")
    return int(stats.split("calls=")[1].split(",")[0]) if stats else 0
