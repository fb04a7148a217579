"""`mlxcluster train --stall-timeout`: the value reaches the launch, and a
stall is reported with its diagnosis, where the stacks are, and exit 4."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import EXIT_STALLED
from mlxcluster.jobs.stall import Stalled
from mlxcluster.jobs.watch import RunOutcome


@pytest.fixture
def launches(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    seen: list[dict] = []

    def fake_launch(job, on_line, env=None, timeout=None, **kw):
        seen.append({"timeout": timeout, **kw})
        return RunOutcome(exit_code=0, seconds=0.1)

    monkeypatch.setattr("mlxcluster.launch.trainer.run_job", fake_launch)
    return seen


@pytest.mark.parametrize("given, want", [([], "auto"), (["--stall-timeout", "20s"], 20.0),
                                         (["--stall-timeout", "2m"], 120.0),
                                         (["--stall-timeout", "90"], 90.0),
                                         (["--stall-timeout", "OFF"], None),
                                         (["--stall-timeout", "auto"], "auto")])
def test_stall_timeout_reaches_the_launch(launches, given, want):
    result = CliRunner().invoke(cli, ["train", "--local", "2", "--no-preflight", "--config", "tiny",
                                      "--timeout", "1h", *given, "--", "--out", "runs/x"])
    assert result.exit_code == 0, result.output
    assert launches[-1]["stall_timeout"] == want and launches[-1]["timeout"] == 3600.0
    assert str(launches[-1]["report_dir"]) == "runs/x"  # the stacks go beside the run


@pytest.mark.parametrize("bad, said", [("0.5s", "below the minimum"), ("soon", "is not a duration")])
def test_bad_stall_timeouts_are_refused(launches, bad, said):
    result = CliRunner().invoke(cli, ["train", "--local", "2", "--no-preflight", "--config", "tiny",
                                      "--stall-timeout", bad])
    assert result.exit_code == 2 and said in result.output and launches == []


def test_a_stall_exits_4_with_the_diagnosis_and_the_stacks_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def stalled(*_a, **_k):
        raise Stalled("training stalled: no progress for 21 s (stall timeout 20 s): rank 1 on "
                      "h2 is stopped (state T, CPU time not advancing); ranks 0 and 2 wait in "
                      "run at train.py:479", "every rank's state and Python stacks: runs/x/stall-r")

    monkeypatch.setattr("mlxcluster.launch.trainer.run_job", stalled)
    result = CliRunner().invoke(cli, ["train", "--local", "3", "--no-preflight", "--config", "tiny",
                                      "--", "--global_batch", "6"])
    assert result.exit_code == EXIT_STALLED == 4, result.output
    assert "error: training stalled: no progress for 21 s" in result.output
    assert "rank 1 on h2 is stopped" in result.output
    assert "fix: every rank's state and Python stacks: runs/x/stall-r" in result.output
