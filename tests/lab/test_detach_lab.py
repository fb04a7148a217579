"""`train --detach` on the lab, hosts on their own disks: the controller
killed mid-run (`kill -9` of its process group), the job goes on; `jobs`
lists it while it runs, a second launch into its --out is refused (exit 2);
`attach RUN_ID` follows it to its end and the record here has every step,
each loss within 1e-6 of an uninterrupted run's; nothing is left after."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests import waits
from tests.lab.jobs import data_here, left_on_hosts, records, training_setup, wait_for_losses

pytestmark = pytest.mark.lab

STEPS = 150


def train(lab, lab_data, tmp_path, out, *flags: str) -> subprocess.Popen:
    inventory, env = training_setup(lab, tmp_path)
    return subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--backend", "ring",
         "--config", "tiny", "--no-preflight", *flags, "--", "--steps", str(STEPS),
         "--global_batch", "6", "--data", str(data_here(lab, lab_data)), "--out", str(out),
         "--sample_tokens", "0"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def mlxcluster(lab, tmp_path, *args: str) -> subprocess.CompletedProcess:
    inventory, env = training_setup(lab, tmp_path)
    return waits.run([sys.executable, "-m", "mlxcluster", args[0], "-i", str(inventory), *args[1:]],
                     f"mlxcluster {args[0]}", paths=[lab.disk / "detached"], env=env,
                     cwd=tmp_path)


def losses(metrics) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(metrics) if "loss" in r}


def test_a_detached_run_outlives_its_controller_and_attach_makes_its_record_whole(
        lab3, lab_data, tmp_path):
    out = lab3.disk / "detached"
    proc = train(lab3, lab_data, tmp_path, out, "--detach")
    try:
        wait_for_losses(proc, out / "metrics.jsonl", 3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the controller, as a closed terminal kills it
    said = proc.communicate()[0]
    run_id = re.search(r"run (mlxtrain-[0-9a-f]{10})", said).group(1)
    recorded = max(losses(out / "metrics.jsonl"))

    listed = mlxcluster(lab3, tmp_path, "jobs")
    assert re.search(rf"^{run_id} .* 3 on labhost1, labhost2, labhost3 ", listed.stdout, re.M), listed
    again = mlxcluster(lab3, tmp_path, "train", "--no-preflight", "--config", "tiny", "--",
                       "--out", str(out), "--global_batch", "6")
    assert again.returncode == 2 and f"run {run_id} still trains into --out" in again.stderr, again

    attached = mlxcluster(lab3, tmp_path, "attach", run_id)
    assert attached.returncode == 0, attached.stdout[-2000:] + attached.stderr[-2000:]
    assert f"attaching to {run_id}" in attached.stdout
    assert f"{run_id} finished: every rank ended well" in attached.stdout
    got = losses(out / "metrics.jsonl")
    assert sorted(got) == list(range(1, STEPS + 1))  # every step, once, in the record here
    assert recorded < STEPS  # the controller was killed mid-run
    assert run_id not in mlxcluster(lab3, tmp_path, "jobs").stdout
    assert left_on_hosts(lab3, f"[m]lxcluster_run={run_id}",
                         f"/tmp/mlxcluster-stacks/[{run_id[0]}]{run_id[1:]}") == {}

    straight_out = lab3.disk / "straight"
    straight = train(lab3, lab_data, tmp_path, straight_out)
    assert waits.communicate(straight, "the straight run", paths=[straight_out])
    assert straight.returncode == 0
    want = losses(straight_out / "metrics.jsonl")
    for step, loss in got.items():
        assert abs(loss - want[step]) < 1e-6, (step, loss, want[step])
