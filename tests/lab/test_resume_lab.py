"""Checkpoints on every host's own disk, and a resume every rank agrees on.

Three lab hosts, each with its own disk at ``lab.disk`` (as Macs have), the
trainer started by a plain ``mlx.launch --hostfile`` (no mlxcluster), so the
agreement holds for users who launch it themselves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.lab.jobs import mlx_launch_trainer, on_host
from tests.train_support import run_trainer, train_losses

pytestmark = pytest.mark.lab

STEPS = 8


def common(data: Path) -> list[str]:
    return ["--config", "tiny", "--steps", str(STEPS), "--global_batch", "6", "--log_every", "1",
            "--eval_every", "0", "--sample_tokens", "0", "--checkpoint_every", "2",
            "--keep_checkpoints", "0", "--data", str(data)]


def launch(lab, tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """The trainer under a plain `mlx.launch --hostfile` (no mlxcluster)."""
    return mlx_launch_trainer(lab, tmp_path, args)


def losses_on(lab, host: int, out: Path) -> dict[int, float]:
    lines = lab.host_read(host, out / "metrics.jsonl").splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, filter(None, lines)) if "loss" in r}


@pytest.fixture(scope="module")
def reference(lab_data, tmp_path_factory) -> dict[int, float]:
    """The same run uninterrupted, in one process with the same global batch."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run_trainer([*common(lab_data), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_losses(out)


def stopped_half_way(lab, lab_data, tmp_path) -> Path:
    out = lab.disk / f"resume-{uuid.uuid4().hex[:8]}"
    proc = launch(lab, tmp_path, [*common(lab_data), "--out", str(out), "--stop_after", "4"])
    assert "step      4/8 | loss" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i in range(3):  # every host wrote its own copy; this machine has none
        for step in ("step_000002", "step_000004"):
            assert lab.host_exists(i, out / "checkpoints" / step / "model.safetensors"), (i, step)
    assert not out.exists()
    return out


def assert_matches(resumed: dict[int, float], reference: dict[int, float], steps) -> None:
    for s in steps:
        assert abs(resumed[s] - reference[s]) <= 1.1e-6 * abs(reference[s]), (
            s, resumed[s], reference[s])


def test_resume_where_hosts_lack_or_damaged_the_newest_checkpoint(lab3, lab_data, tmp_path,
                                                                   reference):
    out = stopped_half_way(lab3, lab_data, tmp_path)
    assert_matches(losses_on(lab3, 0, out), reference, range(1, 5))
    # rank 0's host lost its newest checkpoint; labhost3's copy is damaged
    shutil.rmtree(on_host(lab3, 0, out / "checkpoints" / "step_000004"))
    model = on_host(lab3, 2, out / "checkpoints" / "step_000004" / "model.safetensors")
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))

    proc = launch(lab3, tmp_path, [*common(lab_data), "--out", str(out), "--resume", "auto"])
    text = proc.stdout + proc.stderr
    assert "step      8/8 | loss" in proc.stdout, text[-4000:]
    assert "labhost3 (rank 2): " in text and "is damaged (model.safetensors does not match" in text
    assert "labhost1 (rank 0) had step 2: step_000004 sent from labhost2" in text
    assert "labhost3 (rank 2) had step 2: step_000004 sent from labhost2" in text
    assert "resumed from" in text and "at step 4" in text
    assert_matches(losses_on(lab3, 0, out), reference, range(5, STEPS + 1))
    for i in range(3):  # whole again everywhere, and the run's last checkpoint too
        assert lab3.host_exists(i, out / "checkpoints" / f"step_{STEPS:06d}" / "state.json")


def test_hosts_holding_different_states_never_train(lab3, lab_data, tmp_path):
    out = stopped_half_way(lab3, lab_data, tmp_path)
    # labhost3's step 4 now holds step 2's arrays, whole and self-consistent: another state
    ckpt = on_host(lab3, 2, out / "checkpoints")
    for name in ("model.safetensors", "optimizer.safetensors"):
        shutil.copy(ckpt / "step_000002" / name, ckpt / "step_000004" / name)
    state = json.loads((ckpt / "step_000004" / "state.json").read_text())
    state["hashes"] = json.loads((ckpt / "step_000002" / "state.json").read_text())["hashes"]
    (ckpt / "step_000004" / "state.json").write_text(json.dumps(state))

    proc = launch(lab3, tmp_path, [*common(lab_data), "--out", str(out), "--resume", "auto"])
    text = proc.stdout + proc.stderr
    assert "the hosts hold different checkpoints for step 4" in text, text[-4000:]
    for host in ("labhost1", "labhost2", "labhost3"):
        assert f"on {host}: step 4 hash" in text
    assert "step      5/8" not in text
    # a clear error, no traceback from the trainer (mlx.launch prints one of its own
    # threads when ranks exit; that one is not ours)
    assert "reference_train/" not in text and "error: the hosts hold" in proc.stdout
    assert max(losses_on(lab3, 0, out)) == 4  # nothing trained after the refusal
