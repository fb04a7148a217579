"""`mlxcluster jobs` and `mlxcluster stop` on the lab, hosts on their own
disks: a training job is listed while it runs (run id, its ranks alive on
each host), a second launch into the same --out is refused (exit 2), `stop`
asks every rank to stop, they write one last checkpoint at the step they
agree on and end, and the job is listed no more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests import waits
from tests.lab.jobs import (
    on_host,
    rank_process,
    records,
    start_training,
    training_setup,
    wait_for_losses,
)

pytestmark = pytest.mark.lab


def mlxcluster(env, cwd, *args: str) -> subprocess.CompletedProcess:
    return waits.run([sys.executable, "-m", "mlxcluster", *args], f"mlxcluster {args[0]}",
                     env=env, cwd=cwd)


def test_a_running_job_is_listed_refused_twice_and_stopped_after_a_last_checkpoint(
        lab3, lab_data, tmp_path, short_lease):
    proc, metrics = start_training(lab3, lab_data, tmp_path, "ring")
    out = metrics.parent
    inventory, env = training_setup(lab3, tmp_path)
    try:
        wait_for_losses(proc, metrics, 3)
        _, run_id = rank_process(lab3, lab3.hosts[0], out)

        listed = mlxcluster(env, tmp_path, "jobs", "-i", str(inventory))
        assert listed.returncode == 0, listed
        row = next(line for line in listed.stdout.splitlines() if line.startswith(run_id))
        assert "3 on labhost1, labhost2, labhost3" in row and f"--out {out}" in row

        again = mlxcluster(env, tmp_path, "train", "-i", str(inventory), "--no-preflight",
                           "--config", "tiny", "--", "--out", str(out), "--steps", "5",
                           "--global_batch", "6")
        assert again.returncode == 2, again
        assert f"run {run_id} still trains into --out {out} (3 rank(s)" in again.stderr
        assert f"mlxcluster stop {run_id}" in again.stderr
        assert proc.poll() is None  # the running job untouched

        stopped = mlxcluster(env, tmp_path, "stop", "-i", str(inventory), run_id)
        assert stopped.returncode == 0, stopped
        assert f"{run_id} stopped: every rank ended when asked" in stopped.stdout
        said = waits.communicate(proc, "train after mlxcluster stop", paths=[metrics])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "stopped at step" in said[0] and "when asked" in said[0], said
    # train keeps that end (no restart would undo it): exit 143, the step named
    assert proc.returncode == 143 and "train stopped at step" in said[1], said
    latest = {on_host(lab3, i, out / "checkpoints" / "latest").read_text().strip()
              for i in range(3)}
    assert len(latest) == 1  # one step, on every host's own disk
    assert int(latest.pop()[len("step_"):]) >= max(r["step"] for r in records(metrics) if "loss" in r)
    listed = mlxcluster(env, tmp_path, "jobs", "-i", str(inventory))
    assert run_id not in listed.stdout and "no job runs on labhost1, labhost2, labhost3" in listed.stdout
