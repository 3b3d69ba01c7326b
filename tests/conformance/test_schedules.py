"""Cron and periodic jobs (conformance: every backend)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

from trioqueue import Job, Queue, Reaper, Storage, ValidationError
from trioqueue._supervision._scheduler import MAX_CATCH_UP, MISFIRE_GRACE, Schedule, Scheduler
from trioqueue._supervision._emitter import Emitter
from trioqueue.storage import StorageEvent

from storage_helpers import job

pytestmark = pytest.mark.capability("Schedules")

FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def test_periodic_schedule_enqueues_each_tick_once_with_its_id(storage: Storage, queue_name: str) -> None:
    ran: list[tuple[str, Any]] = []
    enough = trio.Event()

    async def handler(job: Job[Any]) -> None:
        ran.append((job.id, job.payload))
        if len(ran) >= 3:
            enough.set()

    async with Queue(storage, name=queue_name, handler=handler, **FAST) as q:
        schedule = await q.schedule("heartbeat", {"ping": 1}, every=0.2)
        with trio.fail_after(10):
            await enough.wait()
        assert [s.name for s in await q.schedules()] == ["heartbeat"]
        assert await q.unschedule("heartbeat")
    ids = [job_id for job_id, _ in ran]
    assert len(set(ids)) == len(ids)  # each tick once
    ticks = [schedule.job_id(schedule.created_at + k * 0.2) for k in range(500)]
    # on the grid, from tick 0 (ticks the scheduler finds late, within the grace, each run)
    assert set(ids) <= set(ticks) and ids[:3] == ticks[:3]
    assert all(payload == {"ping": 1} for _, payload in ran)


async def test_two_schedulers_at_once_never_run_a_tick_twice(storage: Storage, queue_name: str) -> None:
    ran: list[str] = []
    enough = trio.Event()

    async def handler(job: Job[Any]) -> None:
        ran.append(job.id)
        if len(ran) >= 6:
            enough.set()

    async with Queue(storage, name=queue_name, handler=handler, reaper=False, **FAST) as q:
        await q.schedule("tick", None, every=0.1)
        # Two reapers with no leader election: both run the scheduler (a split brain).
        async with Reaper(storage, name=queue_name), Reaper(storage, name=queue_name):
            with trio.fail_after(10):
                await enough.wait()
        await q.unschedule("tick")
    assert len(ran) == len(set(ran))


@pytest.mark.parametrize("missed", ["run_once", "skip"])
async def test_ticks_missed_while_no_scheduler_ran(storage: Storage, queue_name: str, missed: str) -> None:
    """A 10-minute schedule whose last tick was 65 minutes ago (its latest tick is 5 minutes
    late): ``run_once`` enqueues that tick once, ``skip`` drops it; never the older ones."""
    hour_ago = time.time() - 3900
    schedule = Schedule("hourly-report", b"null", every=600.0, missed=missed, created_at=hour_ago)  # type: ignore[arg-type]
    assert await storage.put_schedule(queue_name, schedule.name, schedule.encode(), None)
    assert await storage.tick_schedule(queue_name, schedule.name, hour_ago, None)
    scheduler = Scheduler(storage, queue_name, Emitter(queue_name))
    now = time.time()
    latest = schedule.latest_tick(now)
    assert latest is not None and 600 > now - latest > MISFIRE_GRACE
    for _ in range(2):  # the second pass finds nothing new
        await scheduler.tick_once(now)
    assert (await storage.get_schedules(queue_name))[schedule.name][1] == latest
    record = await storage.get_job(queue_name, schedule.job_id(latest))
    assert (record is not None) == (missed == "run_once")
    for earlier in (hour_ago + 600 * k for k in range(1, 6)):  # never the older missed ticks
        assert await storage.get_job(queue_name, schedule.job_id(earlier)) is None


async def test_cron_schedule_ids_and_validation(storage_free_memory: Storage) -> None:
    async with Queue(storage_free_memory) as q:
        s = await q.schedule("nightly", None, cron="0 3 * * *", tz="Europe/Paris")
        tick = s.next_tick(time.mktime((2026, 11, 23, 0, 0, 0, 0, 0, 0)))
        assert s.job_id(tick) == "nightly@2026-11-23T02:00:00Z"  # 03:00 in Paris, winter time
        with pytest.raises(ValidationError, match=r"schedule 'bad': invalid cron expression '61 \* \* \* \*'"):
            await q.schedule("bad", None, cron="61 * * * *")
        with pytest.raises(ValidationError, match="schedule 'bad': give cron or every, exactly one"):
            await q.schedule("bad", None)
        with pytest.raises(ValidationError, match="schedule 'bad': unknown timezone 'Mars/Base'"):
            await q.schedule("bad", None, every=1, tz="Mars/Base")
        assert [x.name for x in await q.schedules()] == ["nightly"]


# -- registering a schedule is idempotent (issue 22, item 3) --------------------------------


def _scheduler(storage: Storage, queue: str) -> Scheduler:
    return Scheduler(storage, queue, Emitter(queue))


async def _ready_ids(storage: Storage, queue: str) -> list[str]:
    """The ids of the jobs ready in ``queue``, in claim order (claimed to read them)."""
    return [c.id for c in await storage.dequeue(queue, "reader", 100, 0, 30.0)]


async def test_registering_an_unchanged_schedule_changes_nothing(
    storage: Storage, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker declaring its schedules at start-up registers them on every restart."""
    async with Queue(storage, name=queue_name, reaper=False) as q:
        first = await q.schedule("report", {"n": 1}, every=3)
        stored = await storage.get_schedules(queue_name)
        writes: list[tuple[Any, ...]] = []
        real = storage.put_schedule

        async def spy(*args: Any) -> Any:
            writes.append(args)
            return await real(*args)

        monkeypatch.setattr(storage, "put_schedule", spy)
        again = await q.schedule("report", {"n": 1}, every=3)
    assert writes == []  # no write at all
    assert await storage.get_schedules(queue_name) == stored
    assert again.created_at == first.created_at


