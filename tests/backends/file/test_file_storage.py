"""FileStorage-specific tests: real processes, crashes (SIGKILL), multi-process runs,
damaged files and id encoding. The storage conformance suite (tests/conformance/test_storage.py) runs
against FileStorage through the ``storage`` fixture."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest
import trio
import trioqueue

from trioqueue._core import encode_envelope
from trioqueue import CancelStatus
from trioqueue.storage import FileStorage, NewJob, Settlement, SettleKind, StorageEvent
from trioqueue.storage.file._fsutil import encode_name, read_rec
from support import HELPERS

HELPER = str(HELPERS / "fs_proc.py")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FileStorage needs Linux (inotify)")



async def events_until(
    events: trio.abc.ReceiveChannel[list[StorageEvent]], pred: Callable[[list[tuple[str, str, bytes | None]]], bool]
) -> list[tuple[str, str, bytes | None]]:
    """(kind, job id, result or error) of the events a subscription delivers, until
    ``pred`` holds for them (bounded)."""
    seen: list[tuple[str, str, bytes | None]] = []
    with trio.fail_after(30):
        while not pred(seen):
            seen += [(e.kind, e.job_id, e.result or e.error) for e in await events.receive()]
    return seen

def job(job_id: str, max_attempts: int = 3) -> NewJob:
    env = encode_envelope(job_id, b"{}", int(time.time() * 1000), 0, max_attempts, 60_000)
    return NewJob(job_id, env, max_attempts, 60.0, f"t-{job_id}")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(trioqueue.__file__).parent.parent)  # the trioqueue the tests import
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, HELPER, *args], stdout=subprocess.PIPE, env=_env(), start_new_session=True
    )


async def read_line(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    return await trio.to_thread.run_sync(proc.stdout.readline)


def all_files(root: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(root) for f in files]


# -- crashes ----------------------------------------------------------------------------


async def test_killed_consumer_job_is_recovered(tmp_path: Path) -> None:
    d = str(tmp_path / "store")
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("j1")])
        proc = spawn("consume-and-hang", d, "q", "w-doomed", "0.5", "0.5")
        try:
            line = await read_line(proc)
            assert line.split() == [b"CLAIMED", b"j1"]
            assert await st.held_jobs("q", "w-doomed") == ["j1"]
            assert (await st.get_job("q", "j1")).state.startswith("processing:")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # The reaper's loop: recover, else sleep until the next deadline it reports.
        with trio.fail_after(10):
            while True:
                recovered, next_deadline = await st.recover_stalled("q")
                if recovered:
                    break
                assert next_deadline is not None
                await trio.sleep(max(next_deadline - time.time(), 0.0) + 0.01)
        assert recovered == [("j1", "requeued")]
        assert await st.held_jobs("q", "w-doomed") == []
        claims = await st.dequeue("q", "w2", 1, 5.0, 30.0)
        assert [c.id for c in claims] == ["j1"] and claims[0].attempts == 2
        settled = Settlement(SettleKind.COMPLETE, "j1", b"42", ttl=60, token=claims[0].token)
        assert await st.settle("q", "w2", [settled]) == [True]
        rec = await st.get_job("q", "j1")
        assert rec.state.startswith("completed:") and rec.result == b"42" and rec.attempts == 2


async def test_killed_producer_loses_no_acknowledged_job(tmp_path: Path) -> None:
    d = tmp_path / "store"
    proc = spawn("produce-forever", str(d), "q", "p")
    try:
        assert (await read_line(proc)).strip() == b"READY"
        ids: list[str] = []
        with trio.fail_after(20):
            while len(ids) < 300:
                ids.append((await read_line(proc)).decode().strip())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.stdout is not None
    rest = proc.stdout.read().decode()
    ids += [line for line in rest.split("\n")[:-1] if line]  # a last partial line is not acknowledged
    async with FileStorage(d) as st:
        for job_id in ids:
            rec = await st.get_job("q", job_id)
            assert rec is not None and rec.state.startswith("queued:"), job_id
        claims = await st.dequeue("q", "w", len(ids) + 10, 0, 30.0)
        got = [c.id for c in claims]
        assert got[: len(ids)] == ids  # FIFO, nothing lost (maybe one more, never acknowledged)
        assert len(got) <= len(ids) + 1
    files = all_files(d)
    assert not [f for f in files if f.name.startswith(".tmp-")]
    for f in files:
        if f.parent.name == "jobs":
            assert read_rec(str(f), f.name) is not None  # every record parses


async def test_two_producers_two_consumers(tmp_path: Path) -> None:
    n = 20_000
    d = str(tmp_path / "store")
    flag = str(tmp_path / "producers-done")
    async with FileStorage(d) as st:  # create the directory before the processes race for it
        await st.workers("q")
    consumers = [spawn("consume", d, "q", f"c{i}", flag) for i in range(2)]
    producers = [spawn("produce", d, "q", f"p{i}", str(n // 2), "100") for i in range(2)]
    try:
        with trio.fail_after(45):
            for p in producers:
                assert await trio.to_thread.run_sync(p.wait) == 0
            Path(flag).touch()
            outs = [await trio.to_thread.run_sync(c.communicate) for c in consumers]
            for c in consumers:
                assert c.returncode == 0
    finally:
        for p in [*producers, *consumers]:
            if p.poll() is None:
                p.kill()
                p.wait()
    done = [line for out, _ in outs for line in out.decode().split("\n") if line]
    assert len(done) == n
    assert set(done) == {f"p{i}-{k}" for i in range(2) for k in range(n // 2)}
    assert all(len(out.decode().split()) > 0 for out, _ in outs)
    async with FileStorage(d) as st:
        for job_id in ("p0-0", "p1-9999", "p0-5000"):
            rec = await st.get_job("q", job_id)
            assert rec.state.startswith("completed:") and rec.attempts == 1


# -- bad input and damage ---------------------------------------------------------------

ODD_IDS = ["../etc/passwd", "a/b/../../c", "/abs", ".", "..", "", "ünïcødé ✓ 日本語 🎉", "x" * 1024, "é" * 600, "sp ace\ttab\n"]


async def test_odd_ids_stay_inside_and_round_trip(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    d = outer / "store"
    async with FileStorage(d) as st:
        out = await st.enqueue("../q/evil", [job(i) for i in ODD_IDS])
        assert [o.status for o in out] == ["queued"] * len(ODD_IDS)
        await st.heartbeat("../q/evil", "../w/" + "z" * 500, 30, [], 30)
        assert set(await st.workers("../q/evil")) == {"../w/" + "z" * 500}
        claims = await st.dequeue("../q/evil", "../w/" + "z" * 500, 100, 0, 30)
        assert [c.id for c in claims] == ODD_IDS
        assert sorted(await st.held_jobs("../q/evil", "../w/" + "z" * 500)) == sorted(ODD_IDS)
        for i in ODD_IDS:
            assert (await st.get_job("../q/evil", i)).id == i
    assert os.listdir(outer) == ["store"]
    assert not (tmp_path / "etc").exists()
    for f in all_files(tmp_path):
        assert f.resolve().is_relative_to(d.resolve())
        assert len(f.name.encode()) <= 255
        assert "passwd" not in f.name


async def test_corrupt_job_file_is_quarantined(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st, st.subscribe("q") as events:
        # Its own call: a batch shares one segment file, and damage to it hits the batch.
        await st.enqueue("q", [job("bad")])
        await st.enqueue("q", [job("good1")])
        qdir = d / "q" / encode_name("q")
        (qdir / "jobs" / encode_name("bad")).write_bytes(b"\x00garbage\xff" * 10)
        (qdir / "ready" / "not-a-marker").write_bytes(b"junk")
        await st.enqueue("q", [job("good2")])
        claims = await st.dequeue("q", "w", 10, 1.0, 30)
        assert [c.id for c in claims] == ["good1", "good2"]
        assert len(os.listdir(qdir / "quarantine")) == 2
        assert await st.get_job("q", "bad") is None
        seen: list[str] = []
        with trio.fail_after(5):
            while len([e for e in seen if e.startswith("error:")]) < 2:
                seen += [f"{e.kind}:{e.job_id}" for e in await events.receive()]
        assert f"error:{encode_name('bad')}" in seen and "error:not-a-marker" in seen
        assert "quarantined" in caplog.text
        # Consumers keep going.
        await st.enqueue("q", [job("good3")])
        assert [c.id for c in await st.dequeue("q", "w", 10, 1.0, 30)] == ["good3"]


async def test_start_cleans_temp_files_and_restores_missing_markers(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("a"), job("b")])
    qdir = d / "q" / encode_name("q")
    # A crash mid-write (dead pid), and a crash between the record write and its marker.
    (qdir / "jobs" / ".tmp-999999999-0-0").write_bytes(b"half")
    for m in os.listdir(qdir / "ready"):
        if m.endswith(encode_name("a")):
            os.unlink(qdir / "ready" / m)
    async with FileStorage(d) as st:
        assert not [f for f in all_files(d) if f.name.startswith(".tmp-")]
        assert sorted(c.id for c in await st.dequeue("q", "w", 10, 0, 30)) == ["a", "b"]



async def test_markers_an_enqueue_does_not_flush_are_restored_at_start(tmp_path: Path) -> None:
    # An enqueue's group commit flushes the segment and jobs/, not the lanes nor delayed/:
    # a power cut may lose a marker (never the record naming it), and the start-up repair
    # puts it back from the record, in its place in the FIFO.
    d = tmp_path / "store"
    later = time.time() + 3600
    async with FileStorage(d) as st:
        jobs = [job("a"), job("b")._replace(priority=2), job("c")._replace(group="g1"), job("late")._replace(run_at=later)]
        await st.enqueue("q", jobs)
    qdir = d / "q" / encode_name("q")
    lost = [m for m in all_files(qdir / "ready") + all_files(qdir / "delayed") if m.is_file() and "ring" not in m.parts]
    assert len(lost) == 4
    for m in lost:
        os.unlink(m)
    async with FileStorage(d) as st:
        got = [c.id for c in await st.dequeue("q", "w", 10, 0, 30)]
        assert got[0] == "b" and sorted(got) == ["a", "b", "c"]  # priority 2 first
        assert (await st.get_job("q", "late")).state.startswith("delayed")
        assert len([m for m in all_files(qdir / "delayed") if m.is_file()]) == 1



async def test_an_expiry_entry_a_power_cut_lost_is_rebuilt_at_start(tmp_path: Path) -> None:
    # A settlement flushes its segment and jobs/, not expiry/: a power cut may lose the
    # expiry entry of a result with a TTL (never the record). The start-up repair links it
    # back, so the result still goes once due.
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("a"), job("b")])
        claims = await st.dequeue("q", "w", 2, 0, 30)
        assert await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, c.id, b"1", ttl=600, token=c.token) for c in claims])
    qdir = d / "q" / encode_name("q")
    entries = os.listdir(qdir / "expiry")
    assert len(entries) == 1
    os.unlink(qdir / "expiry" / entries[0])
    async with FileStorage(d) as st:
        (entry,) = os.listdir(qdir / "expiry")
        ino = os.stat(qdir / "expiry" / entry).st_ino
        assert ino == os.stat(qdir / "jobs" / encode_name("a")).st_ino == os.stat(qdir / "jobs" / encode_name("b")).st_ino
        assert (await st.get_job("q", "a")).state.startswith("completed")
        q = st._core.q("q")
        with st._core.locked(q):
            q.begin()
            try:
                st._core.clean_expired(q, time.time() + 3600)  # an hour later: both results are due
            finally:
                q.end()
        assert await st.get_job("q", "a") is None and await st.get_job("q", "b") is None


# -- cross-process notifications and locks ----------------------------------------------


async def test_events_and_wakeups_cross_processes(tmp_path: Path) -> None:
    d = str(tmp_path / "store")
    async with FileStorage(d) as st, st.subscribe("q") as events:
        async with trio.open_nursery() as nursery:
            got: list[str] = []

            async def consumer() -> None:
                claims = await st.dequeue("q", "w", 5, 10.0, 30)  # blocked until the producer writes
                got.extend(c.id for c in claims)

            nursery.start_soon(consumer)
            await trio.sleep(0)
            p = spawn("produce", d, "q", "x", "3", "3")
            assert await trio.to_thread.run_sync(p.wait) == 0
        assert got == ["x-0", "x-1", "x-2"]
        seen: list[StorageEventKey] = []
        with trio.fail_after(5):
            while len([k for k in seen if k[0] == "enqueued"]) < 3:
                seen += [(e.kind, e.job_id) for e in await events.receive()]
        assert [k for k in seen if k[0] == "enqueued"] == [("enqueued", f"x-{i}") for i in range(3)]


StorageEventKey = tuple[str, str]


@pytest.mark.parametrize("group", ["tenant-1", None], ids=["grouped", "ungrouped"])
async def test_a_job_another_process_enqueues_wakes_the_waiting_worker_at_once(tmp_path: Path, group: str | None) -> None:
    """A producer process enqueueing jobs one at a time, each after the worker (this
    process, a Queue) started the one before: each starts through inotify, not when
    the safety-net rescan comes round (here an hour: never within the test's guard)."""
    from trioqueue import Job, Queue

    d = str(tmp_path / "store")
    started: dict[str, trio.Event] = {f"j-{i}": trio.Event() for i in range(4)}

    async def handler(job: Job[Any]) -> None:
        started[job.id].set()

    storage = FileStorage(d, rescan_interval=3600.0)
    async with Queue(storage, name="q", handler=handler, block_timeout=3600.0):
        p = subprocess.Popen(
            [sys.executable, HELPER, "produce-from-stdin", d, "q", group or "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_env(),
            start_new_session=True,
        )
        assert p.stdin is not None
        try:
            with trio.fail_after(30):
                assert await read_line(p) == b"READY\n"
            for jid, event in started.items():
                p.stdin.write(f"{jid}\n".encode())
                p.stdin.flush()
                with trio.fail_after(30):
                    assert await read_line(p) == f"ENQUEUED {jid}\n".encode()
                with trio.fail_after(5):  # (the rescan: an hour)
                    await event.wait()
        finally:
            p.stdin.close()
            await trio.to_thread.run_sync(p.wait)
            assert p.returncode == 0




async def test_leader_lock_across_instances(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as a, FileStorage(d) as b:
        assert await a.acquire_lock("reaper", "A", 30)
        assert not await b.acquire_lock("reaper", "B", 30)
        assert await a.acquire_lock("reaper", "A", 30)
        assert not await b.release_lock("reaper", "B")
        assert await a.release_lock("reaper", "A")
        assert await b.acquire_lock("reaper", "B", 0.05)
        await trio.sleep(0.1)  # the TTL is what is tested here
        assert await a.acquire_lock("reaper", "A", 30)


# -- crash windows of the segment layout (the helper dies with os._exit at an exact point) --


def crash(scenario: str, d: Path) -> None:
    proc = spawn("crash", scenario, str(d), "q")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 137, (proc.returncode, out)


def assert_consistent(d: Path) -> None:
    files = all_files(d)
    assert not [f for f in files if f.name.startswith(".tmp-")]
    for f in files:
        if f.parent.name == "jobs":
            assert read_rec(str(f), f.name) is not None


@pytest.mark.parametrize("scenario", ["enqueue-after-segment", "enqueue-mid-records", "enqueue-after-records"])
async def test_enqueue_killed_between_segment_and_links(tmp_path: Path, scenario: str) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("before")])
    crash(scenario, d)
    async with FileStorage(d) as st:
        assert_consistent(d)
        # Nothing was acknowledged: each job is either absent or fully queued (repair
        # linked the ready marker of those whose record was linked), never half there.
        present = [i for i in ("e1", "e2", "e3") if await st.get_job("q", i) is not None]
        expected = {"enqueue-after-segment": [], "enqueue-mid-records": ["e1"], "enqueue-after-records": ["e1", "e2", "e3"]}
        assert present == expected[scenario]
        for i in present:
            assert (await st.get_job("q", i)).state.startswith("queued:")
        out = await st.enqueue("q", [job(i) for i in ("e1", "e2", "e3")])
        assert [o.status for o in out] == ["duplicate" if i in present else "queued" for i in ("e1", "e2", "e3")]
        claims = await st.dequeue("q", "w", 10, 0, 30)
        assert [c.id for c in claims] == ["before", *present, *[i for i in ("e1", "e2", "e3") if i not in present]]
        assert all(c.attempts == 1 for c in claims)


async def test_consumer_killed_between_claim_and_record(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("a"), job("b")])
    crash("claim-before-records", d)
    async with FileStorage(d) as st:
        assert sorted(await st.held_jobs("q", "wc")) == ["a", "b"]
        assert (await st.get_job("q", "a")).state.startswith("queued:")
        recovered, _ = await st.recover_stalled("q")
        assert recovered == []  # the claim never happened: undone, no attempt counted
        assert await st.held_jobs("q", "wc") == []
        claims = await st.dequeue("q", "w", 10, 0, 30)
        assert [(c.id, c.attempts) for c in claims] == [("a", 1), ("b", 1)]


