"""Storage conformance, Queue level (issue 26, section 4): what the peers' tests expect of
results, statuses and errors, on every backend.

- the ``completed`` event carries the decoded result (``QueueEvent.data["result"]``) for
  ``on()`` callbacks and ``events()`` streams, large results included (read back when
  they were too large to ride along in the storage's event);
- ``get_statuses(ids)``: many statuses in one storage call;
- a failed job keeps the ``data`` dict its exception offers (``JobError.data``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from trioqueue import (
    Job,
    JobFailedError,
    JobState,
    Queue,
    Storage,
    UnrecoverableError,
    ValidationError,
)
from trioqueue._supervision._listener import NOTICES

from queue_helpers import FAST
from support import Recorder

BIG = "x" * 100_000  # over every backend's limit for a result riding along in an event


async def _payload(job: Job[Any]) -> Any:
    if job.payload == "big":
        return BIG
    return job.payload


class _Unreadable:
    """A result serde whose ``loads`` always fails (an observer with the wrong serde)."""

    def dumps(self, value: Any) -> bytes:
        raise AssertionError("not used")

    def loads(self, data: bytes) -> Any:
        raise ValueError("not my format")


# -- 1. the completed event carries the result -------------------------------------------


async def test_completed_event_carries_the_result_for_callbacks_and_streams(storage: Storage, queue_name: str) -> None:
    callback = Recorder()
    async with Queue(storage, name=queue_name, **FAST) as observer:
        observer.on("completed", callback)
        async with observer.events("completed") as stream, Queue(
            storage, name=queue_name, handler=_payload, **FAST
        ) as worker:
            await worker.enqueue_many([("small", {"n": [1, 2]}), ("big", "big"), ("none", None)])
            streamed: dict[str | None, Any] = {}
            with trio.fail_after(20):
                async for event in stream:
                    if event.name == "completed":
                        streamed[event.job_id] = event.data["result"]
                    if len(streamed) == 3:
                        break
                await callback.wait_for("completed", count=3)
    expected = {"small": {"n": [1, 2]}, "big": BIG, "none": None}
    assert streamed == expected
    assert {e.job_id: e.data["result"] for e in callback.events} == expected
    assert all("result_error" not in e.data and e.data["worker_id"] == worker.worker_id for e in callback.events)


async def test_completed_event_with_an_undecodable_result_says_why(storage: Storage, queue_name: str) -> None:
    callback = Recorder()
    async with Queue(storage, name=queue_name, result_serde=_Unreadable(), **FAST) as observer:
        observer.on("completed", callback)
        async with Queue(storage, name=queue_name, handler=_payload, **FAST) as worker:
            await worker.enqueue("j1", 7)
            with trio.fail_after(20):
                await callback.wait_for("completed", "j1")
    [event] = callback.events
    assert event.data["result"] is None
    assert "'j1'" in event.data["result_error"] and "not my format" in event.data["result_error"]


class _Counting:
    """JSON, counting the results it decodes."""

    def __init__(self) -> None:
        self.loads_calls = 0

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value).encode()

    def loads(self, data: bytes) -> Any:
        self.loads_calls += 1
        return json.loads(data)


async def test_completed_event_decodes_its_result_only_when_read(storage: Storage, queue_name: str) -> None:
    """A callback that only counts completions costs no decoding (the bench's B does that);
    the first read of ``data`` decodes, once."""
    serde, callback = _Counting(), Recorder()
    async with Queue(storage, name=queue_name, result_serde=serde, **FAST) as observer:
        observer.on("completed", callback)
        async with Queue(storage, name=queue_name, handler=_payload, **FAST) as worker:
            await worker.enqueue_many([("a", {"n": 1}), ("b", [2])])
            with trio.fail_after(20):
                await callback.wait_for("completed", count=2)
    assert serde.loads_calls == 0
    first, second = sorted(callback.events, key=lambda e: e.job_id or "")
    assert first.data == {"worker_id": worker.worker_id, "result": {"n": 1}} and serde.loads_calls == 1
    assert second.data["result"] == [2] and second.data["result"] == [2] and serde.loads_calls == 2
    assert dict(first.data) == {"worker_id": worker.worker_id, "result": {"n": 1}}


async def test_a_waiter_still_subscribes_to_the_notices_only(storage: Storage, queue_name: str) -> None:
    """Carrying results costs a waiter nothing more: it stays on the notices route (no
    ``enqueued``/``progress`` traffic), and gets big results too."""
    async with Queue(storage, name=queue_name, handler=_payload, **FAST) as q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("w1", {"a": 1}) == {"a": 1}
            assert await q.enqueue_and_wait("w2", "big") == BIG
        assert q._listener.level == NOTICES
        q.on("completed", Recorder())  # a completed callback: notices still
        assert q._listener.pending <= NOTICES and q._listener.level == NOTICES


# -- 2. statuses in bulk -----------------------------------------------------------------


async def _fail_or_echo(job: Job[Any]) -> Any:
    if job.payload == "fail":
        raise UnrecoverableError("no")
    return job.payload


async def test_get_statuses_in_order_with_none_for_unknown_ids(storage: Storage, queue_name: str) -> None:
    done = Recorder()
    async with Queue(storage, name=queue_name, handler=_fail_or_echo, max_attempts=1, **FAST) as q:
        q.on("completed", done)
        q.on("failed", done)
        await q.enqueue_many([("ok", 1), ("bad", "fail")])
        with trio.fail_after(20):
            await done.wait_until(lambda evs: len(evs) == 2)
        await q.pause()  # the next ones stay queued / delayed
        await q.enqueue("waiting", 2)
        await q.enqueue("later", 3, delay=60)
        ids = ["later", "nope", "ok", "bad", "waiting", "ok"]
        statuses = await q.get_statuses(ids)
        singles = [await q.get_status(jid) for jid in ids]
        assert await q.get_statuses([]) == []
        assert await q.get_statuses(iter(["ok"])) == [singles[2]]
    assert statuses == singles
    got = [None if s is None else (s.id, s.state, s.result) for s in statuses]
    assert got == [
        ("later", JobState.DELAYED, None),
        None,
        ("ok", JobState.COMPLETED, 1),
        ("bad", JobState.FAILED, None),
        ("waiting", JobState.QUEUED, None),
        ("ok", JobState.COMPLETED, 1),
    ]
    assert statuses[3] is not None and statuses[3].error is not None and statuses[3].error.message == "no"


async def test_get_statuses_validates_every_id_first(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, **FAST) as q:
        with pytest.raises(ValidationError, match="job_ids"):
            await q.get_statuses("abc")
        with pytest.raises(ValidationError, match="job id"):
            await q.get_statuses(["fine", ""])


async def test_storage_get_jobs_matches_get_job(storage: Storage, queue_name: str) -> None:
    from storage_helpers import job

    await storage.enqueue(queue_name, [job("a"), job("b")])
    await storage.cancel(queue_name, "b")
    assert await storage.get_jobs(queue_name, ["b", "zz", "a"]) == [
        await storage.get_job(queue_name, "b"),
        None,
        await storage.get_job(queue_name, "a"),
    ]
    assert await storage.get_jobs(queue_name, []) == []


# -- 4. errors keep a data dict ------------------------------------------------------------


class CodedError(Exception):
    """An app's error with a code, offered through ``to_dict()``."""

    def __init__(self, code: str, detail: Any) -> None:
        super().__init__(f"failed with {code}")
        self.code = code
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail}


