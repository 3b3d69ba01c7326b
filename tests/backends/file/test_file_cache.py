"""FileStorage's per-process caches and the event order of settlements (issue 11): the
record cache (copies out; the generation and the segment identity catch every other
writer, including code that bumps no generation), lanes known to be empty, temp names in
``tmp/``, and the events a killed settler did not write."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from test_file_storage import all_files, crash, events_until, job
from trioqueue.storage import FileStorage, Settlement, SettleKind
from trioqueue.storage.file._fsutil import encode_name
from trioqueue.storage.file import _layout
from trioqueue.storage.file._layout import _SEQ_START, FileQueue

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FileStorage needs Linux (inotify)")


def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process write like the code before the generation existed."""
    monkeypatch.setattr(FileQueue, "bump", lambda self: None)


# -- events of settlements a crash interrupted ---------------------------------------------


async def test_settler_killed_before_its_events_the_reaper_announces_them(tmp_path: Path) -> None:
    """A kill -9 between re-pointing the records and writing the events lost the
    ``completed`` event (the proc entries went before the events): a waiter in
    ``enqueue_and_wait`` hung. Now the entries stay until the events are written, and the
    reaper announces what a dead settler did not."""
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("r1"), job("c1")])
    crash("settle-after-records", d)
    async with FileStorage(d) as st, st.subscribe("q") as events:
        recovered, _ = await st.recover_stalled("q")
        assert recovered == []  # nothing to recover: both were settled
        seen = await events_until(events, lambda s: ("completed", "c1", b"42") in s)
        # r1's retry (delay 0) was promoted first: it is queued again, its "failing" moot.
        assert [k for k in seen if k[0] in ("completed", "requeued")] == [("requeued", "r1", None), ("completed", "c1", b"42")]
        assert await st.held_jobs("q", "wc") == []
        await st.recover_stalled("q")  # the entries are gone: announced once
        await st.enqueue("q", [job("after")])
        seen = await events_until(events, lambda s: ("enqueued", "after", None) in s)
        assert [k for k in seen if k[0] in ("completed", "requeued")] == []


async def test_a_sleep_whose_settler_died_is_announced_as_sleeping_not_rate_limited(tmp_path: Path) -> None:
    """The reaper announced every delayed record a dead settler left as ``rate_limited``:
    a durable sleep (``SettleKind.SLEEP``) came back as a rate limit after a restart. The
    record now says which it was."""
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("s1"), job("l1")])
    crash("sleep-after-records", d)
    async with FileStorage(d) as st, st.subscribe("q") as events:
        await st.recover_stalled("q")
        seen = await events_until(events, lambda s: {"s1", "l1"} <= {j for _, j, _ in s})
    assert [(k, j) for k, j, _ in seen if j in ("s1", "l1")] == [("sleeping", "s1"), ("rate_limited", "l1")]


async def test_settler_killed_after_its_events_announced_again(tmp_path: Path) -> None:
    """Killed after writing the events but before dropping the proc entries: the reaper
    announces the settlement a second time (events are at-least-once)."""
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("c1")])
    async with FileStorage(d) as st, st.subscribe("q") as events:
        crash("settle-after-events", d)
        await st.recover_stalled("q")
        seen = await events_until(events, lambda s: s.count(("completed", "c1", b"42")) == 2)
        assert (await st.get_job("q", "c1")).state.startswith("completed:")
        assert await st.held_jobs("q", "wc") == []


# -- temp names ------------------------------------------------------------------------------


