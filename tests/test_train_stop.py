"""`mlxcluster stop RUN_ID` on `mlxcluster train --max-restarts 2`: the ranks
agree on a step, checkpoint it and end (reference_train/stopping.py), rank 0
says so in the record (``{"event": "stopped"}``), and train keeps that end:
no restart (it would undo the stop), exit 143, the step and how to go on
named. Real processes: two local ring ranks of the real trainer. The lab
test (tests/lab/test_jobs_lab.py) stops a 3-host job the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mlxcluster.errors import EXIT_STOPPED_WHEN_ASKED
from tests import waits

REPO = Path(__file__).resolve().parents[1]


def losses_in(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum('"loss"' in line for line in metrics.read_text().splitlines())


def test_a_stopped_run_is_not_restarted_and_says_where_to_go_on(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mlxcluster = [sys.executable, "-m", "mlxcluster"]
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*mlxcluster, "train", "--local", "2", "--no-preflight", "--max-restarts", "2",
         "--config", "tiny", "--", "--steps", "100000", "--global_batch", "4",
         "--sample_tokens", "0", "--eval_every", "0", "--out", str(out)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        waits.wait_for(lambda: losses_in(out / "metrics.jsonl") >= 2 or proc.poll() is not None,
                       "the run's second loss", waits.Progress([out]))
        assert proc.poll() is None, proc.communicate()
        listed = waits.run([*mlxcluster, "jobs", "--local"], env=env, cwd=tmp_path)
        run_id = next(w for w in listed.stdout.split() if w.startswith("mlxtrain-"))
        stopped = waits.run([*mlxcluster, "stop", "--local", run_id], env=env,
                                 cwd=tmp_path)
        assert f"{run_id} stopped: every rank ended when asked" in stopped.stdout, stopped
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    [event] = [r for r in records if r.get("event") == "stopped"]
    step = event["step"]
    assert proc.returncode == EXIT_STOPPED_WHEN_ASKED, stdout + stderr
    assert f"train stopped at step {step} when asked" in stderr and \
        "go on with '-- --resume auto'" in stderr, stderr
    assert "restart 1/2" not in stdout + stderr and "failed" not in stderr
    assert [r["event"] for r in records if "event" in r] == ["start", "stopped"]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step_{step:06d}"
