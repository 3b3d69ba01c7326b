"""Power loss: every state a power cut could leave while FileStorage works (see
``power_loss``: the file-system operations recorded, the unflushed writes dropped) opens,
and loses nothing that was acknowledged."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from power_loss import DiskLog
from test_file_storage import job
from trioqueue.storage import FileStorage, Settlement, SettleKind

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FileStorage needs Linux (inotify)")


async def _lifecycle(st: FileStorage, log: DiskLog) -> None:
    """Enqueues, claims (whose records nobody waits for), heartbeats, settlements and a
    release, interleaved so that one step's flush follows another's unflushed re-point."""
    for ids in (["a", "b"], ["c"]):
        await st.enqueue("q", [job(i) for i in ids])
        for i in ids:
            log.mark(f"enqueued {i}")
    claims = await st.dequeue("q", "w", 2, 0, 30.0)  # seed, a: re-pointed, not flushed
    await st.enqueue("q", [job("d")])  # its flush must not make those re-points name lost data
    log.mark("enqueued d")
    await st.heartbeat("q", "w", 30.0, [(c.id, c.token) for c in claims], 30.0)
    ok = await st.settle("q", "w", [Settlement(SettleKind.COMPLETE, claims[0].id, b"1", ttl=3600.0, token=claims[0].token)])
    assert ok == [True]
    log.mark(f"completed {claims[0].id}")
    await st.release("q", "w", [claims[1].id])
    more = await st.dequeue("q", "w", 3, 0, 30.0)
    await st.enqueue("q", [job("e")])
    log.mark("enqueued e")
    settled = [Settlement(SettleKind.COMPLETE, c.id, b"2", ttl=3600.0, token=c.token) for c in more[:2]]
    settled.append(Settlement(SettleKind.RETRY, more[2].id, b"boom", delay=60.0, token=more[2].token))
    assert await st.settle("q", "w", settled) == [True] * 3
    for s in settled[:2]:
        log.mark(f"completed {s.id}")
    log.mark(f"failing {settled[2].id}")


async def test_a_power_cut_at_any_point_loses_nothing_acknowledged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim re-pointed ``jobs/<id>`` to a segment it never flushed, and every re-point
    named its segment before the segment's data was flushed: the next flush of anything
    (an enqueue's) could make the name durable without the data, and after a power cut
    the job's record was an empty file (quarantined: an acknowledged job lost). Data now
    reaches the disk before any name of it."""
    root = os.path.realpath(tmp_path / "d")
    async with FileStorage(root) as st:
        await st.enqueue("q", [job("seed")])
        log = DiskLog(root)
        log.mark("enqueued seed")
        log.snapshot()
        log.record(monkeypatch)
        await _lifecycle(st, log)
    monkeypatch.undo()
    points = log.crash_points()
    assert len(points) > 5
    for n, upto in enumerate(points):
        state = tmp_path / f"crash-{n}"
        log.materialize(log.state(upto), state)
        acked = log.acked(upto)
        async with FileStorage(state) as st:  # opens (start-up repair) on every state
            for what in acked:
                kind, job_id = what.split()
                rec = await st.get_job("q", job_id)
                assert rec is not None, f"crash state {n} (after op {upto}): {what} but the job is lost"
                if kind != "enqueued":
                    assert rec.state.split(":")[0] == kind, f"crash state {n}: {what} but the job is {rec.state}"
        quarantined = os.listdir(state / "q" / os.listdir(state / "q")[0] / "quarantine")
        assert quarantined == [], f"crash state {n}: records quarantined: {quarantined}"
