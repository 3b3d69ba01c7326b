"""Instructions per awaited one-job enqueue on Redis, counted by callgrind (valgrind):
figures that do not move with the load of this shared machine, for the two halves of
the round trip A-seq makes 10,000 times.

- client: one ``await queue.enqueue(...)`` of a running Queue on RedisStorage (trioqueue's
  Python, Trio, the Rust core; user space only: the kernel's share of send/recv is not
  counted), the difference between a run of ``--calls`` enqueues and a run of none;
- C-1's client side: one ``await queue.enqueue_and_wait(...)`` answered by a noop handler
  of the same Queue (the enqueue, the worker's blocking claim, settle and the notice);
- server, B: claiming and completing 2,000 jobs in batches of 100 (``dequeue``,
  ``settle``), per job, in a redis-server under callgrind;
- server: one call of the ``enqueue`` script with the queue's KEYS, as the lean client
  sends it (FCALL of its Redis Function where the tree has one, else EVALSHA), inside a
  redis-server run under callgrind, counted between ``callgrind_control -z`` and ``-d``
  after a warm-up that makes the queue's hashes real hash tables; beside it the same
  script as EVALSHA, and a call of the same form that only returns (what any script
  call costs the server).

The working tree is measured against ``--base`` (a git revision, exported as in
``bench_ab.py``, with the working tree's Rust extension: the comparison is of the
Python and Lua code).

    python benches/bench_instructions.py [--base HEAD] [--calls 1000]

writes ``benches/results/instructions.md``. Needs valgrind; takes a few minutes.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import _harness as h
from redis_server import RedisServer, redis_server_binary, valkey_server_binary

_CLIENT = """
import os, sys, trio
sys.path.insert(0, sys.argv[1])
from trioqueue import Queue
from trioqueue.storage import RedisStorage

async def main(url, calls):
    payload = {"data": "x" * 30, "n": 1}
    async with RedisStorage(url) as st, Queue(st, name="instr") as q:
        for i in range(50 + calls):
            await q.enqueue(f"{os.getpid()}-{i}", payload)

trio.run(main, sys.argv[2], int(sys.argv[3]))
"""


_CLIENT_C1 = """
import os, sys, trio
sys.path.insert(0, sys.argv[1])
from trioqueue import Job, Queue
from trioqueue.storage import RedisStorage

async def noop(job: Job) -> None:
    return None

async def main(url, calls):
    payload = {"data": "x" * 30, "n": 1}
    async with RedisStorage(url) as st, Queue(st, name=f"instr-c1-{os.getpid()}", handler=noop) as q:
        for i in range(20 + calls):
            await q.enqueue_and_wait(f"{os.getpid()}-{i}", payload, timeout=60)

trio.run(main, sys.argv[2], int(sys.argv[3]))
"""


_MEMORY_A = """
import os, sys, trio
sys.path.insert(0, sys.argv[1])
from trioqueue import Queue
from trioqueue.storage import MemoryStorage

async def main(_url, calls):
    payload = {"data": "x" * 30, "n": 1}
    async with MemoryStorage() as st, Queue(st, name="instr") as q:
        for i in range(50 + calls):
            await q.enqueue(f"{i}", payload)

trio.run(main, sys.argv[2], int(sys.argv[3]))
"""


_B = """
import os, sys, trio
sys.path.insert(0, sys.argv[1])
from trioqueue import Job, Queue
from trioqueue.storage import MemoryStorage, RedisStorage

async def main(url, calls):
    n = 100 + calls
    done = trio.Event()
    seen = 0

    async def noop(job: Job) -> None:
        nonlocal seen
        seen += 1
        if seen == n:
            done.set()

    payload = {"data": "x" * 30, "n": 1}
    name = f"instr-b-{os.getpid()}"
    async with (RedisStorage(url) if url else MemoryStorage()) as st:
        async with Queue(st, name=name) as producer:
            for i in range(0, n, 100):
                await producer.enqueue_many([(f"{k}", payload) for k in range(i, min(i + 100, n))])
        async with Queue(st, name=name, handler=noop, concurrency=CONCURRENCY):
            await done.wait()

