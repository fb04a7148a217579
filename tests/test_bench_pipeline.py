"""bench/pipeline.py --quick runs: the tiny model in one process and as a pipeline of 2
local ranks (ring), each rank's report (the bytes it holds, its peaks, its steps'
waits) read back. The figures themselves: docs/performance-runs.md "Pipeline parallelism"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


def test_pairs_bench_times_both_steps_in_the_same_two_ranks_in_turns(tmp_path):
    """bench/pipeline_pairs.py --quick: data-parallel 2 and --pipeline 2 built in the same
    two ranks, 3 rounds of one step each in turn, the first untimed; the ratio is the
    median of the rounds' data-parallel / pipeline step ratios."""
    figures = tmp_path / "pairs.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "pipeline_pairs.py"), "--quick",
                           "--json", str(figures)], cwd=REPO, env=trainer_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(figures.read_text())
    assert result["steps_timed"] == {"data_parallel": 2, "pipeline": 2}
    assert len(result["round_ratios"]) == 2 and all(r > 0 for r in result["round_ratios"])
    assert result["ratio"] == sum(result["round_ratios"]) / 2  # the median of two
    tokens = 8 * 32  # the tiny config's global batch x block size
    for name in ("data_parallel", "pipeline"):
        assert result["tokens_per_s"][name] * result["step_ms"][name] / 1e3 == \
            pytest.approx(tokens)
    assert "pipeline / data-parallel:" in proc.stdout
