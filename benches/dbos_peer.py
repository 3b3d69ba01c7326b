"""DBOS's twin of ``bench_durable.py``'s step workload, run by ``bench_durable.py --dbos
VENV`` with that virtualenv's Python (DBOS is not a dependency of trioqueue: install it in
a virtualenv of its own, ``python -m venv /tmp/dbosvenv && /tmp/dbosvenv/bin/pip install
dbos``). Not importable from trioqueue's side.

    python dbos_peer.py POSTGRES_URL --jobs N --steps S --concurrency C --json OUT

Runs, on the PostgreSQL server at ``POSTGRES_URL`` (the system database is created
there), ``N`` workflows of ``S`` steps (an async step returning its argument) and ``N``
workflows that call the same function ``S`` times without steps, two ways each:

- ``queued``: enqueued on a DBOS queue (``DBOS.register_queue``, ``worker_concurrency=C``,
  polled every 10 ms),
  then every result awaited: the closest to a job queue;
- ``direct``: started in this process (``DBOS.start_workflow_async``), at most ``C`` at a
  time: DBOS's usual way, no queue.

With ``--signals K`` (per round), the latency of a message: a workflow waits
(``DBOS.recv_async("go")``); once it is registered as waiting (DBOS's table of waiters
holds it), ``DBOS.send_async(workflow_id, i, "go")`` is sent from the same process and the
time until the line after ``recv_async`` runs is taken, one message at a time.

Writes ``{"results": [{"mode", "steps", "seconds", "jobs"}...], "signals": [[ms...] a
round], "version"}`` to OUT.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import time
import uuid

from dbos import DBOS, DBOSConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--signals", type=int, default=0, help="messages a round, one at a time (0: none)")
    p.add_argument("--json", required=True)
    args = p.parse_args()

    config: DBOSConfig = {
        "name": "bench_durable",
        "system_database_url": args.url,
        "log_level": "WARNING",
        "sys_db_pool_size": max(20, args.concurrency + 4),
    }
    DBOS(config=config)
    n_steps = args.steps

    @DBOS.step()
    async def one(i: int) -> int:
        return i

    async def plain_one(i: int) -> int:
        return i

    @DBOS.workflow()
    async def with_steps() -> int:
        total = 0
        for i in range(n_steps):
            total += await one(i)
        return total

    @DBOS.workflow()
    async def without_steps() -> int:
        total = 0
        for i in range(n_steps):
            total += await plain_one(i)
        return total

    received: dict[int, float] = {}
    arrived: dict[int, asyncio.Event] = {}

    @DBOS.workflow()
    async def waiter(i: int) -> int:
        value = await DBOS.recv_async("go", timeout_seconds=60)
        received[i] = time.perf_counter()
        arrived[i].set()
        return int(value)

    def waiting() -> int:
        """Waiters registered with DBOS's notification listener (-1: not known)."""
        try:
            import dbos._dbos as internals

            return len(internals._dbos_global_instance._sys_db.notifications_map._dict)  # type: ignore[union-attr]
        except AttributeError:
            return -1

    async def signal_round(k: int) -> list[float]:
        out = []
        for i in range(k + 5):  # (the first 5: warm-up)
            arrived[i] = asyncio.Event()
            handle = await DBOS.start_workflow_async(waiter, i)
            deadline = time.perf_counter() + 10
            while waiting() == 0 and time.perf_counter() < deadline:
                await asyncio.sleep(0.0005)
            if waiting() < 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.001)  # (the waiter registers, then reads its messages once)
            t0 = time.perf_counter()
            await DBOS.send_async(handle.workflow_id, i, "go")
            await asyncio.wait_for(arrived[i].wait(), 60)
            await handle.get_result()
            if i >= 5:
                out.append((received[i] - t0) * 1e3)
        return out

    async def run(mode: str, steps: bool) -> float:
        wf = with_steps if steps else without_steps
        t0 = time.perf_counter()
        if mode == "queued":
            handles = [await queue.enqueue_async(wf) for _ in range(args.jobs)]
            for h in handles:
                await h.get_result()
        else:
            sem = asyncio.Semaphore(args.concurrency)

            async def one_workflow() -> None:
                async with sem:
                    handle = await DBOS.start_workflow_async(wf)
                    await handle.get_result()

            await asyncio.gather(*(one_workflow() for _ in range(args.jobs)))
        return time.perf_counter() - t0

    signals: list[list[float]] = []

    async def all_runs() -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for _ in range(args.rounds if args.signals else 0):
            signals.append(await signal_round(args.signals))
        await run("direct", True)  # warm-up (connections, statements)
        for r in range(args.rounds):
            order = [("queued", False), ("queued", True), ("direct", False), ("direct", True)]
            for mode, steps in order if r % 2 == 0 else list(reversed(order)):
                out.append({"mode": mode, "steps": steps, "seconds": await run(mode, steps), "jobs": args.jobs})
        return out

    DBOS.launch()
    queue = DBOS.register_queue("bench_durable", worker_concurrency=args.concurrency, polling_interval_sec=0.01)
    try:
        results = asyncio.run(all_runs())
    finally:
        DBOS.destroy()
    with open(args.json, "w") as f:
        json.dump({"results": results, "signals": signals, "version": importlib.metadata.version("dbos"), "tag": uuid.uuid4().hex[:6]}, f)


if __name__ == "__main__":
    main()
