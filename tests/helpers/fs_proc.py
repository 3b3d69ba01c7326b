"""Subprocess entry points for tests/backends/file/test_file_storage.py (raw FileStorage API).

    python fs_proc.py consume-and-hang DIR QUEUE WORKER LEASE TTL
    python fs_proc.py produce-forever DIR QUEUE PREFIX
    python fs_proc.py produce DIR QUEUE PREFIX COUNT BATCH
    python fs_proc.py produce-from-stdin DIR QUEUE GROUP
    python fs_proc.py consume DIR QUEUE WORKER DONE_FLAG
    python fs_proc.py crash SCENARIO DIR QUEUE

``crash`` dies with ``os._exit`` (like a SIGKILL: no clean-up runs) at an exact point of a
write, to test the repair of each crash window (see the scenarios below).
"""

from __future__ import annotations

import os
import sys
import time

import trio

from trioqueue._core import encode_envelope
from trioqueue.storage import FileStorage, NewJob, Settlement, SettleKind
from trioqueue.storage.file._base import FileCore


def job(job_id: str, group: str | None = None) -> NewJob:
    env = encode_envelope(job_id, b"{}", int(time.time() * 1000), 0, 3, 60_000)
    return NewJob(job_id, env, 3, 60.0, f"t-{job_id}", group=group)


async def consume_and_hang(directory: str, queue: str, worker: str, lease: float, ttl: float) -> None:
    async with FileStorage(directory) as st:
        await st.heartbeat(queue, worker, ttl, [], lease)
        claims = await st.dequeue(queue, worker, 1, 30.0, lease)
        print("CLAIMED", claims[0].id if claims else "", flush=True)
        await trio.sleep_forever()


async def produce_forever(directory: str, queue: str, prefix: str) -> None:
    async with FileStorage(directory) as st:
        print("READY", flush=True)
        i = 0
        while True:
            jid = f"{prefix}-{i}"
            await st.enqueue(queue, [job(jid)])
            sys.stdout.write(jid + "\n")
            sys.stdout.flush()
            i += 1


async def produce(directory: str, queue: str, prefix: str, count: int, batch: int) -> None:
    async with FileStorage(directory) as st:
        for start in range(0, count, batch):
            ids = [f"{prefix}-{i}" for i in range(start, min(count, start + batch))]
            out = await st.enqueue(queue, [job(i) for i in ids])
            assert all(o.status == "queued" for o in out), out


async def produce_from_stdin(directory: str, queue: str, group: str) -> None:
    """One job per id read from stdin (in ``group``; ``-``: none), one enqueue each."""
    async with FileStorage(directory) as st:
        print("READY", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            jid = line.strip()
            [out] = await st.enqueue(queue, [job(jid, None if group == "-" else group)])
            assert out.status == "queued", out
            print("ENQUEUED", jid, flush=True)


async def consume(directory: str, queue: str, worker: str, done_flag: str) -> None:
    done = []
    async with FileStorage(directory) as st:
        await st.heartbeat(queue, worker, 60.0, [], 60.0)
        while True:
            claims = await st.dequeue(queue, worker, 100, 0.2, 60.0)
            if not claims:
                if not os.path.exists(done_flag):
                    continue
                # Producers are done: drain what is left, then stop.
                claims = await st.dequeue(queue, worker, 100, 0, 60.0)
                if not claims:
                    break
            ok = await st.settle(
                queue, worker, [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=600.0, token=c.token) for c in claims]
            )
            assert all(ok)
            done.extend(c.id for c in claims)
        await st.unregister_worker(queue, worker)
    sys.stdout.write("\n".join(done) + "\n")


def _die() -> None:
    sys.stdout.flush()
    os._exit(137)


_SETTLE_PAIRS = {
    "settle-after-records": (
        (SettleKind.RETRY, "r1", b"err", 0.0, 0.0),
        (SettleKind.COMPLETE, "c1", b"42", 60, 0.0),
    ),
    "sleep-after-records": (
        (SettleKind.SLEEP, "s1", b"", 0.0, 60.0),
        (SettleKind.RATE_LIMITED, "l1", b"", 0.0, 60.0),
    ),
}  # scenario -> (kind, job, data, ttl, delay) of its two settlements


def _die_after_commit() -> None:
    """Die right after the next step's records are committed (re-pointed)."""
    orig_commit = FileCore.commit

    def commit(*a, **k):  # type: ignore[no-untyped-def]
        orig_commit(*a, **k)
        _die()

    FileCore.commit = commit  # type: ignore[method-assign]