async def test_consumer_killed_between_settle_record_and_links(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("r1"), job("c1")])
    crash("settle-after-records", d)
    async with FileStorage(d) as st:  # start-up repair restores the retry's delayed/ link
        assert_consistent(d)
        rec = await st.get_job("q", "c1")
        assert rec.state.startswith("completed:") and rec.result == b"42"
        assert (await st.get_job("q", "r1")).state.startswith("failing:")
        await trio.sleep(0.3)  # the dead worker's heartbeat expires
        recovered, _ = await st.recover_stalled("q")
        assert recovered == []  # both were settled: only stale proc entries to drop
        assert await st.held_jobs("q", "wc") == []
        claims = await st.dequeue("q", "w", 10, 0, 30)
        assert [(c.id, c.attempts) for c in claims] == [("r1", 2)]
        assert (await st.get_job("q", "c1")).state.startswith("completed:")


# -- event log rotation (issue 8, item 8) ------------------------------------------------------


async def test_waiters_get_every_result_across_event_log_rotations(tmp_path: Path) -> None:
    """``enqueue_and_wait`` hung once the event log rotated: completions after a rotation
    never reached their waiters. ~300-byte results through a 64 KiB log: many rotations."""
    from trioqueue import Queue

    blob = "x" * 300
    st = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=64 << 10)
    async with Queue(st, name="rot", handler=lambda job: {"n": job.payload, "pad": blob}, concurrency=8) as q:
        results: dict[int, int] = {}

        async def requester(start: int) -> None:
            for n in range(start, 1500, 10):
                results[n] = (await q.enqueue_and_wait(f"j{n}", n, timeout=30))["n"]

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for k in range(10):
                    nursery.start_soon(requester, k)
    assert results == {n: n for n in range(1500)}
    rotations = [line for line in (tmp_path / "d").rglob("events")]
    assert rotations and all(p.stat().st_size < 2 * (64 << 10) for p in rotations)


