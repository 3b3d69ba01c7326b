"""RedisStorage's producer side: enqueues (concurrent calls on one queue share round
trips, see :class:`~._coalesce.Coalescer`) and debounced enqueues, a mixin kept apart
from ``_storage.py``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._model._errors import StorageError
from ..._model._types import DEFAULT_PRIORITY, EnqueueStatus
from .._base import EnqueueOutcome, NewJob
from ._coalesce import Coalescer, Slot
from ._control import enqueue_args

__all__ = ["RedisEnqueue"]

_QUEUED_OUTCOME = EnqueueOutcome(EnqueueStatus.QUEUED)
_MAX_JOBS_PER_CALL = 2000


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _outcome(item: Any) -> EnqueueOutcome:
    """One job's outcome in an enqueue (or debounce) script's reply."""
    code = item[0]
    if code == b"q":
        return _QUEUED_OUTCOME
    if code == b"c":
        token = _text(item[3]) if len(item) > 3 and item[3] is not None else None
        return EnqueueOutcome(EnqueueStatus.COMPLETED, _text(item[1]), item[2], token)
    token = _text(item[2]) if len(item) > 2 and item[2] is not None else None
    status = EnqueueStatus.DEBOUNCED if code == b"b" else EnqueueStatus.DUPLICATE
    return EnqueueOutcome(status, _text(item[1]), token=token)



class RedisEnqueue:
    """The producer part of :class:`~trioqueue.storage.RedisStorage` (which provides the
    helpers below)."""

    _named: set[str]
    _coalescers: dict[str, Coalescer]

    if TYPE_CHECKING:  # provided by RedisAdmin and RedisStorage (later in its bases)

        async def _register_name(self, queue: str) -> None: ...

        async def _run_shielded(self, name: str, queue: str, args: Sequence[Any], worker: str | None = None) -> Any: ...

        def _call_token(self) -> str: ...

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not jobs:
            return []
        if queue not in self._named:
            await self._register_name(queue)
        co = self._coalescers.get(queue)
        if co is None:
            co = self._coalescers[queue] = Coalescer(functools.partial(self._flush, queue))
        return await co.submit(jobs)

    async def debounce(
        self, queue: str, jobs: Sequence[NewJob], delay: float, max_wait: float | None
    ) -> list[EnqueueOutcome]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if queue not in self._named:
            await self._register_name(queue)
        head = [str(int(delay * 1000)), "" if max_wait is None else str(int(max_wait * 1000))]
        outcomes: list[EnqueueOutcome] = []
        for job in jobs:  # one call a job: each takes effect on its own, in order
            [item] = await self._run_shielded("debounce", queue, [*head, self._call_token(), *enqueue_args(job)])
            outcomes.append(_outcome(item))
        return outcomes

    async def _flush(self, queue: str, batch: list[Slot]) -> None:
        all_jobs = [job for slot in batch for job in slot.jobs]
        outcomes: list[EnqueueOutcome] = []
        try:
            for start in range(0, len(all_jobs), _MAX_JOBS_PER_CALL):
                chunk = all_jobs[start : start + _MAX_JOBS_PER_CALL]
                args: list[Any] = [self._call_token()]
                script = "enqueue_plain"  # unless a job has another priority (its lane's key)
                for job in chunk:
                    args += enqueue_args(job)
                    if job.priority != DEFAULT_PRIORITY or job.group is not None:
                        script = "enqueue"
                reply = await self._run_shielded(script, queue, args)
                for item in reply:  # (a queued job's outcome inline: the per-job path)
                    outcomes.append(_QUEUED_OUTCOME if item[0] == b"q" else _outcome(item))
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