async def test_temp_names_live_in_tmp_and_dead_ones_are_removed_at_start(tmp_path: Path) -> None:
    d = tmp_path / "store"
    qdir = d / "q" / encode_name("q")
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("a"), job("b")])
        claims = await st.dequeue("q", "w", 1, 0, 30)
        await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, claims[0].id, b"", ttl=60, token=claims[0].token)])
        await st.enqueue("q", [job("c"), job("d")])
        names: list[str] = []
        orig_link, orig_rename = os.link, os.rename

        def link(src, dst, *a, **k):  # type: ignore[no-untyped-def]
            names.extend((os.fspath(src), os.fspath(dst)))
            return orig_link(src, dst, *a, **k)

        def rename(src, dst, *a, **k):  # type: ignore[no-untyped-def]
            names.extend((os.fspath(src), os.fspath(dst)))
            return orig_rename(src, dst, *a, **k)

        os.link, os.rename = link, rename  # type: ignore[assignment]
        try:
            claims = await st.dequeue("q", "w", 3, 0, 30)  # three re-points of one segment
        finally:
            os.link, os.rename = orig_link, orig_rename  # type: ignore[assignment]
        assert len(claims) == 3
        temps = {os.path.basename(os.path.dirname(p)) for p in names if os.path.basename(p).startswith(".tmp-")}
        assert temps == {"tmp"}
    (qdir / "tmp" / ".tmp-999999999-0-0").write_bytes(b"half")  # a dead process's
    (qdir / "jobs" / ".tmp-999999999-0-1").write_bytes(b"half")  # ... of the older layout
    async with FileStorage(d):
        assert not [f for f in all_files(d) if f.name.startswith(".tmp-")]


# -- the record cache ----------------------------------------------------------------------


async def test_the_record_cache_hands_out_copies(tmp_path: Path) -> None:
    async with FileStorage(tmp_path / "d") as st:
        await st.enqueue("q", [job("a")])
        q = st._core.q("q")
        assert encode_name("a") in q.recs
        async with st._core.alock(q):
            r1 = st._core.read(q, encode_name("a"))
            assert r1 is not None and r1 is not q.recs[encode_name("a")][0]
            r1.kind = "completed"
            r1.attempts = 99
            r2 = st._core.read(q, encode_name("a"))
        assert r2 is not None and (r2.kind, r2.attempts) == ("queued", 0)
        claims = await st.dequeue("q", "w", 1, 0, 30)
        assert [(c.id, c.attempts) for c in claims] == [("a", 1)]


async def test_terminal_records_are_not_cached_and_the_cache_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_layout, "_RECS_MAX", 4)
    async with FileStorage(tmp_path / "d") as st:
        await st.enqueue("q", [job(f"j{i}") for i in range(10)])
        q = st._core.q("q")
        assert sorted(q.recs) == sorted(encode_name(f"j{i}") for i in range(6, 10))  # the newest
        claims = await st.dequeue("q", "w", 10, 0, 30)
        assert [c.id for c in claims] == [f"j{i}" for i in range(10)]  # evicted ones read from disk
        await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, c.id, b"ok", ttl=60, token=c.token) for c in claims])
        assert q.recs == {} and q.recs_bytes == 0
        assert [(await st.get_job("q", f"j{i}")).result for i in range(10)] == [b"ok"] * 10


@pytest.mark.parametrize("generation", [True, False], ids=["new-code", "no-generation"])
async def test_the_record_cache_sees_another_writers_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generation: bool
) -> None:
    """Process A claimed a job (its processing record cached); B (another instance: its
    own caches) requests a cancel, which re-points the record. A must see it: through the
    generation, or, for a writer of the older code that bumps none, through the segment's
    identity."""
    d = tmp_path / "d"
    async with FileStorage(d) as a, FileStorage(d) as b:
        await a.enqueue("q", [job("x")])
        (c,) = await a.dequeue("q", "wa", 1, 0, 30)
        assert encode_name("x") in a._core.q("q").recs
        with monkeypatch.context() as m:
            if not generation:
                no_generation(m)
            assert (await b.cancel("q", "x")).value == "cancelled"
        assert (await a.heartbeat("q", "wa", 30, [("x", c.token)], 30)).cancel_requested == ["x"]
        # And a settlement B made of A's claim is seen too: A's own settle is fenced.
        with monkeypatch.context() as m:
            if not generation:
                no_generation(m)
            assert await b.settle("q", "wa", [Settlement(SettleKind.COMPLETE, "x", b"b", ttl=60, token=c.token)]) == [True]
        assert await a.settle("q", "wa", [Settlement(SettleKind.FAIL, "x", b"a", ttl=60, token=c.token)]) == [True]
        rec = await a.get_job("q", "x")
        assert rec.state.startswith("completed:") and rec.result == b"b"