async def test_re_registering_keeps_the_tick_grid(storage: Storage, queue_name: str) -> None:
    """``every=3``, re-registered (edited) 1 s after a tick: no tick at once, none moved."""
    async with Queue(storage, name=queue_name, reaper=False) as q:
        s = await q.schedule("tick", {"v": 1}, every=3)
        c = s.created_at
        scheduler = _scheduler(storage, queue_name)
        await scheduler.tick_once(c + 1)  # tick 0
        edited = await q.schedule("tick", {"v": 2}, every=3)
        assert (edited.created_at, edited.last_tick, edited.payload) == (c, c, b'{"v":2}')
        await scheduler.tick_once(c + 2)  # nothing due: the next tick is at c + 3
        await scheduler.tick_once(c + 4)
    assert await _ready_ids(storage, queue_name) == [s.job_id(c), s.job_id(c + 3)]


async def test_a_due_tick_survives_a_re_registration(
    storage: Storage, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cron tick due but not yet enqueued (the leader died, a deploy) when the schedule is
    registered again (edited, here) still runs."""
    from trioqueue._supervision import _scheduler as scheduler_module

    now = time.time()
    async with Queue(storage, name=queue_name, reaper=False) as q:
        with monkeypatch.context() as m:  # registered ten minutes ago
            m.setattr(scheduler_module, "_now", lambda: now - 600)
            s = await q.schedule("report", {"v": 1}, cron="* * * * *", missed="run_once")
        due = s.latest_tick(now)
        assert due is not None and due > s.created_at
        await _scheduler(storage, queue_name).tick_once(due - 1)  # the last pass before it
        await q.schedule("report", {"v": 2}, cron="* * * * *", missed="run_once")
        await _scheduler(storage, queue_name).tick_once(now)
    assert s.job_id(due) in await _ready_ids(storage, queue_name)


async def test_two_registrations_at_once_agree_on_one_anchor(
    storage: Storage, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes registering the same new schedule at the same moment (both read it
    absent before either writes) end with one grid anchor."""
    from itertools import count
    from trioqueue._supervision import _scheduler as scheduler_module

    clock = count(1000)  # each registration is built at another moment
    monkeypatch.setattr(scheduler_module, "_now", lambda: float(next(clock)))
    read = 0
    both_read = trio.Event()
    real = storage.get_schedules

    async def read_together(queue: str) -> Any:
        nonlocal read
        out = await real(queue)
        if not both_read.is_set():
            read += 1
            if read == 2:
                both_read.set()
            await both_read.wait()
        return out

    monkeypatch.setattr(storage, "get_schedules", read_together)
    got: list[Schedule] = []
    async with Queue(storage, name=queue_name, reaper=False) as q:

        async def register() -> None:
            got.append(await q.schedule("tick", every=5))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(register)
                nursery.start_soon(register)
        both_read.set()  # (the reads from here on go alone)
        stored = await q.schedules()
    assert len(stored) == 1 and got[0].created_at == got[1].created_at == stored[0].created_at


# -- a tick runs once, whatever its result TTL (issue 22, item 4) ----------------------------


async def test_a_tick_is_enqueued_as_enqueue_does_and_recorded_in_the_same_step(
    storage: Storage, queue_name: str
) -> None:
    """``tick_schedule`` enqueues through the enqueue path: the event, the wake-up of a
    waiting claim, dedup by id (the tick is still recorded)."""
    assert await storage.put_schedule(queue_name, "s", b"spec", None)
    claimed: list[str] = []

    async def waiting_claim(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        claimed.extend(c.id for c in await storage.dequeue(queue_name, "w", 10, 10.0, 30.0))

    seen: list[StorageEvent] = []
    async with storage.subscribe(queue_name) as events:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(waiting_claim)
                await trio.testing.wait_all_tasks_blocked()  # the claim waits
                assert await storage.tick_schedule(queue_name, "s", 10.0, job("s@10", token="t-10"))
            while not any(e.kind == "enqueued" for e in seen):
                seen.extend(await events.receive())
    assert claimed == ["s@10"]
    assert [e for e in seen if e.kind == "enqueued"] == [StorageEvent("enqueued", "s@10", token="t-10")]
    await storage.enqueue(queue_name, [job("s@20")])  # the id exists already (a duplicate)
    assert await storage.tick_schedule(queue_name, "s", 20.0, job("s@20", b'"other"', token="t-20"))
    rec = await storage.get_job(queue_name, "s@20")
    assert rec is not None and rec.token == "t-s@20"  # the job that was there, untouched
    assert (await storage.get_schedules(queue_name))["s"] == (b"spec", 20.0)


async def test_a_tick_runs_once_even_when_its_result_expired(storage: Storage, queue_name: str) -> None:
    """The leader dies right after its write of a tick; the tick's job runs and its result
    expires (``result_ttl`` tiny); the next leader must not enqueue that tick again."""
    from trioqueue import StorageError
    from trioqueue.storage import Settlement, SettleKind
    from trioqueue.testing import STORAGE_METHODS, FaultPlan, FaultyStorage

    async with Queue(storage, name=queue_name, reaper=False) as q:
        s = await q.schedule("tick", every=60, result_ttl=0.001)
    c = s.created_at
    # The scheduler's writes: the one atomic step, or the enqueue then the record of the
    # two-step way it replaced (kept here so that this test shows that way's double run).
    writes = frozenset({"tick_schedule", "enqueue", "advance_schedule"} & set(STORAGE_METHODS))
    dying = FaultyStorage(storage, FaultPlan(fail_after=1.0, methods=writes))
    with pytest.raises(StorageError):  # its first write landed, then the leader died
        await _scheduler(dying, queue_name).tick_once(c + 1)
    [claim] = await storage.dequeue(queue_name, "w", 10, 0, 30.0)
    assert claim.id == s.job_id(c)
    done = Settlement(SettleKind.COMPLETE, claim.id, b"null", ttl=s.result_ttl, token=claim.token)
    assert await storage.settle(queue_name, "w", [done]) == [True]
    with trio.fail_after(5):
        while await storage.get_job(queue_name, claim.id) is not None:
            await trio.sleep(0.005)  # a TTL running out announces nothing
    await _scheduler(storage, queue_name).tick_once(c + 2)  # the next leader
    assert await _ready_ids(storage, queue_name) == []


# -- late ticks run, missed ones collapse (issue 22, item 7) --------------------------------


async def test_ticks_late_by_less_than_the_grace_each_run(storage: Storage, queue_name: str) -> None:
    """A leader change leaves ticks unseen for a few seconds: each of them runs, in order."""
    async with Queue(storage, name=queue_name, reaper=False) as q:
        s = await q.schedule("tick", every=1)
        c = s.created_at
        scheduler = _scheduler(storage, queue_name)
        await scheduler.tick_once(c)
        await scheduler.tick_once(c + 5.5)  # ticks 1..5 found 0.5 to 4.5 s late
        await scheduler.tick_once(c + 5.5)  # nothing new
    assert await _ready_ids(storage, queue_name) == [s.job_id(c + k * 1.0) for k in range(6)]
    assert (await storage.get_schedules(queue_name))["tick"][1] == c + 5


@pytest.mark.parametrize("missed", ["run_once", "skip"])
async def test_ticks_late_by_more_than_the_grace_are_missed(storage: Storage, queue_name: str, missed: Any) -> None:
    """Ticks found more than ``MISFIRE_GRACE`` late: the latest of them runs once (before
    the on-time ones) or none does; the on-time ones each run."""
    every = 30.0
    async with Queue(storage, name=queue_name, reaper=False) as q:
        s = await q.schedule("tick", every=every, missed=missed)
        c = s.created_at
        scheduler = _scheduler(storage, queue_name)
        await scheduler.tick_once(c)
        now = c + 200  # ticks 30..120 are more than 60 s late, 150 and 180 are not
        assert now - (c + 120) > MISFIRE_GRACE >= now - (c + 150)
        await scheduler.tick_once(now)
        await scheduler.tick_once(now)
    ran = [0, 120, 150, 180] if missed == "run_once" else [0, 150, 180]
    assert await _ready_ids(storage, queue_name) == [s.job_id(c + k) for k in ran]
    assert (await storage.get_schedules(queue_name))["tick"][1] == c + 180


def test_one_pass_catches_up_on_a_bounded_number_of_ticks(storage_free_memory: Storage) -> None:
    """``every=0.001`` seen again after 10 s: 10,000 ticks within the grace. One pass runs
    the latest MAX_CATCH_UP of them; the older ones count as missed."""
    from dataclasses import replace
    from itertools import islice

    s = Schedule("fast", b"null", every=0.001, created_at=1000.0, last_tick=1000.0)
    scheduler = _scheduler(storage_free_memory, "q")
    due = scheduler.due_ticks(s, 1010.0)
    latest_first = list(islice(s.ticks_back(1010.0), MAX_CATCH_UP + 1))
    assert due == [(t, True) for t in reversed(latest_first)]  # the latest missed one runs once, first
    assert scheduler.due_ticks(replace(s, missed="skip"), 1010.0)[0] == (latest_first[-1], False)


def test_cron_ticks_late_and_missed(storage_free_memory: Storage) -> None:
    """A minutely cron seen again 10 s after a tick, its last run 3 minutes ago: the tick
    70 s late is the latest missed one, the one 10 s late is on time."""
    from dataclasses import replace

    m = 1_800_000_000.0  # a whole minute
    s = Schedule("minutely", b"null", cron="* * * * *", created_at=m - 3600, last_tick=m - 180)
    scheduler = _scheduler(storage_free_memory, "q")
    assert scheduler.due_ticks(s, m + 10) == [(m - 60, True), (m, True)]
    assert scheduler.due_ticks(replace(s, missed="skip"), m + 10) == [(m - 60, False), (m, True)]
    assert scheduler.due_ticks(replace(s, last_tick=m), m + 10) == []
