"""RedisStorage's producer side: the ARGV of a job in the enqueue scripts
(:func:`enqueue_args`, also sent by ``schedule_tick``, ``debounce`` and the trees'
scripts), a job's outcome in their replies (:func:`outcome`), and the batch a
:class:`~._coalesce.Coalescer` sends for the concurrent ``enqueue`` calls of one queue
(:func:`flush`: one script call per ``_MAX_JOBS_PER_CALL`` jobs)."""

from __future__ import annotations

from typing import Any

import trio

from ..._model._errors import StorageError
from ..._model._types import DEFAULT_PRIORITY, EnqueueStatus
from .._base import EnqueueOutcome, NewJob
from .._coalesce import Slot
from ._runner import ScriptRunner, ms, text

__all__ = ["QUEUED", "enqueue_args", "flush", "outcome"]

QUEUED = EnqueueOutcome(EnqueueStatus.QUEUED)
_MAX_JOBS_PER_CALL = 2000


def enqueue_args(job: NewJob) -> list[Any]:
    """The five ARGV fields of ``job`` in ``enqueue.lua`` (and ``schedule_tick.lua``)."""
    run_at = "" if job.run_at is None else str(int(job.run_at * 1000))
    limits = f"{job.max_attempts}:{ms(job.result_ttl)}"
    if job.priority != DEFAULT_PRIORITY or job.group is not None:
        limits += f":{job.priority}"
    if job.group is not None:
        limits += f":{job.group}"
    return [job.id, job.envelope, limits, job.token, run_at]


def outcome(item: Any) -> EnqueueOutcome:
    """One job's outcome in an enqueue (or debounce) script's reply."""
    code = item[0]
    if code == b"q":
        return QUEUED
    if code == b"c":
        token = text(item[3]) if len(item) > 3 and item[3] is not None else None
        return EnqueueOutcome(EnqueueStatus.COMPLETED, text(item[1]), item[2], token)
    token = text(item[2]) if len(item) > 2 and item[2] is not None else None
    status = EnqueueStatus.DEBOUNCED if code == b"b" else EnqueueStatus.DUPLICATE
    return EnqueueOutcome(status, text(item[1]), token=token)


async def flush(runner: ScriptRunner, queue: str, batch: list[Slot]) -> None:
    """Send the jobs of ``batch`` (the calls a coalescer carries together) and hand each
    call its outcomes, or the error."""
    all_jobs = [job for slot in batch for job in slot.jobs]
    outcomes: list[EnqueueOutcome] = []
    try:
        for start in range(0, len(all_jobs), _MAX_JOBS_PER_CALL):
            chunk = all_jobs[start : start + _MAX_JOBS_PER_CALL]
            args: list[Any] = [runner.call_token()]
            script = "enqueue_plain"  # unless a job has another priority (its lane's key)
            for job in chunk:
                args += enqueue_args(job)
                if job.priority != DEFAULT_PRIORITY or job.group is not None:
                    script = "enqueue"
            reply = await runner.run_shielded(script, queue, args)
            for item in reply:  # (a queued job's outcome inline: the per-job path)
                outcomes.append(QUEUED if item[0] == b"q" else outcome(item))
    except trio.Cancelled:
        # The carrying call was cancelled (after the shield limit): the others learn
        # that their jobs' fate is unknown, as with any interrupted write.
        for slot in batch:
            slot.error = StorageError("enqueue interrupted: the server did not answer in time")
            slot.wake()
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to every waiter
        for slot in batch:
            slot.error = exc
            slot.wake()
        return
    i = 0
    for slot in batch:
        n = len(slot.jobs)
        slot.result = outcomes[i : i + n]
        i += n
        slot.wake()
