"""A Queue on a MemoryStorage under Trio's virtual clock.

Every timer of the supervision layer and of MemoryStorage reads one clock
(``trioqueue._model._clock``), which follows ``trio.current_time()`` under a
``MockClock``: with ``autojump_threshold=0`` (the ``autojump_clock`` fixture of
pytest-trio) days of delays, retries, leases and cron ticks pass in well under a second
of real time, in order. Each test asserts the virtual time that passed.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import trio
import trio.testing

from trioqueue import ExponentialBackoff, Job, JobState, MemoryStorage, Queue, Reaper
from trioqueue._core import encode_envelope
from trioqueue._model import _clock
from trioqueue.storage import NewJob

HOUR = 3600.0
DAY = 24 * HOUR
# Long leases and claim waits: a timer that wakes every few virtual seconds for a day
# costs real time (each wake-up is a storage call). The scheduler re-reads the schedules
# every virtual second (about five real seconds a virtual day), so the tests without
# schedules run their own Reaper with ``scheduler=False`` (Queue(reaper=False)).
SLOW = {"visibility_timeout": HOUR, "block_timeout": HOUR}
NO_SCHEDULER = {"reaper": False, **SLOW}


async def test_the_clock_follows_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    _clock.note_run()  # (what a storage, a Queue or a Worker does as it starts in a run)
    wall, mono = _clock.now(), _clock.monotonic()
    await trio.sleep(DAY)
    assert _clock.now() - wall == DAY
    assert _clock.monotonic() - mono == DAY


def test_the_clock_does_not_import_trio_testing() -> None:
    """``trio.testing`` is not imported by trioqueue, nor by a Queue and a Worker running
    on a MemoryStorage (where pytest is installed it imports pytest: some ten thousand
    objects that every full collection of the garbage collector walks, about 25 ms each
    time): the clock knows a MockClock only where ``trio.testing`` was imported."""
    script = (
        "import sys, trio\n"
        "from trioqueue import MemoryStorage, Queue\n"
        "async def noop(job): pass\n"
        "async def main():\n"
        "    async with Queue(MemoryStorage(), handler=noop) as q:\n"
        "        await q.enqueue_and_wait('a', 1)\n"
        "trio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('trio.testing', '_pytest', 'pytest'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


async def test_a_job_delayed_by_a_day_runs_after_a_day_and_before_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ran: list[tuple[str, float]] = []
    both = trio.Event()

    async def handler(job: Job[Any]) -> None:
        ran.append((job.id, trio.current_time()))
        if len(ran) == 2:
            both.set()

    start = trio.current_time()
    storage = MemoryStorage()
    async with Reaper(storage, visibility_timeout=HOUR, scan_interval=HOUR / 10, scheduler=False), Queue(storage, handler=handler, **NO_SCHEDULER) as q:
        await q.enqueue("in-two-days", None, delay=2 * DAY)
        await q.enqueue("tomorrow", None, delay=DAY)
        with trio.fail_after(3 * DAY):
            await both.wait()
    assert [job_id for job_id, _ in ran] == ["tomorrow", "in-two-days"]
    (_, first), (_, second) = ran
    assert DAY <= first - start < DAY + 1
    assert 2 * DAY <= second - start < 2 * DAY + 1


async def test_retries_with_exponential_backoff_over_hours_complete(autojump_clock: trio.testing.MockClock) -> None:
    attempts: list[float] = []
    done = trio.Event()

    async def handler(job: Job[Any]) -> str:
        attempts.append(trio.current_time())
        if len(attempts) < 4:
            raise RuntimeError(f"attempt {len(attempts)} fails")
        done.set()
        return "finally"

    backoff = ExponentialBackoff(base=HOUR, factor=2.0, max=DAY, jitter=0.0)
    storage = MemoryStorage()
    async with (
        Reaper(storage, visibility_timeout=HOUR, scan_interval=HOUR / 10, scheduler=False),
        Queue(storage, handler=handler, max_attempts=4, retry_delay=backoff, **NO_SCHEDULER) as q,
    ):
        await q.enqueue("flaky", None)
        with trio.fail_after(DAY):
            await done.wait()
        with trio.fail_after(60):
            while (status := await q.get_status("flaky")).state is not JobState.COMPLETED:
                await trio.sleep(0.1)
    assert status.result == "finally"
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    # one, two, four hours between the attempts (plus the scheduling of a retry)
    for gap, hours in zip(gaps, [1, 2, 4]):
        assert hours * HOUR <= gap < hours * HOUR + 1
    assert 7 * HOUR <= attempts[-1] - attempts[0] < 7 * HOUR + 3


async def test_an_unrenewed_lease_is_recovered_after_visibility_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """A worker that claimed a job and froze (it never renews its lease): the reaper of a
    live Queue recovers the job once ``visibility_timeout`` of virtual time has passed,
    and its handler runs it."""
    storage = MemoryStorage()
    lease = 10 * 60.0
    await storage.heartbeat("default", "frozen-worker", lease, [], lease)
    envelope = encode_envelope("orphan", b"null", int(_clock.now() * 1000), 0, 3, 60_000)
    await storage.enqueue("default", [NewJob("orphan", envelope, 3, 60.0)])
    claimed_at = trio.current_time()
    [claim] = await storage.dequeue("default", "frozen-worker", 1, 1.0, lease)
    assert claim.id == "orphan"
    ran_at: list[float] = []
    done = trio.Event()

    async def handler(job: Job[Any]) -> None:
        ran_at.append(trio.current_time())
        done.set()

    async with (
        Reaper(storage, visibility_timeout=lease, scheduler=False),
        Queue(storage, handler=handler, visibility_timeout=lease, block_timeout=HOUR, reaper=False),
    ):
        with trio.fail_after(DAY):
            await done.wait()
    waited = ran_at[0] - claimed_at
    # recovered after the lease ran out, at the latest a reaper scan (lease / 10) later
    assert lease <= waited <= lease + lease / 10 + 1


async def test_a_cron_schedule_ticks_on_time_in_order(autojump_clock: trio.testing.MockClock) -> None:
    """A cron schedule of every minute runs 24 times in 24 virtual minutes, each tick on
    time. (Every hour for a day works the same but takes about 15 s of real time: the
    scheduler re-reads the schedules every virtual second.)"""
    minute = 60.0
    ran: list[tuple[str, float]] = []
    all_ran = trio.Event()

    async def handler(job: Job[Any]) -> None:
        ran.append((job.id, _clock.now()))
        if len(ran) == 24:
            all_ran.set()

    start = trio.current_time()
    async with Queue(MemoryStorage(), handler=handler, **SLOW) as q:
        await q.schedule("minutely", None, cron="* * * * *")
        with trio.fail_after(25 * minute):
            await all_ran.wait()
        await q.unschedule("minutely")
    assert 23 * minute < trio.current_time() - start <= 24 * minute + 1
    ticks = [datetime.strptime(job_id, "minutely@%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() for job_id, _ in ran]
    assert all(tick % minute == 0 for tick in ticks)
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [minute] * 23  # every minute, in order, none twice
    assert all(0 <= at - tick < 1.5 for (_, at), tick in zip(ran, ticks))  # each on time