async def test_subscribers_miss_no_event_across_rotations(tmp_path: Path) -> None:
    """A subscriber of another FileStorage instance (as another process would be) gets
    every event, in order, across many rotations, and no resync; a cancel right after a
    rotation is delivered too."""
    writer = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    reader = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    async with writer, reader, reader.subscribe("q") as events:
        for i in range(300):
            await writer.enqueue("q", [job(f"e{i:03}")])
        assert await writer.cancel("q", "e299") is CancelStatus.CANCELLED
        seen = await events_until(events, lambda s: ("cancelled", "e299", None) in s)
    assert [j for k, j, _ in seen if k == "enqueued"] == [f"e{i:03}" for i in range(300)]
    assert ("resync", "", None) not in seen


async def test_a_reader_left_behind_by_a_whole_log_file_gets_a_resync(tmp_path: Path) -> None:
    st = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    async with st:
        q = st._core.q("q")
        async with st.subscribe("q") as events:
            # Rotate twice while the subscriber cannot run: the middle file is never read.
            for gen in (1, 2):
                for i in range(60):
                    st._core.publish(q, [StorageEvent("enqueued", f"g{gen}-{i}", token="t" * 40)])
                q.events_written = 1 << 30  # force the size check on the next publish
                st._core.publish(q, [StorageEvent("enqueued", f"g{gen}-last")])
            st._core.publish(q, [StorageEvent("enqueued", "after")])
            seen: list[str] = []
            with trio.fail_after(10):
                while "after" not in seen:
                    seen += [e.job_id or e.kind for e in await events.receive()]
    assert "resync" in seen


