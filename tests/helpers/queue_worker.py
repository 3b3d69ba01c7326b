"""A real worker process for the crash tests (tests/crashes/test_processes.py).

    python queue_worker.py worker SPEC_JSON
    python queue_worker.py durable SPEC_JSON
    python queue_worker.py reaper SPEC_JSON

SPEC_JSON: {"backend": "file", "directory": ...} or {"backend": "redis", "url": ..., "prefix": ...}
or {"backend": "postgres", "url": ..., "schema": ...},
plus "queue", "worker_id", "concurrency", "visibility_timeout", "log" (a file every job
start is appended to: "<job id> <worker id> <attempt> <time.time()>"), optionally
"rate_limit" ([limit, per]) and "global_concurrency", and for reapers "lock_ttl".

``worker`` runs a Queue whose handler logs the start, sleeps ``payload["seconds"]`` and
returns ``{"id", "by"}``; prints ``READY`` once running. ``durable`` runs a Queue whose
handler runs ``payload["steps"]`` steps ``s0, s1, ...`` (each step's effect appends
``STEP <job id> <step> <worker id> <time.time()>`` to the log, then pauses
``payload["pause"]`` seconds before its value, the worker id, is returned and stored),
sleeps ``payload["nap"]`` seconds durably after ``s1`` (each run that passes the sleep
appends ``WOKE <job id> nap <worker id> <time>``; a claim the worker gives up, its lease
lost, appends ``LOST <job id> <why> <worker id> <time>``), waits for ``payload["signals"]``
signals named ``go`` after ``s2``, and returns ``{"steps": [the steps' values],
"signals": [the payloads]}``. ``reaper`` runs a leader-elected
Reaper and prints ``LEADER <owner>`` / ``FOLLOWER <owner>``. Both stop gracefully on
SIGTERM and die on SIGKILL, which is the point.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import trio

from trioqueue import Job, LeaderElection, Queue, RateLimit, Reaper, Storage


def make_storage(spec: dict[str, Any]) -> Storage:
    if spec["backend"] == "file":
        from trioqueue.storage.file import FileStorage

        return FileStorage(spec["directory"])
    if spec["backend"] == "redis":
        from trioqueue.storage.redis import RedisStorage

        return RedisStorage(spec["url"], prefix=spec["prefix"])
    if spec["backend"] == "postgres":
        from trioqueue.storage.postgres import PostgresStorage

        return PostgresStorage(spec["url"], schema=spec["schema"])
    raise SystemExit(f"unknown backend {spec['backend']}")


async def serve(spec: dict[str, Any], handler: Any, on_lease_lost: Any = None) -> None:
    """Run a Queue with ``handler`` and the spec's settings until SIGTERM; ``READY`` once
    it runs. ``on_lease_lost``: called with each ``lease_lost`` event."""
    queue: Queue[Any, Any] = Queue(
        make_storage(spec),
        name=spec["queue"],
        handler=handler,
        worker_id=spec["worker_id"],
        concurrency=spec.get("concurrency", 4),
        visibility_timeout=spec.get("visibility_timeout", 1.0),
        block_timeout=0.5,
        retry_delay=0,
        max_attempts=spec.get("max_attempts", 10),
        rate_limit=RateLimit(*spec["rate_limit"]) if "rate_limit" in spec else None,
        global_concurrency=spec.get("global_concurrency"),
    )
    if on_lease_lost is not None:
        queue.on("lease_lost", on_lease_lost)
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with queue:
            print("READY", flush=True)
            async for _ in signals:
                break


async def worker(spec: dict[str, Any]) -> None:
    worker_id = spec["worker_id"]
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handler(job: Job[Any]) -> dict[str, Any]:
        os.write(log_fd, f"{job.id} {worker_id} {job.attempts} {time.time()!r}\n".encode())
        await trio.sleep(job.payload.get("seconds", 0))
        return {"id": job.id, "by": worker_id}

    await serve(spec, handler)


async def durable(spec: dict[str, Any]) -> None:
    worker_id = spec["worker_id"]
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handler(job: Job[Any]) -> dict[str, Any]:
        pause = job.payload.get("pause", 0.0)

        async def effect(name: str) -> str:
            os.write(log_fd, f"STEP {job.id} {name} {worker_id} {time.time()!r}\n".encode())
            await trio.sleep(pause)  # a kill here: the effect happened, its value is not stored
            return worker_id

        values, signals = [], []
        for i in range(job.payload["steps"]):
            values.append(await job.step(f"s{i}", effect, f"s{i}"))
            await trio.sleep(pause)  # a kill here: the step is stored, the next not begun
            if i == 1 and "nap" in job.payload:  # a durable sleep after s1
                await job.sleep("nap", job.payload["nap"])
                os.write(log_fd, f"WOKE {job.id} nap {worker_id} {time.time()!r}\n".encode())
            if i == 2:  # then the signals the harness sends, each taken once, in order
                for _ in range(job.payload.get("signals", 0)):
                    signals.append(await job.wait_for_signal("go"))
        return {"steps": values, "signals": signals}

    def lease_lost(event: Any) -> None:  # the run of that job ends here (its handler is cancelled)
        os.write(log_fd, f"LOST {event.job_id} {event.data['why']} {worker_id} {time.time()!r}\n".encode())

    await serve(spec, handler, lease_lost)


async def reaper(spec: dict[str, Any]) -> None:
    ttl = spec.get("lock_ttl", 1.0)
    r = Reaper(
        make_storage(spec),
        name=spec["queue"],
        owner_id=spec["worker_id"],
        leader_election=LeaderElection(lock_ttl=ttl, renewal_interval=ttl / 4, acquire_retry_interval=ttl / 10),
    )
    r.on("leadership_acquired", lambda ev: print("LEADER", ev.data["owner"], flush=True))
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with r:
            print("FOLLOWER" if not r.is_leader else "LEADER", r.owner_id, flush=True)
            async for _ in signals:
                break


def main() -> None:
    mode, spec_json = sys.argv[1:3]
    spec = json.loads(spec_json)
    trio.run({"worker": worker, "durable": durable, "reaper": reaper}[mode], spec)


if __name__ == "__main__":
    main()
