"""``Storage.get_envelope``: a job's payload stays readable as long as its registry entry
(conformance, every backend). The dashboard's job page shows it."""

from __future__ import annotations

from typing import Any

from trioqueue import Job, JobFailedError, Queue, Storage
from trioqueue._core import decode_envelope

import pytest


async def _fail(job: Job[Any]) -> Any:
    raise RuntimeError("no")


async def test_envelope_kept_with_the_record(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name) as producer:
        await producer.enqueue("a", {"to": "<b>x</b>", "n": 1})
        envelope = await storage.get_envelope(queue_name, "a")
        assert envelope is not None
        job_id, payload, *_ = decode_envelope(envelope)
        assert job_id == "a" and producer.payload_serde.loads(payload) == {"to": "<b>x</b>", "n": 1}
        assert await storage.get_envelope(queue_name, "unknown") is None
        assert await producer.remove("a")
        assert await storage.get_envelope(queue_name, "a") is None


async def test_envelope_of_a_failed_job(storage: Storage, queue_name: str) -> None:
    async with Queue(storage, name=queue_name, handler=_fail, max_attempts=1, block_timeout=0.5) as queue:
        with pytest.raises(JobFailedError):
            await queue.enqueue_and_wait("f", [1, 2, 3], timeout=30)
        envelope = await storage.get_envelope(queue_name, "f")
        assert envelope is not None and queue.payload_serde.loads(decode_envelope(envelope)[1]) == [1, 2, 3]
