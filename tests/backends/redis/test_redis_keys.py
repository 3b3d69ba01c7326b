"""RedisStorage's key layout is declared once (``storage/redis/_keys.py``): the KEYS every
script is sent and every key the storage leaves on the server are keys that module
builds, and the scripts' key variables follow its order. Against a real server."""

from __future__ import annotations

import time
from typing import Any

import trio

from redis_helpers import _done, _job, _prefix

from trioqueue.storage import ClaimLimits
from trioqueue.storage.redis import RedisStorage, _keys, _lua


def _layout(prefix: str, queues: list[str], workers: list[str], locks: list[str]) -> set[str]:
    """Every key the layout gives these queues, workers and locks."""
    found = {_keys.names_key(prefix), *(_keys.lock_key(prefix, name) for name in locks)}
    for queue in queues:
        base = _keys.queue_base(prefix, queue)
        found.update(_keys.queue_keys(base), _keys.flow_keys(base))
        found.update(_keys.processing_key(base, w) for w in workers)
    return found


def test_each_script_is_sent_queue_keys_of_the_layout_in_its_order() -> None:
    base = _keys.queue_base("p", "q")
    everything = _keys.queue_keys(base)
    assert everything == [_keys.queue_key(base, name) for _, name in _lua.QUEUE_KEYS]
    for name in _lua.SCRIPT_NAMES:
        sent = _lua.keys_of(name, base)
        assert sent == sorted(sent, key=everything.index), name  # (the layout's order)
    assert _keys.queue_base("p", "a{grp}") == "{p:grp}:a{grp}"  # (a tree's queues share a slot)
    try:
        _keys.queue_key(base, "no-such-key")
    except KeyError as exc:
        assert "no-such-key" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an undeclared key was built")


async def test_every_key_sent_to_a_script_or_left_on_the_server_is_one_the_layout_builds(redis_url: str) -> None:
    prefix = _prefix()
    storage = RedisStorage(redis_url, prefix=prefix)
    sent: list[str] = []
    transport: Any = storage._transport
    script, blocking = transport.script, transport.blocking_move_then

    async def recording_script(s: Any, keys: Any, args: Any, **kw: Any) -> Any:
        sent.extend(keys)
        return await script(s, keys, args, **kw)

    async def recording_blocking(src: str, dst: str, timeout: float, s: Any, keys: Any, args: Any) -> Any:
        sent.extend([src, dst, *keys])
        return await blocking(src, dst, timeout, s, keys, args)

    transport.script, transport.blocking_move_then = recording_script, recording_blocking
    async with storage:
        async with storage.subscribe("q"):
            await storage.enqueue("q", [_job("a"), _job("b")._replace(priority=2), _job("c")._replace(group="g")])
            await storage.enqueue("q", [_job("later")._replace(run_at=time.time() + 60)])
            claims = await storage.dequeue("q", "w1", 2, 0.0, 30.0, limits=ClaimLimits(rate=100, per=1.0))
            await storage.heartbeat("q", "w1", 30.0, [(c.id, c.token) for c in claims], 30.0)
            await storage.settle("q", "w1", [_done(c) for c in claims])
            with trio.fail_after(10):  # (a blocking claim: the ready list's move)
                assert await storage.dequeue("q", "w2", 1, 0.5, 30.0)
            await storage.set_paused("q", True)
            await storage.set_paused("q", False)
            await storage.set_group_paused("q", "g", True)
            await storage.put_schedule("q", "every", b"{}", None)
            await storage.recover_stalled("q")
            await storage.counts("q")
            assert await storage.acquire_lock("reaper", "me", 30.0)
            server_keys = await transport.command(["KEYS", "*" + prefix + "*"])
    layout = _layout(prefix, ["q"], ["w1", "w2"], ["reaper"])
    assert sent and set(sent) <= layout, set(sent) - layout
    on_server = {k.decode() for k in server_keys}
    assert on_server and on_server <= layout, on_server - layout