trio.run(main, sys.argv[2], int(sys.argv[3]))
"""
# B's client side per job: a worker on Redis (concurrency 100), or all of it in memory (10)
_REDIS_B = _B.replace("CONCURRENCY", "100")
_MEMORY_B = _B.replace("CONCURRENCY", "10")


def _totals(path: str) -> int:
    text = Path(path).read_text()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"no instruction total in {path}")
    return int(m.group(1))


def client_instructions(tree: Path, url: str, calls: int, tmp: str, driver: str = _CLIENT) -> float:
    """Client instructions per awaited call of ``driver`` (a run of ``calls`` less a run
    of none)."""
    counts = []
    for n in (0, calls):
        out = os.path.join(tmp, f"client.{n}")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                        "-c", driver, str(tree / "python"), url, str(n)],
                       check=True, capture_output=True, timeout=1800)
        counts.append(_totals(out))
    return (counts[1] - counts[0]) / calls


class _GrindServer(RedisServer):
    """A redis-server under callgrind (about 50 times slower)."""

    def __init__(self, binary: str, out: str) -> None:
        super().__init__(binary)
        self.out = out

    def args(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}", *super().args()]


def _encode(*args: str | bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def _call(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    reply = sock.recv(1 << 20)
    if reply.startswith(b"-"):
        raise RuntimeError(f"server error: {reply[:200]!r}")
    return reply


@contextlib.contextmanager
def _grinding(binary: str, tmp: str, wanted: int) -> Iterator[tuple[_GrindServer, list[int]]]:
    """A redis-server under callgrind; once it is closed, the list holds the instruction
    totals of its first ``wanted`` dumps (``callgrind_control -d``), in order."""
    out = os.path.join(tmp, "server.out")
    for f in glob.glob(out + "*"):
        os.remove(f)
    server = _GrindServer(binary, out)
    server.start(timeout=180)
    totals: list[int] = []
    try:
        yield server, totals
    finally:
        server.close()
    dumps = sorted((p for p in glob.glob(out + ".*") if not p.endswith(".out")), key=lambda p: int(p.rsplit(".", 1)[1]))
    if len(dumps) < wanted:
        raise RuntimeError(f"callgrind wrote {len(dumps)} dumps, not {wanted}")
    totals.extend(_totals(d) for d in dumps[:wanted])


def server_instructions(
    binary: str, source: str, keys: list[str], calls: int, tmp: str, library: tuple[str, str] | None = None
) -> float:
    """Server instructions per call of ``source`` (EVALSHA), or of its Redis Function
    ``library`` (``(function name, code)``: FCALL), with one new job's arguments."""
    with _grinding(binary, tmp, 1) as (server, totals):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            if library is None:
                sha = _call(sock, _encode("SCRIPT", "LOAD", source)).split(b"\r\n")[1].decode()
                head = ("EVALSHA", sha)
            else:
                _call(sock, _encode("FUNCTION", "LOAD", "REPLACE", library[1]))
                head = ("FCALL", library[0])
            envelope = b"x" * 120

            def run(tag: str, n: int) -> None:
                for i in range(n):
                    _call(sock, _encode(*head, str(len(keys)), *keys, "call1", f"{tag}{i}", envelope,
                                        "3:86400000", f"tok{tag}{i}", ""))

            run("warm", 700)  # past the listpack sizes: the hashes and zsets are real ones
            subprocess.run(["callgrind_control", "-z", str(server.proc.pid)], check=True, capture_output=True)  # type: ignore[union-attr]
            run("m", calls)
            subprocess.run(["callgrind_control", "-d", str(server.proc.pid)], check=True, capture_output=True)  # type: ignore[union-attr]
            _call(sock, _encode("FLUSHALL"))
    return totals[0] / calls