# -- the Trio loop never waits on the file lock (issue 8, item 9) -------------------------------


def _hold_queue_lock(directory: Path, queue: str) -> int:
    """Take the queue's flock through a descriptor of our own, as another process would."""
    from trioqueue.storage.file._fsutil import encode_name

    fd = os.open(directory / "q" / encode_name(queue) / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_contended_lock_leaves_the_loop_running(tmp_path: Path) -> None:
    st = FileStorage(tmp_path / "d", fsync=False)
    async with st:
        await st.enqueue("q", [job("first")])  # creates the queue's files
        holder = _hold_queue_lock(tmp_path / "d", "q")
        safety = threading.Timer(5.0, fcntl.flock, (holder, fcntl.LOCK_UN))  # old code: unblock eventually
        safety.start()
        ticks = 0
        ticking = trio.Event()
        enqueued = trio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await trio.sleep(0.01)
                ticks += 1
                if ticks >= 10:
                    ticking.set()

        async def producer() -> None:
            await st.enqueue("q", [job("second")])
            enqueued.set()

        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ticker)
                    nursery.start_soon(producer)
                    await ticking.wait()  # the loop runs while the lock is held elsewhere...
                    assert not enqueued.is_set()  # ...and the enqueue waits for it
                    fcntl.flock(holder, fcntl.LOCK_UN)
                    await enqueued.wait()
                    nursery.cancel_scope.cancel()
        finally:
            safety.cancel()
            os.close(holder)
        rec = await st.get_job("q", "second")
        assert rec is not None and rec.state.startswith("queued")


