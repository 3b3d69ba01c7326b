"""Helpers of the Queue-level conformance tests (tests/supervision/test_queue*.py): ``FAST``, Queue
options that keep the tests quick (no retry delay, short blocking claims), and ``echo``, a
handler that returns its job's payload and attempt."""

from __future__ import annotations

from typing import Any

from trioqueue import Job


FAST = {"retry_delay": 0, "block_timeout": 0.5}


async def echo(job: Job[Any]) -> Any:
    return {"echo": job.payload, "attempt": job.attempts}