_BATCHES = """
import subprocess, sys, trio
sys.path.insert(0, sys.argv[1])
from trioqueue.storage import NewJob, RedisStorage, Settlement, SettleKind

URL, PID, N, B = sys.argv[2], sys.argv[3], int(sys.argv[4]), 100
payload = b'{"data":"' + b"x" * 30 + b'","n":1}'

def control(flag):
    subprocess.run(["callgrind_control", flag, PID], check=True, capture_output=True)

async def main():
    async with RedisStorage(URL, request_timeout=120) as st:
        for i in range(0, N, 500):
            await st.enqueue("b", [NewJob(f"j{i + k}", payload, 3, 86400.0, f"t{i + k}") for k in range(500)])
        control("-z")
        claims = []
        for _ in range(N // B):
            claims += await st.dequeue("b", "w1", B, 0, 60.0)
        control("-d")
        control("-z")
        for i in range(0, len(claims), B):
            await st.settle("b", "w1", [Settlement(SettleKind.COMPLETE, c.id, b"null", ttl=3600.0, token=c.token)
                                        for c in claims[i:i + B]])
        control("-d")
        assert len(claims) == N

trio.run(main)
"""


def server_batch_instructions(binary: str, tree: Path, jobs: int, tmp: str) -> tuple[float, float]:
    """Server instructions per job of B's two script calls, in batches of 100: claiming
    (``dequeue``) and completing (``settle``) ``jobs`` queued jobs."""
    with _grinding(binary, tmp, 2) as (server, totals):
        subprocess.run([sys.executable, "-c", _BATCHES, str(tree / "python"), server.url,
                        str(server.proc.pid), str(jobs)],  # type: ignore[union-attr]
                       check=True, capture_output=True, timeout=1800)
    return totals[0] / jobs, totals[1] / jobs