async def crash(scenario: str, directory: str, queue: str) -> None:
    """Die inside a write. The parent prepared the queue (see test_file_storage.py)."""
    import trioqueue.storage.file._base as fmod  # where segments are written and linked

    st = FileStorage(directory)
    await st.open()
    if scenario == "enqueue-after-segment":
        # Segment written under its temp name, no name linked yet.
        orig_ws = fmod.write_segment

        def ws(*a, **k):  # type: ignore[no-untyped-def]
            orig_ws(*a, **k)
            _die()

        fmod.write_segment = ws
        await st.enqueue(queue, [job("e1"), job("e2"), job("e3")])
    elif scenario == "enqueue-after-records":
        # jobs/<id> linked for every job, no ready/ marker yet.
        FileCore.link_marker = lambda *a: _die()  # type: ignore[method-assign]
        await st.enqueue(queue, [job("e1"), job("e2"), job("e3")])
    elif scenario == "enqueue-mid-records":
        # Killed after the first job's jobs/<id> link, before the others'.
        orig_rl = fmod.os.link
        calls = [0]

        def link(src, dst, *a, **k):  # type: ignore[no-untyped-def]
            if os.path.basename(os.path.dirname(dst)) == "jobs" and not os.path.basename(dst).startswith("."):
                calls[0] += 1
                if calls[0] == 2:
                    _die()
            return orig_rl(src, dst, *a, **k)

        fmod.os.link = link  # type: ignore[assignment]
        await st.enqueue(queue, [job("e1"), job("e2"), job("e3")])
    elif scenario == "claim-before-records":
        # Jobs renamed into proc/<worker>/, records not yet rewritten as processing.
        await st.heartbeat(queue, "wc", 0.2, [], 0.2)
        FileCore.commit = lambda *a, **k: _die()  # type: ignore[method-assign]
        await st.dequeue(queue, "wc", 10, 0, 30.0)
    elif scenario in _SETTLE_PAIRS:
        # Records re-pointed to the settlement, delayed/ link, events and proc/ unlinks
        # not done: a retry and a completion, or a sleep and a rate limit.
        await st.heartbeat(queue, "wc", 0.2, [], 0.2)
        claims = await st.dequeue(queue, "wc", 10, 0, 30.0)
        kinds = _SETTLE_PAIRS[scenario]
        assert [c.id for c in claims] == [k[1] for k in kinds], claims
        _die_after_commit()
        await st.settle(
            queue, "wc", [Settlement(*k, token=c.token) for k, c in zip(kinds, claims)]  # type: ignore[misc]
        )
    elif scenario == "settle-after-events":
        # Records re-pointed and the events written, the proc/ entries not yet unlinked.
        await st.heartbeat(queue, "wc", 0.2, [], 0.2)
        claims = await st.dequeue(queue, "wc", 10, 0, 30.0)
        orig_publish = FileCore.publish

        def publish(*a, **k):  # type: ignore[no-untyped-def]
            orig_publish(*a, **k)
            _die()

        FileCore.publish = publish  # type: ignore[method-assign]
        await st.settle(queue, "wc", [Settlement(SettleKind.COMPLETE, c.id, b"42", ttl=60, token=c.token) for c in claims])
    elif scenario == "reap-after-records":
        # A stalled job out of attempts: its record re-pointed as failed by the reaper,
        # the events not written, the proc/ entry not dropped.
        await st.heartbeat(queue, "wc", 0.05, [], 0.05)
        claims = await st.dequeue(queue, "wc", 10, 0, 0.05)
        assert [c.id for c in claims] == ["s1"], claims
        while (await st.workers(queue)).get("wc"):
            await trio.sleep(0.02)  # the lease and the heartbeat expire (what is simulated)
        _die_after_commit()
        await st.recover_stalled(queue)
    raise SystemExit(f"scenario {scenario} did not crash")


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "consume-and-hang":
        trio.run(consume_and_hang, args[0], args[1], args[2], float(args[3]), float(args[4]))
    elif cmd == "produce-forever":
        trio.run(produce_forever, *args)
    elif cmd == "produce":
        trio.run(produce, args[0], args[1], args[2], int(args[3]), int(args[4]))
    elif cmd == "produce-from-stdin":
        trio.run(produce_from_stdin, *args)
    elif cmd == "consume":
        trio.run(consume, *args)
    elif cmd == "crash":
        trio.run(crash, *args)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
