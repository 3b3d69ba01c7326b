"""A producer process for tests/interfaces/test_producers.py: a sync or an asyncio program that uses
trioqueue only through SyncProducer / AsyncioProducer (no Trio in its own code).

    python producer_app.py sync|asyncio STORAGE_URL QUEUE TAG

Runs the same steps in both modes and prints one JSON line per step: ``{"step", "out"}``,
where ``out`` describes the return value or the trioqueue exception; then ``DONE``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

from trioqueue import AsyncioProducer, CancelResult, EnqueueResult, JobStatus, SyncProducer, TrioQueueError


def steps(tag: str) -> list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]:
    return [
        ("enqueue", "enqueue", (f"{tag}-a", 1), {}),
        ("many", "enqueue_many", ([(f"{tag}-m{i}", i) for i in range(3)],), {}),
        ("wait", "enqueue_and_wait", (f"{tag}-w", 21), {"timeout": 60}),
        ("wait_failed", "enqueue_and_wait", (f"{tag}-boom", "boom"), {"timeout": 60}),
        ("bad_id", "enqueue", ("", 1), {}),
        ("bad_payload", "enqueue", (f"{tag}-bad", {1, 2}), {}),
        ("delayed", "enqueue", (f"{tag}-later", 1), {"delay": 3600}),
        ("duplicate", "enqueue", (f"{tag}-later", 1), {}),
        ("cancel", "cancel", (f"{tag}-later",), {}),
        ("status", "get_status", (f"{tag}-w",), {}),
        ("status_unknown", "get_status", (f"{tag}-nope",), {}),
        ("result", "get_result", (f"{tag}-w",), {}),
        ("result_failed", "get_result", (f"{tag}-boom",), {}),
    ]


def describe(value: Any) -> Any:
    if isinstance(value, BaseException):
        return {"error": type(value).__name__}
    if isinstance(value, EnqueueResult):
        return value.status.value
    if isinstance(value, CancelResult):
        return value.status.value
    if isinstance(value, JobStatus):
        return {"state": value.state.value, "result": value.result}
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


def report(step: str, out: Any) -> None:
    print(json.dumps({"step": step, "out": describe(out)}), flush=True)


def run_sync(url: str, queue: str, tag: str) -> None:
    with SyncProducer(url, name=queue) as producer:
        for step, method, args, kwargs in steps(tag):
            try:
                out = getattr(producer, method)(*args, **kwargs)
            except TrioQueueError as exc:
                out = exc
            report(step, out)
        # Several threads share the producer.
        results: dict[int, Any] = {}

        def wait_one(i: int) -> None:
            results[i] = producer.enqueue_and_wait(f"{tag}-t{i}", i, timeout=60)

        threads = [threading.Thread(target=wait_one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report("concurrent", [results[i] for i in range(6)])


async def run_asyncio(url: str, queue: str, tag: str) -> None:
    async with AsyncioProducer(url, name=queue) as producer:
        for step, method, args, kwargs in steps(tag):
            try:
                out = await getattr(producer, method)(*args, **kwargs)
            except TrioQueueError as exc:
                out = exc
            report(step, out)
        # Concurrent waits on one event loop.
        report("concurrent", await asyncio.gather(*(producer.enqueue_and_wait(f"{tag}-t{i}", i, timeout=60) for i in range(6))))


def main() -> None:
    mode, url, queue, tag = sys.argv[1:5]
    if mode == "sync":
        run_sync(url, queue, tag)
    else:
        asyncio.run(run_asyncio(url, queue, tag))
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
