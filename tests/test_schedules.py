"""Cron and periodic jobs (conformance: every backend)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from trioqueue import Job, Queue, Reaper, Storage, ValidationError
from trioqueue._scheduler import MISFIRE_GRACE, Schedule, Scheduler
from trioqueue._events import Emitter

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
    # on the grid (the first is tick 0 unless the scheduler's first look came more than a
    # period late on a loaded machine: then the latest missed tick, run once)
    assert set(ids) <= set(ticks)
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
    await storage.put_schedule(queue_name, schedule.name, schedule.encode())
    await storage.advance_schedule(queue_name, schedule.name, hour_ago)
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
