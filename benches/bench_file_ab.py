"""FileStorage A/B: the code of a base commit (default: ``main``) against this tree, on
workloads B (processing: one worker, concurrency 100, noop handler) and C-50
(``enqueue_and_wait`` from 50 callers), in interleaved rounds of one run.

    python benches/bench_file_ab.py [--base REV] [--rounds 3] [--jobs 10000]

The base's ``python/`` is exported with ``git archive`` into a temporary directory (no
worktree is registered: the repository is left as it is) and this tree's compiled
extension is copied in (the Rust core is the same on both sides). Each side runs the
standard workloads through ``python -m trioqueue bench --storage file://DIR`` (see
``trioqueue/_bench.py``) in a fresh process and a fresh directory on the repository's file
system (the temporary directory: check it is not a tmpfs). Writes benches/results/file-ab.md. Figures drift on a shared machine:
the ratios new/old of the same round are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("B", "C-50")


def export_base(rev: str, dest: Path) -> Path:
    """``python/`` of ``rev`` in ``dest``, with this tree's compiled extension."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "python"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    pkg = ROOT / "python" / "trioqueue"
    for so in pkg.glob("_core*.so"):
        shutil.copy2(so, dest / "python" / "trioqueue" / so.name)
    return dest / "python"


def run_side(pythonpath: Path, work: Path, jobs: int) -> dict[str, float]:
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    out = work / "out.json"
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    cmd = [sys.executable, "-m", "trioqueue", "bench", "--storage", f"file://{store}", "--workloads",
           ",".join(WORKLOADS), "--jobs", str(jobs), "--concurrency", "100", "--json", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, env=env, cwd=work, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    shutil.rmtree(store, ignore_errors=True)
    return {r["workload"]: r["rate"] for r in doc["results"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=10_000)
    args = ap.parse_args()
    base = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.base], check=True, capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "python"], capture_output=True, text=True).stdout.strip())
    rows: list[tuple[int, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="tq-file-ab-") as tmp:
        t = Path(tmp)
        (t / "old").mkdir()
        old_path = export_base(base, t / "old")
        sides = {"old": old_path, "new": ROOT / "python"}
        for rnd in range(1, args.rounds + 1):
            order = ["old", "new"] if rnd % 2 else ["new", "old"]  # alternate who goes first
            for side in order:
                rates = run_side(sides[side], t, args.jobs)
                rows.append((rnd, side, rates))
                print(f"round {rnd} {side}: " + ", ".join(f"{w} {rates[w]:,.0f}/s" for w in WORKLOADS), flush=True)
    write_report(rows, base, head + (" + uncommitted changes" if dirty else ""), args)


def write_report(rows: list[tuple[int, str, dict[str, float]]], base: str, head: str, args: argparse.Namespace) -> None:
    rounds = sorted({r for r, _, _ in rows})
    rate = {(r, s): rates for r, s, rates in rows}
    lines = [
        "# FileStorage A/B: main vs this branch",
        "",
        f"`python benches/bench_file_ab.py --rounds {args.rounds} --jobs {args.jobs}` on {platform.system()} "
        f"{platform.release()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; fsync on; the repository's file system.",
        "",
        f"- old: `{base[:12]}` (the base, exported with `git archive`); new: `{head[:12]}`",
        "- B: one worker, concurrency 100, noop handler, jobs enqueued first (`trioqueue bench` workload B), "
        f"{args.jobs} jobs; C-50: `enqueue_and_wait` from 50 callers ({args.jobs // 4} requests).",
        "- Rounds are interleaved (old/new, then new/old...), each side a fresh process and directory.",
        "",
        "| round | B old, jobs/s | B new, jobs/s | B new/old | C-50 old, req/s | C-50 new, req/s | C-50 new/old |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    for r in rounds:
        o, n = rate[(r, "old")], rate[(r, "new")]
        cells = []
        for w in WORKLOADS:
            ratios[w].append(n[w] / o[w])
            cells += [f"{o[w]:,.0f}", f"{n[w]:,.0f}", f"{n[w] / o[w]:.2f}"]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    med = []
    for w in WORKLOADS:
        o = statistics.median(rate[(r, "old")][w] for r in rounds)
        n = statistics.median(rate[(r, "new")][w] for r in rounds)
        med += [f"{o:,.0f}", f"{n:,.0f}", f"{statistics.median(ratios[w]):.2f}"]
    lines.append("| **median** | " + " | ".join(f"**{c}**" for c in med) + " |")
    lines.append("")
    lines.append("The median ratio is the median of the per-round ratios; the median rates are per side.")
    out = ROOT / "benches" / "results" / "file-ab.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