async def test_enqueue_waiting_for_the_lock_can_be_cancelled_and_writes_nothing(tmp_path: Path) -> None:
    st = FileStorage(tmp_path / "d", fsync=False)
    async with st:
        await st.enqueue("q", [job("first")])
        holder = _hold_queue_lock(tmp_path / "d", "q")
        try:
            with trio.move_on_after(0.2) as scope:
                await st.enqueue("q", [job("never")])
            assert scope.cancelled_caught
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)
            os.close(holder)
        assert await st.get_job("q", "never") is None
        # The coalescer is not wedged: the next enqueue goes through.
        with trio.fail_after(10):
            assert [o.status.value for o in await st.enqueue("q", [job("next")])] == ["queued"]


async def test_opening_a_big_store_leaves_the_loop_running(tmp_path: Path) -> None:
    st = FileStorage(tmp_path / "d", fsync=False)
    async with st:
        for start in range(0, 4_000, 2_000):  # (the scan runs in a thread: any size shows it)
            await st.enqueue("q", [job(f"j{i}") for i in range(start, start + 2_000)])
    ticks = 0
    opened = trio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not opened.is_set():
            await trio.sleep(0)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async with FileStorage(tmp_path / "d", fsync=False):  # start-up repair scans every job
            opened.set()
    assert ticks > 1  # the loop kept running during the scan