async def test_the_generation_keeps_the_counters_of_the_lock_file(tmp_path: Path) -> None:
    """The generation sits after the two counters, which the older code reads and writes
    as the first 16 bytes: they stay right."""
    d = tmp_path / "d"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("a"), job("b")])
        data = (d / "q" / encode_name("q") / "lock").read_bytes()
        nxt, front, gen = struct.unpack("<QQQ", data[:24])
        assert (nxt, front) == (_SEQ_START + 2, _SEQ_START - 1) and gen >= 1
        await st.dequeue("q", "w", 1, 0, 30)
        assert struct.unpack("<Q", (d / "q" / encode_name("q") / "lock").read_bytes()[16:24])[0] > gen


# -- lanes known to be empty ---------------------------------------------------------------


def count_lane_listings(st: FileStorage, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lanes = set(st._core.q("q").lanes)
    listed: list[str] = []
    orig = os.listdir

    def listdir(path=None):  # type: ignore[no-untyped-def]
        if path in lanes:
            listed.append(path)
        return orig(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return listed


async def test_claims_do_not_list_lanes_known_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trioqueue.storage.file import _turns

    # (the safety re-listing after LANE_RECHECK is out of the way: claims that flush their
    # records' data take longer than 50 ms on a busy disk)
    monkeypatch.setattr(_turns, "LANE_RECHECK", 3600.0)
    async with FileStorage(tmp_path / "d") as st:
        await st.enqueue("q", [job(f"j{i}") for i in range(4)])
        listed = count_lane_listings(st, monkeypatch)
        await st.dequeue("q", "w", 1, 0, 30)
        assert len(listed) == 6  # lanes 0..4 empty, then the default lane
        del listed[:]
        for _ in range(3):
            await st.dequeue("q", "w", 1, 0, 30)
        assert listed == []  # known empty; the default lane's listing is cached
        await st.enqueue("q", [job("p2")._replace(priority=2)])
        assert [c.id for c in await st.dequeue("q", "w", 1, 0, 30)] == ["p2"]  # own marker: lane re-listed


async def test_a_marker_another_instance_adds_to_a_known_empty_lane_is_claimed(tmp_path: Path) -> None:
    d = tmp_path / "d"
    async with FileStorage(d) as a, FileStorage(d) as b:
        await a.enqueue("q", [job("low")])
        assert [c.id for c in await a.dequeue("q", "w", 1, 0, 30)] == ["low"]
        assert await a.dequeue("q", "w", 1, 0, 30) == []
        assert 1 in a._core.q("q").lane_empty
        await b.enqueue("q", [job("hi")._replace(priority=1)])
        assert [c.id for c in await a.dequeue("q", "w", 1, 0, 30)] == ["hi"]


async def test_a_blocked_claim_sees_a_marker_of_a_writer_without_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "d"
    async with FileStorage(d, rescan_interval=30) as a, FileStorage(d) as b:
        assert await a.dequeue("q", "w", 1, 0, 30) == []
        assert 1 in a._core.q("q").lane_empty
        got: list[str] = []
        async with trio.open_nursery() as n:

            async def consumer() -> None:
                got.extend(c.id for c in await a.dequeue("q", "w", 1, 20, 30))

            n.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            no_generation(monkeypatch)
            await b.enqueue("q", [job("hi")._replace(priority=1)])
        assert got == ["hi"]


def test_rec_copy_copies_every_field() -> None:
    from trioqueue.storage.file._fsutil import Rec

    r = Rec("a", "processing", 1, 2, 3, 4.0, 5, b"env", "mk", "w", 6.0, b"res", b"err", 7.0)
    r.token, r.claim, r.claims, r.started, r.progress, r.cancel_requested, r.priority = "t", "t.1", 1, True, b"p", True, 2
    c = r.copy()
    assert c is not r and all(getattr(c, n) == getattr(r, n) for n in Rec.__slots__)
    c.attempts = 9
    assert r.attempts == 2


def test_a_bump_outside_a_section_still_moves_the_generation(tmp_path: Path) -> None:
    q = FileQueue("q", str(tmp_path / "q"))
    try:
        q.bump()
        q.bump()
        data = (tmp_path / "q" / "lock").read_bytes()
        assert struct.unpack("<QQQ", data) == (_SEQ_START, _SEQ_START - 1, 2)
    finally:
        q.close()


async def test_delayed_known_empty_is_not_listed_but_a_retry_is_promoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "d"
    async with FileStorage(d) as a, FileStorage(d) as b:
        await a.enqueue("q", [job("x"), job("y")])
        q = a._core.q("q")
        listed: list[str] = []
        orig = os.listdir

        def listdir(path=None):  # type: ignore[no-untyped-def]
            if path == q.delayed:
                listed.append(path)
            return orig(path)

        monkeypatch.setattr(os, "listdir", listdir)
        (x,) = await a.dequeue("q", "w", 1, 0, 30)
        assert len(listed) == 1
        (y,) = await a.dequeue("q", "w", 1, 0, 30)
        assert len(listed) == 1  # known empty
        # A retry this process writes, due at once, is promoted by the next claim.
        await a.settle("q", "w", [Settlement(SettleKind.RETRY, "x", b"e", delay=0.0, token=x.token)])
        assert [c.id for c in await a.dequeue("q", "w", 1, 0, 30)] == ["x"]
        assert await a.dequeue("q", "w", 1, 0, 30) == []
        # ... and one another instance writes (the generation).
        await b.settle("q", "w", [Settlement(SettleKind.RETRY, "y", b"e", delay=0.0, token=y.token)])
        assert [c.id for c in await a.dequeue("q", "w", 1, 0, 30)] == ["y"]


async def test_two_writers_follow_each_others_log_rotations(tmp_path: Path) -> None:
    """Each writer notices a rotation made by the other (the log's inode it remembers
    differs from the path's) before it appends: no event goes to a file readers left."""
    a = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    b = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    reader = FileStorage(tmp_path / "d", fsync=False, event_log_max_bytes=4096)
    async with a, b, reader, reader.subscribe("q") as events:
        for i in range(200):
            await (a if i % 3 else b).enqueue("q", [job(f"e{i:03}")])
        seen = await events_until(events, lambda s: ("enqueued", "e199", None) in s)
    assert [j for k, j, _ in seen if k == "enqueued"] == [f"e{i:03}" for i in range(200)]
    assert ("resync", "", None) not in seen


async def test_an_enqueue_flushes_jobs_and_not_the_directories_of_its_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acknowledged = on disk: the group commit fsyncs the segment and jobs/, and no other
    directory; a marker a power cut loses is linked back from its record at start
    (test_markers_an_enqueue_does_not_flush_are_restored_at_start)."""
    import time

    from trioqueue.storage.file import _groupcommit

    flushed: list[set[str]] = []
    orig = _groupcommit._Batch.flush

    def flush(self: _groupcommit._Batch, syncfs_fd: int) -> None:
        flushed.append({os.path.relpath(os.readlink(f"/proc/self/fd/{d}"), qdir) for d in self.dirs})
        orig(self, syncfs_fd)

    monkeypatch.setattr(_groupcommit._Batch, "flush", flush)
    qdir = str(tmp_path / "d" / "q" / encode_name("q"))
    async with FileStorage(tmp_path / "d") as st:
        await st.enqueue("q", [job("a")])
        await st.enqueue("q", [job("b")._replace(priority=2)])
        await st.enqueue("q", [job("c")._replace(run_at=time.time() + 60), job("d")._replace(priority=0)])
    assert flushed == [{"jobs"}, {"jobs"}, {"jobs"}]


async def test_a_subscriber_of_some_kinds_skips_the_others_but_not_a_torn_line(tmp_path: Path) -> None:
    """Lines of unwanted kinds are skipped unparsed; a line a crash tore (its end merged
    with the next event) still reaches the subscriber as a ``resync``."""
    from trioqueue.storage import StorageEvent

    async with FileStorage(tmp_path / "d") as st, st.subscribe("q", kinds={"completed"}) as events:
        q = st._core.q("q")
        st._core.publish(q, [StorageEvent("enqueued", "a"), StorageEvent("completed", "a", result=b"1")])
        assert [(e.kind, e.job_id) for e in await events.receive()] == [("completed", "a")]
        os.write(q.events_fd, b'{"k":"enqueued","j":"b')  # a writer killed mid-line
        st._core.publish(q, [StorageEvent("completed", "b", result=b"2"), StorageEvent("completed", "c")])
        seen: list[tuple[str, str]] = []
        with trio.fail_after(5):
            while ("completed", "c") not in seen:
                seen += [(e.kind, e.job_id) for e in await events.receive()]
        assert seen == [("resync", ""), ("completed", "c")]


async def test_reaper_killed_before_the_failed_event_the_next_pass_announces_it(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with FileStorage(d) as st:
        await st.enqueue("q", [job("s1", max_attempts=1)])
    crash("reap-after-records", d)
    async with FileStorage(d) as st, st.subscribe("q") as events:
        assert (await st.get_job("q", "s1")).state.startswith("failed:")
        assert await st.held_jobs("q", "wc") == ["s1"]
        await st.recover_stalled("q")
        seen = await events_until(events, lambda s: any(k[:2] == ("failed", "s1") for k in s))
        assert b"StalledJobError" in next(k[2] for k in seen if k[:2] == ("failed", "s1"))
        assert await st.held_jobs("q", "wc") == []


async def test_enqueue_of_ids_another_instance_has_is_deduplicated_without_a_look_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New ids are linked without reading jobs/<id> first; an id that exists after all
    (written by another instance: not in this one's cache) is found at link time and
    answered as before: duplicate, completed (with its result), or a new incarnation of
    a cancelled one; every place of it in the call says so."""
    from trioqueue import EnqueueStatus
    from trioqueue.storage.file import _base as _core

    d = tmp_path / "d"
    async with FileStorage(d) as a, FileStorage(d) as b:
        await b.enqueue("q", [job("dup"), job("done"), job("gone")])
        (c,) = await b.dequeue("q", "w", 1, 0, 30)
        assert c.id == "dup"
        (c2,) = await b.dequeue("q", "w", 1, 0, 30)
        await b.settle("q", "w", [Settlement(SettleKind.COMPLETE, "done", b"42", ttl=60, token=c2.token)])
        assert (await b.cancel("q", "gone")).value == "cancelled"
        reads: list[str] = []
        orig = _core.read_rec

        def read_rec(path, enc):  # type: ignore[no-untyped-def]
            reads.append(enc)
            return orig(path, enc)

        monkeypatch.setattr(_core, "read_rec", read_rec)
        out = await a.enqueue(
            "q", [job("new1"), job("dup"), job("done"), job("gone")._replace(token="t2"), job("dup"), job("new1")]
        )
        assert [o.status for o in out] == [
            EnqueueStatus.QUEUED,
            EnqueueStatus.DUPLICATE,
            EnqueueStatus.COMPLETED,
            EnqueueStatus.QUEUED,
            EnqueueStatus.DUPLICATE,
            EnqueueStatus.DUPLICATE,
        ]
        assert out[1].state.startswith("processing:") and out[4].state == out[1].state
        assert out[2].result == b"42" and out[5].state.startswith("queued:")
        assert encode_name("new1") not in reads  # linked without a look
        assert sorted(a._core.q("q").recs) == sorted(encode_name(i) for i in ("new1", "gone"))
        claims = await a.dequeue("q", "w2", 10, 0, 30)
        assert [(c.id, c.attempts) for c in claims] == [("new1", 1), ("gone", 1)]
        assert (await a.get_job("q", "dup")).state.startswith("processing:")


async def test_sections_wake_event_subscribers_only_through_the_event_log(tmp_path: Path) -> None:
    """Subscribers watch the queue directory for IN_MODIFY: the counters and generation
    are written through a mapping (no inotify event), so claims and settlements, which
    bump the generation, wake them only when they append events."""
    from trioqueue.storage.file._inotify import IN_CREATE, IN_MODIFY, IN_MOVED_TO, Inotify

    async with FileStorage(tmp_path / "d") as st:
        await st.enqueue("q", [job("a"), job("b")])
        q = st._core.q("q")
        ino = Inotify()
        try:
            ino.add(q.path, IN_MODIFY | IN_CREATE | IN_MOVED_TO)
            claims = await st.dequeue("q", "w", 2, 0, 30)
            await st.heartbeat("q", "w", 30, [(c.id, c.token) for c in claims], 30)
            await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, c.id, b"", ttl=60, token=c.token) for c in claims])
            await st.enqueue("q", [job("c")])
            data = ino.drain()
        finally:
            ino.close()
        names = set()
        pos = 0
        while pos < len(data):
            _wd, _mask, _cookie, n = struct.unpack_from("iIII", data, pos)
            names.add(data[pos + 16 : pos + 16 + n].rstrip(b"\0").decode())
            pos += 16 + n
        assert names == {"events"}
        assert struct.unpack("<QQ", (Path(q.path) / "lock").read_bytes()[:16])[0] == _SEQ_START + 3
