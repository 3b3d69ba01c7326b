"""``trioqueue bench``: the installed console script runs every workload on a storage and
writes figures that account for every job (speed itself is measured in benches/, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trioqueue.cli._bench import WORKLOADS, payload_of_size
from trioqueue._model._errors import ValidationError
from trioqueue._model._serde import JsonSerde

TRIOQUEUE = str(Path(sys.executable).with_name("trioqueue"))


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TRIOQUEUE, "bench", "--no-progress", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("url", ["memory://", "file"])
def test_bench_runs_every_workload_and_writes_json(url: str, tmp_path: Path) -> None:
    storage = url if url != "file" else f"file://{tmp_path / 'store'}"
    out = tmp_path / "out.json"
    proc = _bench("--storage", storage, "--jobs", "200", "--concurrency", "20", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [r["workload"] for r in doc["results"]] == list(WORKLOADS)
    for r in doc["results"]:
        assert r["jobs"] > 0 and r["seconds"] > 0 and r["rate"] == pytest.approx(r["jobs"] / r["seconds"])
    by = {r["workload"]: r for r in doc["results"]}
    assert by["A-seq"]["jobs"] == by["A-batch"]["jobs"] == by["B"]["jobs"] == by["B-batch"]["jobs"] == 200
    assert by["C-1"]["p50_ms"] <= by["C-1"]["p99_ms"]
    for w in WORKLOADS:  # the table names every workload too
        assert w in proc.stdout


def test_bench_on_redis_counts_the_jobs_it_stored(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _bench("--storage", redis_url, "--jobs", "300", "--workloads", "A-100,B", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [(r["workload"], r["jobs"]) for r in doc["results"]] == [("A-100", 300), ("B", 300)]


def test_bench_rejects_an_unknown_workload_in_one_line() -> None:
    proc = _bench("--workloads", "A-seq,Z")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "unknown workload(s) Z" in proc.stderr


def test_payload_has_the_requested_size() -> None:
    assert [len(JsonSerde().dumps(payload_of_size(n))) for n in (10, 52, 1000)] == [10, 52, 1000]
    with pytest.raises(ValidationError, match="at least 10"):
        payload_of_size(3)


def test_bench_help_lists_every_workload_and_storage() -> None:
    proc = subprocess.run([TRIOQUEUE, "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for w in WORKLOADS:  # each workload on a line of its own, with what it measures
        assert any(w in line.split()[:2] and len(line.split()) > 2 for line in lines), w
    for scheme in ("memory://", "file://", "redis://", "postgresql://"):
        assert scheme in proc.stdout
    assert "benches/README.md" in proc.stdout  # where the comparisons built on it are
