"""What a job costs PostgresStorage, workload by workload: round trips, the server's CPU
and the client's CPU per job, figures that do not depend on how loaded the machine is
(unlike rates). One durable server started here (fsync and synchronous commits on), a
fresh database a workload, the workloads of ``trioqueue bench`` run in this process.

- round trips: statements sent and answered on the storage's connections (each
  ``_wait_results`` of the driver is one), per call of the workload (A-batch: per batch of
  1,000; else per job);
- server CPU: user + system time of every process of the server (postmaster, backends,
  WAL writer, checkpointer...) from ``/proc``, per job;
- client CPU: this process's time, per job.

``--peer pgboss``: the same workloads by pg-boss (``benches/pgpeers/pgboss.mjs``, ``--peer
pgboss-quiet``: without NOTIFY) in a Node process, its server CPU and its client CPU
(the Node process's), per job; no round trips (they are the peer's driver's).

    python benches/bench_postgres_costs.py [--jobs 5000] [--batch-jobs 50000]
                                           [--workloads A-batch,A-100,A-seq,B] [--peer pgboss]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import trio

import _harness as h  # (also puts the tests' servers on the path)
from postgres_server import PostgresServer
from trioqueue._drivers.libpq import _conn
from trioqueue.cli._bench import _Bench, payload_of_size
from trioqueue.storage.postgres import PostgresStorage


def server_cpu(server: PostgresServer) -> float:
    """Seconds of CPU (user + system) used so far by the server's processes."""
    return h.cpu_seconds(server.processes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--workloads", default="A-batch,A-100,A-seq,B")
    ap.add_argument("--batch-jobs", type=int, default=50000, help="A-batch's jobs (its CPU is measured in clock ticks)")
    ap.add_argument("--peer", choices=("pgboss", "pgboss-quiet"), help="measure this peer instead of trioqueue")
    args = ap.parse_args()
    trips = [0]
    original = _conn.Connection._wait_results

    async def counted(self: _conn.Connection) -> list:  # type: ignore[type-arg]
        trips[0] += 1
        return await original(self)

    _conn.Connection._wait_results = counted  # type: ignore[method-assign]
    server = PostgresServer(durable=True)
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            for w in args.workloads.split(","):
                db = f"costs_{w.replace('-', '_').lower()}"
                admin.execute(f"CREATE DATABASE {db}")
                url = server.url.rsplit("/", 1)[0] + f"/{db}"
                n = args.batch_jobs if w == "A-batch" else args.jobs

                async def run(w: str = w, url: str = url, n: int = n) -> tuple[float, float, float, int, float]:
                    async with PostgresStorage(url) as storage:
                        bench = _Bench(storage, n, 100, payload_of_size(52), progress=False)
                        admin.execute("CHECKPOINT")
                        t0, c0, s0, r0 = time.perf_counter(), time.process_time(), server_cpu(server), trips[0]
                        result = await bench.run(w)
                        return (time.perf_counter() - t0, time.process_time() - c0, server_cpu(server) - s0,
                                trips[0] - r0, result.rate)

                def peer(w: str = w, url: str = url, n: int = n) -> tuple[float, float, float, int, float]:
                    with tempfile.TemporaryDirectory() as tmp:
                        out = Path(tmp) / "out.json"
                        cmd = ["node", str(h.HERE / "pgpeers" / "pgboss.mjs"), "--url", url,
                               *h.peer_options(out, jobs=n, workloads=w)]
                        if args.peer == "pgboss-quiet":
                            cmd.append("--no-notify")
                        admin.execute("CHECKPOINT")
                        c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), server_cpu(server)
                        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
                        c1, srv = resource.getrusage(resource.RUSAGE_CHILDREN), server_cpu(server) - s0
                        result = json.loads(out.read_text())["results"][0]
                    client = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
                    # (the Node process's CPU includes its start and pg-boss's own setup)
                    return result["seconds"], client, srv, -1, result["rate"]

                wall, client, srv, rt, rate = peer() if args.peer else trio.run(run)
                calls = n / 1000 if w == "A-batch" else n
                trips_text = "      –" if rt < 0 else f"{rt / calls:7.2f}"
                print(f"{args.peer or 'trioqueue'} {w:8} {rate:9,.0f} jobs/s  round trips {trips_text} per {'batch' if w == 'A-batch' else 'job'}"
                      f"  server CPU {srv / n * 1e6:6.1f} us/job  client CPU {client / n * 1e6:6.1f} us/job"
                      f"  (wall {wall:.2f} s)", flush=True)
                admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    finally:
        server.close()


if __name__ == "__main__":
    main()