class DeclaredError(Exception):
    """An app's error declaring which attributes are its data."""

    error_fields = ("status", "retry_after", "absent")

    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status
        self.retry_after = 2.5


class BrokenError(Exception):
    def to_dict(self) -> dict[str, Any]:
        raise RuntimeError("cannot")


async def _raise(job: Job[Any]) -> Any:
    kind = job.payload
    if kind == "coded":
        raise CodedError("E42", {"ids": [1, 2], "when": {1, 2} if job.attempts == 1 else "x"})
    if kind == "declared":
        raise DeclaredError(503)
    if kind == "broken":
        raise BrokenError("b")
    raise ValueError("plain")


async def test_failed_jobs_keep_the_data_their_exception_offers(storage: Storage, queue_name: str) -> None:
    failing = Recorder()
    async with Queue(storage, name=queue_name, handler=_raise, max_attempts=2, **FAST) as q:
        q.on("failing", failing)
        with trio.fail_after(20):
            with pytest.raises(JobFailedError) as coded:
                await q.enqueue_and_wait("c", "coded")
            with pytest.raises(JobFailedError) as declared:
                await q.enqueue_and_wait("d", "declared")
            with pytest.raises(JobFailedError) as broken:
                await q.enqueue_and_wait("b", "broken")
            with pytest.raises(JobFailedError) as plain:
                await q.enqueue_and_wait("p", "plain")
        statuses = await q.get_statuses(["c", "d", "b", "p"])
    # the first attempt's set (not JSON) was stored as its repr; the retry's error as is
    [first] = [e for e in failing.events if e.job_id == "c"]
    assert first.data["error"].data == {"code": "E42", "detail": {"ids": [1, 2], "when": "{1, 2}"}}
    assert coded.value.data == {"code": "E42", "detail": {"ids": [1, 2], "when": "x"}}
    assert coded.value.error.type == "CodedError" and coded.value.error.message == "failed with E42"
    assert declared.value.data == {"status": 503, "retry_after": 2.5}
    assert broken.value.data == {"repr": "to_dict() raised RuntimeError('cannot')"}
    assert plain.value.data is None and plain.value.error.traceback  # no data: none stored
    assert [s.error.data if s and s.error else "?" for s in statuses] == [
        coded.value.data,
        declared.value.data,
        broken.value.data,
        None,
    ]


async def test_get_jobs_is_one_script_call_on_redis(redis_url: str, queue_name: str) -> None:
    """One round trip, counted by the server: the script calls of 50 look-ups."""
    import uuid

    from trioqueue.storage import RedisStorage

    async with RedisStorage(redis_url, prefix=f"t-{uuid.uuid4().hex[:12]}") as storage:
        await _one_script_call(storage, queue_name)


async def _one_script_call(storage: Storage, queue_name: str) -> None:
    from storage_helpers import job

    ids = [f"j{i}" for i in range(50)]
    await storage.enqueue(queue_name, [job(i) for i in ids[::2]])

    async def script_calls() -> int:
        info = await storage._transport.command(["INFO", "commandstats"])  # type: ignore[attr-defined]
        text = info.decode() if isinstance(info, bytes) else str(info)
        total = 0
        for line in text.splitlines():
            name, _, stats = line.partition(":")
            if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha_ro"):
                total += int(stats.split(",")[0].split("=")[1])
        return total

    await storage.get_jobs(queue_name, ids[:1])  # (the script is loaded: no first-use retry)
    before = await script_calls()
    records = await storage.get_jobs(queue_name, ids)
    assert await script_calls() == before + 1
    assert [r is not None for r in records] == [i % 2 == 0 for i in range(50)]