def _tree_script(tree: Path, name: str) -> tuple[str, list[str], tuple[str, str] | None]:
    """Script ``name`` of ``tree``, its KEYS and its Redis Function form (None where the
    tree has none); the first of ``name``'s ``|``-separated alternatives that the tree
    has (``enqueue_plain`` is what a default-priority enqueue runs where it exists)."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from trioqueue.storage.redis import _lua; "
            "keys = getattr(_lua, 'keys_of', lambda n, b: _lua.queue_keys(b)); "
            "name = next(n for n in sys.argv[2].split('|') if n in _lua.SCRIPT_NAMES); "
            "lib = getattr(_lua, 'library', lambda n: None)(name); "
            "print(json.dumps([_lua.source(name), keys(name, '{tq:instr}'), lib]))")
    out = subprocess.run([sys.executable, "-c", code, str(tree / "python"), name], check=True,
                         capture_output=True, text=True).stdout
    source, keys, library = json.loads(out)
    return source, keys, (tuple(library) if library else None)


_NOOP = "return {'q'}"
_NOOP_LIBRARY = ("trioqueue_instr_noop", "#!lua name=trioqueue_instr_noop\n"
                 "redis.register_function('trioqueue_instr_noop', function(KEYS, ARGV) return {'q'} end)\n")


def main() -> None:
    parser = h.parser(__doc__, out="instructions.md", rounds=None)
    parser.add_argument("--base", default="HEAD", help="git revision to compare with (default: HEAD)")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    binary = redis_server_binary() or valkey_server_binary()
    if binary is None:
        sys.exit("no redis-server / valkey-server found")
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trioqueue-instr-") as tmp, RedisServer(binary) as plain:
        with h.checkout(args.base) as base:
            for label, tree in (("base", base), ("tree", h.ROOT)):
                source, keys, library = _tree_script(tree, "enqueue_plain|enqueue")
                rows[label] = {
                    "client": client_instructions(tree, plain.url, args.calls, tmp),
                    # bimodal (about 0.92M or 1.16M on one machine: whether replies are
                    # already there when looked for, which timing decides): the median of 3
                    "c1": statistics.median(
                        client_instructions(tree, plain.url, max(args.calls // 4, 50), tmp, _CLIENT_C1) for _ in range(3)
                    ),
                    "server": server_instructions(binary, source, keys, args.calls, tmp, library),
                    "eval": server_instructions(binary, source, keys, args.calls, tmp),
                    "noop": server_instructions(binary, _NOOP, keys, args.calls, tmp, library and _NOOP_LIBRARY),
                }
                rows[label]["claim"], rows[label]["settle"] = server_batch_instructions(binary, tree, 2000, tmp)
                rows[label]["redis_b"] = client_instructions(tree, plain.url, args.calls * 2, tmp, _REDIS_B)
                rows[label]["mem_a"] = client_instructions(tree, "", args.calls, tmp, _MEMORY_A)
                rows[label]["mem_b"] = client_instructions(tree, "", args.calls * 2, tmp, _MEMORY_B)
                print(label, {k: round(v) for k, v in rows[label].items()}, file=sys.stderr)
    rev = h.git("rev-parse", "--short", args.base).strip()
    b, t = rows["base"], rows["tree"]
    lines = [
        f"The working tree against {rev} (`{args.base}`), {args.calls} calls, callgrind (valgrind), "
        f"{h.server_version(binary)}. "
        "Instruction counts do not depend on the machine's load (they vary by about 2 % from run to "
        "run: hash seeds, whether a reply is already there when looked for); the client columns "
        "count user space only (the kernel's send and receive are not in them).",
        "",
        f"| part | base ({rev}) | working tree | ratio |",
        "|---|---:|---:|---:|",
    ]
    for key, title in (("client", "client: one awaited `Queue.enqueue`"),
                       ("server", "server: one `enqueue` script call, as the lean client sends it (FCALL where the tree has Functions)"),
                       ("eval", "server: the same call as EVALSHA"),
                       ("noop", "server: a call of the same form that only returns (same KEYS)")):
        lines.append(f"| {title} | {b[key]:,.0f} | {t[key]:,.0f} | {t[key] / b[key]:.2f}× |")
    total_b, total_t = b["client"] + b["server"], t["client"] + t["server"]
    lines.append(f"| **client + server** | **{total_b:,.0f}** | **{total_t:,.0f}** | **{total_t / total_b:.2f}×** |")
    lines.append(f"| C-1: one `enqueue_and_wait`, producer and worker in one process (client side) "
                 f"| {b['c1']:,.0f} | {t['c1']:,.0f} | {t['c1'] / b['c1']:.2f}× |")
    for key, title in (("claim", "server, per job: `dequeue` (claim script) in batches of 100"),
                       ("settle", "server, per job: `settle` (completions) in batches of 100")):
        lines.append(f"| {title} | {b[key]:,.0f} | {t[key]:,.0f} | {t[key] / b[key]:.2f}× |")
    lines.append(f"| **server per job of B (claim + settle)** | **{b['claim'] + b['settle']:,.0f}** | "
                 f"**{t['claim'] + t['settle']:,.0f}** | **{(t['claim'] + t['settle']) / (b['claim'] + b['settle']):.2f}×** |")
    lines.append(f"| B: client per job, `enqueue_many` by 100, then a worker (concurrency 100, noop handler) "
                 f"claiming, running and completing it | {b['redis_b']:,.0f} | {t['redis_b']:,.0f} | "
                 f"{t['redis_b'] / b['redis_b']:.2f}× |")
    for key, title in (("mem_a", "MemoryStorage, A-seq: one awaited `Queue.enqueue` (all of it: no server)"),
                       ("mem_b", "MemoryStorage, B: per job, `enqueue_many` by 100, then a worker (concurrency 10, "
                                 "noop handler) claiming, running and completing it")):
        lines.append(f"| {title} | {b[key]:,.0f} | {t[key]:,.0f} | {t[key] / b[key]:.2f}× |")
    h.write(args, "Instructions per job: Redis client and server, and MemoryStorage end to end", lines)


if __name__ == "__main__":
    main()