async def test_enqueues_carried_by_a_cancelled_group_all_return(tmp_path: Path) -> None:
    """Ctrl-C during a busy demo hung: a call whose group was carried by another call that
    was waiting for the lock waited (shielded) for a write that the cancelled carrier gave
    back instead of doing."""
    st = FileStorage(tmp_path / "d", fsync=False)
    async with st:
        await st.enqueue("q", [job("first")])
        q = st._core.q("q")
        for round_ in range(20):  # Trio shuffles which cancelled task runs first: both orders
            scopes = [trio.CancelScope() for _ in range(4)]

            async def call(k: int, job_id: str) -> None:
                with scopes[k]:
                    await st.enqueue("q", [job(job_id)])

            with trio.fail_after(10):  # a deadlock hangs here (or forever: the wait is shielded)
                async with q.trio_lock(), trio.open_nursery() as nursery:  # the lock is busy
                    nursery.start_soon(call, 0, f"lead{round_}")  # carries the group [lead]
                    await trio.testing.wait_all_tasks_blocked()
                    for i in range(3):  # they queue behind it
                        nursery.start_soon(call, i + 1, f"c{round_}-{i}")
                    await trio.testing.wait_all_tasks_blocked()
                    scopes[0].cancel()  # the carrier gives up; the next one carries the other two
                    await trio.testing.wait_all_tasks_blocked()
                    for scope in scopes[1:]:  # ...and all of them are cancelled at once
                        scope.cancel()
        assert all([await st.get_job("q", f"c{r}-{i}") is None for r in range(20) for i in range(3)])
        assert (await st.enqueue("q", [job("after")]))[0].status.value == "queued"


async def test_tree_notes_a_cancelled_call_was_waiting_to_act_on_are_acted_on_by_the_next_call(tmp_path: Path) -> None:
    """A settle cancelled while it waits for the parent's queue lock to act on the note
    its child's end left there leaves that queue to the next call, not to the reaper."""
    from trioqueue.storage._base import FlowJob

    st = FileStorage(tmp_path / "d", fsync=False)
    async with st:
        await st.enqueue_flow([FlowJob("P", job("parent")), FlowJob("C", job("child"), ("P", "parent"))])
        [c] = await st.dequeue("C", "w", 1, 0, 30)
        p = st._core.q("P")
        waiting = p.trio_lock().statistics
        async with trio.open_nursery() as nursery:
            async with st._core.alock(p):  # the parent's queue is busy
                settled = trio.Event()

                async def settle() -> None:
                    await st.settle("C", "w", [Settlement(SettleKind.COMPLETE, c.id, b"r", ttl=60, token=c.token)])
                    settled.set()

                nursery.start_soon(settle)
                while waiting().tasks_waiting == 0:  # until the settle waits for P's lock
                    await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
        assert not settled.is_set()
        rec = await st.get_job("C", "child")
        assert rec is not None and rec.state.startswith("completed"), rec  # the child's end was written
        assert await st.dequeue("other", "w", 1, 0, 30) == []  # a next call: no reaper pass in between
        rec = await st.get_job("P", "parent")
        assert rec is not None and rec.state.startswith("queued"), rec
