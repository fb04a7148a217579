"""bench/pipeline.py --quick runs: the tiny model in one process and as a pipeline of 2
local ranks (ring), each rank's report (the bytes it holds, its peaks, its steps'
waits) read back. The figures themselves: docs/performance-runs.md "Pipeline parallelism"."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.train_support import REPO, trainer_env


def test_quick_bench_reports_each_rank_and_the_bubble(tmp_path):
    figures = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "pipeline.py"), "--quick",
                           "--json", str(figures)], cwd=REPO, env=trainer_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    one, piped = json.loads(figures.read_text())["speed"]["cases"]
    assert (one["ranks"], piped["ranks"], piped["pipeline"]) == (1, 2, 2)
    assert all(s > 0 for s in one["tokens_per_s"] + piped["tokens_per_s"])
    # each stage holds part of the model; both hold the tied embedding (first: the
    # matrix, last: its copy for the head), so together more than the whole, each less
    assert all(0 < held < one["held"][0] for held in piped["held"])
    assert sum(piped["held"]) > one["held"][0]
    assert piped["bubble_formula"] == 1 / 3  # (N - 1) / (M + N - 1), N = M = 2
    assert all(0 <= b < 1 for b in piped["bubble"])
    assert "pipeline 2, M=2, 1f1b" in proc.stdout
