"""The lean Redis client (``_drivers/resp/_client.py``) against a real server: replies always reach
their own caller (under concurrency, cancellation and timeouts), a broken connection fails
its waiting calls and the next call opens a new one."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from redis_server import raw_command
from trioqueue import _core
from trioqueue._model._errors import StorageError
from trioqueue._drivers.resp._transport import parse_url
from trioqueue._drivers.resp._client import ConnectionLost, ReplyError, RespClient, Subscriber

pytestmark = pytest.mark.trio


def _echo(value: str) -> bytes:
    return _core.encode_command(("ECHO", value))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def test_concurrent_commands_each_get_their_own_reply(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    wrong: list[tuple[str, object]] = []

    async def worker(k: int) -> None:
        for i in range(30):
            want = f"{k}:{i}"
            got = await client.execute(_echo(want))
            if got != want.encode():
                wrong.append((want, got))

    async with trio.open_nursery() as nursery:
        for k in range(100):
            nursery.start_soon(worker, k)
    await client.aclose()
    assert wrong == []


async def test_cancelled_calls_never_put_replies_out_of_step(redis_url: str) -> None:
    """Callers cancelled before sending, while another reads for them, or while reading
    for the others: every caller that completes gets its own reply."""
    client = RespClient(parse_url(redis_url))
    rng = random.Random(7)
    wrong: list[tuple[str, object]] = []
    completed = cancelled = 0

    async def caller(k: int) -> None:
        nonlocal completed, cancelled
        for i in range(40):
            want = f"{k}:{i}"
            with trio.CancelScope() as scope:
                if rng.random() < 0.4:
                    scope.deadline = trio.current_time() + rng.choice([0, 0, 1e-5, 5e-5, 2e-4])
                got = await client.execute(_echo(want))
                completed += 1
                if got != want.encode():
                    wrong.append((want, got))
            cancelled += scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        for k in range(50):
            nursery.start_soon(caller, k)
    # the connection is still in step: a fresh call gets its own reply
    assert await client.execute(_echo("after")) == b"after"
    await client.aclose()
    assert wrong == []
    assert completed > 0 and cancelled > 0  # both paths were exercised


async def test_error_replies_are_returned_to_their_caller_only(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    async with trio.open_nursery() as nursery:
        results: dict[str, object] = {}

        async def call(name: str, data: bytes) -> None:
            results[name] = await client.execute(data)

        nursery.start_soon(call, "bad", _core.encode_command(("NO-SUCH-COMMAND", "x")))
        nursery.start_soon(call, "good", _echo("fine"))
    assert isinstance(results["bad"], ReplyError) and "NO-SUCH-COMMAND" in str(results["bad"]).upper()
    assert results["good"] == b"fine"
    await client.aclose()


async def test_killed_connection_fails_the_call_and_the_next_call_reconnects(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    first_id = await client.execute(_core.encode_command(("CLIENT", "ID")))
    raw_command(_port(redis_url), "CLIENT", "KILL", "ID", str(first_id))
    with pytest.raises(ConnectionLost):
        await client.execute(_echo("lost"))
    second_id = await client.execute(_core.encode_command(("CLIENT", "ID")))
    assert isinstance(second_id, int) and second_id != first_id
    assert await client.execute(_echo("back")) == b"back"
    await client.aclose()


async def test_a_call_past_its_timeout_breaks_only_its_connection(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    conn = await client.open_connection()
    with pytest.raises(ConnectionLost, match="no reply within"):
        await conn.call(_core.encode_command(("BLPOP", "tq-test-never", "5")), timeout=0.2)
    assert conn.broken is not None
    with pytest.raises(ConnectionLost):
        await conn.call(_echo("x"))
    # the server dropped the blocked command with the connection
    with trio.fail_after(5):
        while b"blocked_clients:0" not in raw_command(_port(redis_url), "INFO", "clients"):
            await trio.sleep(0.01)
    assert await client.execute(_echo("other")) == b"other"
    await conn.aclose()
    await client.aclose()


async def test_with_the_watchdog_running_a_call_past_its_timeout_still_breaks_the_connection(redis_url: str) -> None:
    """While the watchdog runs, calls wait for replies without a cancel scope of their
    own: the watchdog must still end a call that outlives its timeout."""
    client = RespClient(parse_url(redis_url, request_timeout=0.3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.watchdog)
        await trio.testing.wait_all_tasks_blocked()
        assert await client.execute(_echo("first")) == b"first"
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(ConnectionLost, match="no reply within 0.3 s"):
            await client.execute(_core.encode_command(("BLPOP", "tq-test-never", "10")))
        assert 0.3 <= trio.current_time() - started < 0.3 + 3 * 0.03 + 0.5  # timeout, two ticks, slack
        assert await client.execute(_echo("next")) == b"next"  # on a new connection
        dedicated = await client.open_connection()  # as for blocking claims: watched too
        with trio.fail_after(5), pytest.raises(ConnectionLost, match="no reply within 0.3 s"):
            await dedicated.call(_core.encode_command(("BLPOP", "tq-test-never", "10")))
        await dedicated.aclose()
        nursery.cancel_scope.cancel()
    assert client._watch.active == 0
    await client.aclose()


@pytest.mark.parametrize("watched", [False, True])
async def test_a_cancelled_shielded_call_returns_the_reply_that_came_in_time(redis_url: str, watched: bool) -> None:
    """``shield``: a mutation cancelled after it was sent still returns its reply when
    it comes within the bound (the cancellation lands at the next checkpoint); past the
    bound the cancellation is raised, and the late reply is dropped in step."""
    client = RespClient(parse_url(redis_url))
    slow = _core.encode_command(("BLPOP", "tq-test-shield", "0.3"))  # a nil reply after 0.3 s
    async with trio.open_nursery() as nursery:
        if watched:
            nursery.start_soon(client.watchdog)
            await trio.testing.wait_all_tasks_blocked()
        assert await client.execute(_echo("warm")) == b"warm"
        got: list[object] = ["unset"]
        with trio.move_on_after(0.05) as scope:
            got[0] = await client.execute(slow, shield=2.0)
            await trio.lowlevel.checkpoint()  # where the cancellation lands
        assert scope.cancelled_caught and got == [None]
        with trio.move_on_after(0.05) as scope:
            await client.execute(slow, shield=0.1)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            assert await client.execute(_echo("in step")) == b"in step"
        nursery.cancel_scope.cancel()
    await client.aclose()


async def test_wrong_password_is_a_clear_error(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url.replace("redis://", "redis://nobody:secret@")))
    with pytest.raises(StorageError, match="refused AUTH"):
        await client.execute(_echo("x"))
    await client.aclose()


async def test_closed_client_refuses_calls(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    assert await client.execute(_echo("x")) == b"x"
    await client.aclose()
    with pytest.raises(StorageError, match="closed"):
        await client.execute(_echo("y"))


async def test_subscriber_delivers_messages_and_resubscribes_after_its_connection_is_killed(redis_url: str) -> None:
    client = RespClient(parse_url(redis_url))
    got: list[bytes] = []
    arrived = trio.Event()

    def on_message(payload: bytes) -> None:
        got.append(payload)
        arrived.set()

    sub = Subscriber(client, "tq-test-channel", on_message)
    await sub.subscribe()
    assert sub.connected and sub.generation == 1

    async def publish_until_heard(text: str) -> None:
        nonlocal arrived
        arrived = trio.Event()
        with trio.fail_after(10):
            while not arrived.is_set():  # a message sent while resubscribing is lost: send again
                await client.execute(_core.encode_command(("PUBLISH", "tq-test-channel", text)))
                with trio.move_on_after(0.05):
                    await arrived.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sub.run)
        await publish_until_heard("one")
        raw_command(_port(redis_url), "CLIENT", "KILL", "TYPE", "pubsub")
        await publish_until_heard("two")
        assert sub.generation == 2  # a new connection: its owner announces a resync
        nursery.cancel_scope.cancel()
    assert got[0] == b"one" and got[-1] == b"two"
    await sub.aclose()
    await client.aclose()
