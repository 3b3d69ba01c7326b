"""RedisStorage-specific tests: failures, against real servers. No fakes.

Connections killed under the client (operations and blocked claims carry on), a server
restarted with AOF loses no acknowledged job, the job of a SIGKILLed worker process is
recovered, cancellation is honoured with the server down and while a claim is blocked,
and the lean client's watchdog runs while a Queue does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import trio

from redis_helpers import _done, _is_blocked, _job, _not_blocked, _port, _prefix, _raw, _wait_until
from redis_server import RedisServer, free_port

from trioqueue.storage import NewJob, Settlement, SettleKind
from trioqueue.storage.redis import RedisStorage
from support import HELPERS


@pytest.fixture
async def st(redis_url: str) -> AsyncIterator[RedisStorage]:
    s = RedisStorage(redis_url, prefix=_prefix())
    async with s:
        yield s


async def test_client_kill_operations_continue(redis_url: str) -> None:
    st = RedisStorage(redis_url, prefix=_prefix(), watch_interval=0.05)
    port = _port(redis_url)
    async with st, st.subscribe("q") as rx:
        await st.enqueue("q", [_job("before")])
        assert [e.kind for e in await rx.receive()] == ["enqueued"]
        _raw(port, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        _raw(port, "CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes")
        # operations continue (GLIDE reconnects; the adapter retries)
        assert (await st.enqueue("q", [_job("after")]))[0].status == "queued"
        claims = await st.dequeue("q", "w", 10, 1, 30)
        assert sorted(c.id for c in claims) == ["after", "before"]
        # the subscriber reports a resync, then still receives events
        with trio.fail_after(10):
            while True:
                batch = await rx.receive()
                if any(e.kind == "resync" for e in batch):
                    break
        await st.settle("q", "w", [_done(c, b"ok") for c in claims if c.id == "after"])
        with trio.fail_after(10):
            while True:
                batch = await rx.receive()
                if any(e.kind == "completed" and e.job_id == "after" for e in batch):
                    break


async def test_blocked_claim_survives_client_kill(redis_url: str) -> None:
    st = RedisStorage(redis_url, prefix=_prefix())
    async with st:
        async with trio.open_nursery() as n:
            got: list = []

            async def claimer() -> None:
                got.extend(await st.dequeue("q", "w", 10, 15, 30))

            n.start_soon(claimer)
            await _wait_until(lambda: _is_blocked(st))
            _raw(_port(redis_url), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            await st.enqueue("q", [_job("k")])
        assert [c.id for c in got] == ["k"]


async def test_server_restart_with_aof_loses_no_acknowledged_job(tmp_path) -> None:
    server = RedisServer(aof=True, directory=str(tmp_path))
    server.start()
    try:
        await _restart_scenario(server)
    finally:
        server.close()


async def _restart_scenario(server: RedisServer) -> None:
    st = RedisStorage(server.url, prefix=_prefix(), retry_timeout=60, request_timeout=2.0)
    acked: list[str] = []
    done: set[str] = set()
    stop_producing = trio.Event()
    producer_done = trio.Event()
    lease = 2.0
    async with st:

        async def producer() -> None:
            i = 0
            while not stop_producing.is_set():
                ids = [f"p{i}-{k}" for k in range(5)]
                i += 1
                outcomes = await st.enqueue("q", [_job(x) for x in ids])
                acked.extend(x for x, o in zip(ids, outcomes, strict=True) if o.status == "queued")
                await trio.sleep(0.005)
            producer_done.set()

        async def consumer(worker: str) -> None:
            while True:
                claims = await st.dequeue("q", worker, 20, 0.5, lease)
                if claims:
                    oks = await st.settle("q", worker, [_done(c, b"r", ttl=600) for c in claims])
                    done.update(c.id for c, ok in zip(claims, oks, strict=True) if ok)

        async def heartbeat(worker: str) -> None:
            while True:
                await st.heartbeat("q", worker, 3 * lease, [], lease)
                await trio.sleep(0.3)

        async def reaper() -> None:
            while True:
                await st.recover_stalled("q")
                await trio.sleep(0.3)

        async with trio.open_nursery() as n:
            for w in ("w1", "w2"):
                n.start_soon(heartbeat, w)
                n.start_soon(consumer, w)
            n.start_soon(reaper)
            n.start_soon(producer)
            await _wait_until(lambda: _gt(lambda: len(done), 50), timeout=20)
            for _ in range(2):
                server.kill()
                await trio.sleep(0.3)  # the outage itself
                await trio.to_thread.run_sync(server.start)
                before = len(done)
                await _wait_until(lambda: _gt(lambda: len(done), before + 50), timeout=30)
            stop_producing.set()
            await producer_done.wait()

            async def all_done() -> bool:
                return set(acked) <= done

            with trio.move_on_after(30):
                await _wait_until(all_done, timeout=30, step=0.05)
            n.cancel_scope.cancel()
        missing = sorted(set(acked) - done)
        states = {m: await st.get_job("q", m) for m in missing[:5]}
        assert not missing, (len(missing), states, {w: await st.held_jobs("q", w) for w in ("w1", "w2")})
        assert len(acked) > 100
        # and the registry agrees
        for job_id in acked[:: max(1, len(acked) // 50)]:
            assert (await st.get_job("q", job_id)).state.startswith("completed:")


async def _gt(value, n: int) -> bool:
    await trio.lowlevel.checkpoint()
    return value() > n


HELPER = HELPERS / "redis_worker.py"


async def test_sigkilled_worker_process_job_is_recovered(redis_url: str) -> None:
    """A worker process claims a job and is SIGKILLed mid-job: once its heartbeat expires
    recover_stalled requeues the job and another worker completes it (attempt 2)."""
    import subprocess
    import sys

    prefix = _prefix()
    st = RedisStorage(redis_url, prefix=prefix)
    async with st, st.subscribe("q") as rx:
        await st.enqueue("q", [_job("victim")])
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), "claim-and-hang", redis_url, prefix, "q", "doomed", "30", "0.6"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            assert line.split() == ["CLAIMED", "victim"]
            assert "doomed" in await st.workers("q")
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        # the lease (30 s) is far away: it is the dead worker's heartbeat that expires
        recovered, next_deadline = await st.recover_stalled("q")
        if not recovered:
            assert next_deadline is not None
            await trio.sleep(max(0.0, next_deadline - time.time()) + 0.01)  # the reaper sleeps until then
            recovered, _ = await st.recover_stalled("q")
        assert recovered == [("victim", "requeued")]
        claims = await st.dequeue("q", "healthy", 1, 1, 30)
        assert [(c.id, c.attempts) for c in claims] == [("victim", 2)]
        assert await st.settle("q", "healthy", [_done(claims[0], b"ok")]) == [True]
        kinds = []
        with trio.fail_after(5):
            while "completed" not in kinds:
                kinds += [e.kind for e in await rx.receive() if e.job_id == "victim"]
        assert kinds == ["enqueued", "stalled", "requeued", "completed"]


async def test_cancellation_is_honoured_while_the_server_is_down(tmp_path) -> None:
    """Mutations are shielded so that their replies are not lost, but only within a bound:
    with the server gone, a cancelled enqueue or settle returns well before the 30 s
    retry budget runs out."""
    from trioqueue.storage.redis import _runner as redis_module

    server = RedisServer(directory=str(tmp_path)).start()
    try:
        async with RedisStorage(server.url, prefix=f"down-{uuid.uuid4().hex[:8]}") as st:
            await st.enqueue("q", [_job("before")])
            server.kill()
            bound = redis_module.SHIELD_LIMIT + 5
            with trio.fail_after(bound):
                with trio.move_on_after(0.3) as scope:
                    await st.enqueue("q", [_job("during")])
                assert scope.cancelled_caught
            with trio.fail_after(bound):
                with trio.move_on_after(0.3) as scope:
                    await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, "before", b"1", ttl=9)])
                assert scope.cancelled_caught
    finally:
        server.close()


@pytest.mark.parametrize("order", ["enqueue_then_cancel", "cancel_then_enqueue", "same_tick"])
async def test_cancelled_blocked_claim_never_loses_a_job(st: RedisStorage, order: str) -> None:
    for round_ in range(8):
        job_id = f"{order}-{round_}"
        result: list = []

        async def claimer(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as cs:
                task_status.started(cs)
                result.extend(await st.dequeue("q", "w1", 10, 10, 30))

        async with trio.open_nursery() as n:
            cs = await n.start(claimer)
            await _wait_until(lambda: _is_blocked(st))
            if order == "enqueue_then_cancel":
                await st.enqueue("q", [_job(job_id)])
                cs.cancel()
            elif order == "cancel_then_enqueue":
                cs.cancel()
                await st.enqueue("q", [_job(job_id)])
            else:
                n.start_soon(st.enqueue, "q", [_job(job_id)])
                await trio.lowlevel.checkpoint()
                cs.cancel()
        # no client is left blocked on the server
        await _wait_until(lambda: _not_blocked(st))
        if result:
            assert [c.id for c in result] == [job_id]
            assert await st.settle("q", "w1", [_done(result[0], ttl=1)]) == [True]
            continue
        # reconcile as the Queue does at start/shutdown, then another worker gets it
        held = await st.held_jobs("q", "w1")
        assert held in ([], [job_id])
        assert await st.release("q", "w1", held) == len(held)
        claims = await st.dequeue("q", "w2", 10, 2, 30)
        # attempt 2 if the cancelled claim counted one (attempts never go back), else 1
        assert [c.id for c in claims] == [job_id] and claims[0].attempts in (1, 2), (order, round_)
        assert await st.settle("q", "w2", [_done(claims[0], ttl=1)]) == [True]
        assert await st.held_jobs("q", "w1") == []


async def test_a_running_queue_runs_the_lean_clients_watchdog_until_it_stops(st: RedisStorage) -> None:
    """The request timeout of the lean client's calls is enforced by its watchdog while
    a Queue runs (then its calls need no cancel scope), and by each call without one."""
    from trioqueue import Queue

    watch = st._transport._client._watch  # type: ignore[union-attr]
    assert watch.active == 0
    async with Queue(st, name="wd") as q1, Queue(st, name="wd2"):
        assert watch.active == 2
        await q1.enqueue("a", 1)
    assert watch.active == 0
    assert (await st.enqueue("wd", [_job("b")]))[0].status == "queued"  # scoped calls still work


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "glide"])
async def test_a_batch_of_reads_waits_out_a_server_that_cannot_serve_yet(lean: bool) -> None:
    """The reaper reads a queue's workers with two commands in one round trip. A server
    that cannot serve for a while (loading its AOF after a restart answers LOADING; here a
    replica cut off from its primary answers MASTERDOWN, which is as transient) put its
    error replies in the list of replies, and the reaper crashed on them (TypeError: the
    AOF restart test failed about one run in five). The batch waits, as one command does."""
    from trioqueue.storage.redis._storage import open_transport
    from trioqueue._drivers.resp._transport import ConnParams

    server = RedisServer()
    server.start()
    woke = trio.Event()
    replies: list[list[object]] = []
    try:
        transport = open_transport(ConnParams(port=server.port), lean=lean, retry_timeout=30, on_fault=woke.set)
        await transport.connect()
        try:
            _raw(server.port, "SADD", "procs", "w1")
            _raw(server.port, "CONFIG", "SET", "replica-serve-stale-data", "no")
            _raw(server.port, "REPLICAOF", "127.0.0.1", str(free_port()))  # nobody there
            assert _raw(server.port, "SMEMBERS", "procs").startswith(b"-MASTERDOWN")

            async def reads() -> None:
                replies.append(await transport.commands([["SMEMBERS", "procs"], ["ZRANGEBYSCORE", "workers", "-inf", "+inf"]]))
                woke.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reads)
                with trio.fail_after(10):
                    await woke.wait()  # a fault seen (or, before the fix, the error replies returned)
                assert not replies, f"the error replies came back as values: {replies}"
                _raw(server.port, "REPLICAOF", "NO", "ONE")
            assert [[bytes(m) for m in r] for r in replies[0]] == [[b"w1"], []]
        finally:
            await transport.close()
    finally:
        server.close()


def _delayed(i: str, delay: float) -> NewJob:
    return NewJob(i, f"env-{i}".encode(), 3, 60.0, f"t-{i}", run_at=time.time() + delay)


async def test_a_blocked_claim_is_woken_at_a_due_time_not_by_its_timeout(redis_url: str) -> None:
    """A claim blocked while a delayed job is pending keeps its whole block chunk (a
    blocking command's own timeout fires at the server's next cron tick, up to 100 ms
    late on an idle server); a marker pushed at the due time wakes it, and its claim
    promotes and claims the job, dropping the marker."""
    st = RedisStorage(redis_url, prefix=_prefix(), block_chunk=5.0)
    blocks: list[float] = []
    async with st:
        move = st._transport.blocking_move_then

        async def recorded(src, dst, timeout, *rest):  # type: ignore[no-untyped-def]
            blocks.append(timeout)
            return await move(src, dst, timeout, *rest)

        st._transport.blocking_move_then = recorded  # type: ignore[method-assign]
        assert await st.dequeue("q", "w", 10, 0, 30) == []  # drained: the next dequeue blocks at once
        await st.enqueue("q", [_delayed("later", 0.2)])
        with trio.fail_after(10):
            claims = await st.dequeue("q", "w", 10, 10, 30)
        assert [(c.id, c.attempts) for c in claims] == [("later", 1)]
        assert len(blocks) >= 2 and all(b == 5.0 for b in blocks)  # none cut to the due time
        assert await _raw_list(st, "q", "queue") == []  # the marker went with the claim
        assert await st.held_jobs("q", "w") == ["later"]
        assert await st.settle("q", "w", [_done(claims[0])]) == [True]


async def test_a_claim_cancelled_before_the_due_time_pushes_no_marker(st: RedisStorage) -> None:
    """Cancelled while waiting for a due time: the timer goes with it (no marker is pushed
    later), nothing is claimed, and another worker claims the job once it is due."""
    await st.enqueue("q", [_delayed("soon", 0.15)])
    assert await st.dequeue("q", "w1", 10, 0, 30) == []
    with trio.CancelScope() as cs:

        async def cancel_when_blocked() -> None:
            await _wait_until(lambda: _is_blocked(st))
            cs.cancel()

        async with trio.open_nursery() as n:
            n.start_soon(cancel_when_blocked)
            await st.dequeue("q", "w1", 10, 10, 30)
    assert cs.cancelled_caught
    await _wait_until(lambda: _not_blocked(st))
    with trio.fail_after(10):
        claims: list = []
        while not claims:  # due in 0.15 s: the second worker's blocking claim wakes for it
            claims = await st.dequeue("q", "w2", 10, 5, 30)
    assert [(c.id, c.attempts) for c in claims] == [("soon", 1)]
    assert await _raw_list(st, "q", "queue") == []  # no marker from the cancelled claim's timer
    assert await st.held_jobs("q", "w1") == []
    assert await st.settle("q", "w2", [_done(claims[0])]) == [True]


async def _raw_list(st: RedisStorage, queue: str, name: str) -> list[bytes]:
    return list(await st._transport.command(["LRANGE", st._runner.key(queue, name), "0", "-1"]) or [])
