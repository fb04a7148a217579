"""`mlxcluster train --max-restarts` on three lab hosts, each with its own disk:
a rank stopped with SIGSTOP on labhost2 is found stalled, every rank is
stopped, the job is launched again on all hosts from the newest checkpoint
every host has, and the run ends with the losses of one uninterrupted process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from tests import waits
from tests.lab.jobs import bracketed, left_on_hosts, rank_process, training_setup
from tests.train_support import run_trainer, train_losses

pytestmark = pytest.mark.lab

STEPS = 200


def common(data) -> list[str]:
    return ["--steps", str(STEPS), "--global_batch", "6", "--eval_every", "0",
            "--sample_tokens", "0", "--data", str(data)]


def test_a_stopped_rank_is_restarted_on_every_host_and_the_losses_are_the_reference(
        lab3, lab_data, tmp_path):
    reference = tmp_path / "reference"
    proc = run_trainer(["--config", "tiny", *common(lab_data), "--out", str(reference)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = train_losses(reference)

    inventory, env = training_setup(lab3, tmp_path)
    out = lab3.disk / f"restart-{uuid.uuid4().hex[:8]}"
    job = subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
         "--config", "tiny", "--stall-timeout", "20s", "--max-restarts", "1", "--",
         *common(lab_data), "--out", str(out)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    stopped = None
    victim = lab3.hosts[1]
    try:
        metrics = out / "metrics.jsonl"  # the record, on this machine

        def logged() -> bool:
            assert job.poll() is None, job.communicate()
            return metrics.exists() and metrics.read_text().count('"loss"') >= 25

        waits.wait_for(logged, "25 losses", waits.Progress([metrics]))
        stopped, _ = rank_process(lab3, victim, out)
        lab3.ssh(victim, f"kill -STOP {stopped}")
        stdout, stderr = waits.communicate(job, "the restarted run", paths=[metrics])
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if stopped is not None:
            lab3.ssh(victim, f"kill -CONT {stopped}; kill -KILL {stopped}")
    text = stdout + stderr
    assert job.returncode == 0, text[-4000:]
    assert "rank 1 on labhost2 is stopped" in text
    assert "restart 1/1 after: training stalled" in text and "after 1 restart(s)" in text
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["event"] for r in records if "event" in r] == ["start", "restart", "start"]
    resumed = [r["step"] for r in records if r.get("event") == "start"][1]
    assert resumed > 0 and resumed % 10 == 0  # the automatic checkpoint every steps/20
    got = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst <= 1.1e-6, worst
    for h in lab3.hosts:  # every host kept its own copy of the last checkpoint
        assert lab3.host_read(h, out / "checkpoints" / "latest").strip() == f"step_{STEPS:06d}"
    time.sleep(1)
    assert left_on_hosts(lab3, bracketed(f"reference_train.*{out.name}")) == {}
