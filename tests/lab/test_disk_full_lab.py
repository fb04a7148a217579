"""A host's disk that fills mid-run (issue 39, part 4), on real hosts each with its own disk.

`mlxcluster train` on the shared lab, labhost2's checkpoint folder a small
disk of its own (a tmpfs in its mount namespace: ``Lab.small_disk``), so a
write there that needs more room fails with ENOSPC, as on a full Mac:

1. the disk holds less than one checkpoint: MLX's write fails mid-file at
   the first checkpoint; the run stops (exit 2) saying which host, which
   folder and how much room is left, and the half-written folder is gone;
2. room freed for two checkpoints less a little: `--resume auto` receives
   the newest checkpoint from labhost1, warns before the next one that the
   room runs low, and stops before writing the one after, which cannot fit,
   leaving the previous checkpoints whole;
3. room freed: `--resume auto` trains to the end, and every step's loss in
   the run's record is the uninterrupted run's (one process, the same
   global batch) within 1e-6.

The tiny config's checkpoint is ~322 KiB (the weights, AdamW's two moments and
state.json, which holds the run's paths), which sizes the small disk.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from reference_train.checkpoint import checkpoint_steps
from reference_train.disk_room import MARGIN, human
from tests import waits
from tests.lab.jobs import on_host, records, training_setup
from tests.train_support import run_trainer, train_losses

pytestmark = pytest.mark.lab

STEPS, EVERY = 8, 2
FULL_HOST = 1  # labhost2


def trainer_flags(data: Path) -> list[str]:
    return ["--config", "tiny", "--steps", str(STEPS), "--global_batch", "6", "--log_every", "1",
            "--eval_every", "0", "--sample_tokens", "0", "--checkpoint_every", str(EVERY),
            "--keep_checkpoints", "2", "--data", str(data)]


@pytest.fixture(scope="module")
def reference(lab_data, tmp_path_factory) -> dict[int, float]:
    """The same run uninterrupted, in one process with the same global batch."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run_trainer([*trainer_flags(lab_data), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_losses(out)


def free_on(lab, host: int, folder: Path) -> int:
    """Bytes free in ``folder`` as the host sees it (df, over ssh)."""
    shown = lab.ssh(host, f"df -B1 --output=avail {folder} | tail -1", check=True).stdout
    return int(shown.strip())


def size_on(lab, host: int, checkpoint: Path) -> int:
    """The sum of the sizes of a checkpoint's files on the host (over ssh)."""
    shown = lab.ssh(host, f"stat -c %s {checkpoint}/*", check=True).stdout
    return sum(int(n) for n in shown.split())


def whole_on(lab, host: int, checkpoint: Path) -> bool:
    """Whether the host's copy of ``checkpoint`` holds every file, each matching
    its hash in state.json (sha256sum over ssh: this machine does not see the
    host's small disk)."""
    hashes = json.loads(lab.host_read(host, checkpoint / "state.json"))["hashes"]
    listed = "".join(f"{digest}  {checkpoint / name}\n" for name, digest in hashes.items())
    return lab.ssh(host, f"printf {listed!r} | sha256sum --check --quiet").returncode == 0


def test_a_host_whose_disk_fills_is_named_and_the_run_resumes_to_the_same_losses(
        lab3, lab_data, tmp_path, reference):
    inventory, env = training_setup(lab3, tmp_path)
    out = lab3.disk / f"full-{uuid.uuid4().hex[:8]}"
    ckpt = out / "checkpoints"
    said_folder = f"in {ckpt}: "

    def train(*extra: str) -> subprocess.CompletedProcess:
        return waits.run(
            [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
             "--", *trainer_flags(lab_data), "--out", str(out), *extra],
            "train on the lab", paths=[out], env=env, cwd=tmp_path)

    try:
        # 1. less room than one checkpoint: mlx's own write fails at step 2
        lab3.small_disk(FULL_HOST, ckpt, "128k")
        proc = train()
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2, text[-4000:]
        assert "train failed: rank 1 exited with code 2" in proc.stderr, text[-4000:]
        left = free_on(lab3, FULL_HOST, ckpt)
        said = next((ln for ln in text.splitlines() if ln.startswith("error: labhost2:")), "")
        assert said.startswith(f"error: labhost2: no room to write checkpoint step_000002 "
                               f"{said_folder}{human(left)} free there (mlx: unable to write "), text
        assert "hint: free room on labhost2 (df -h " in said and "--resume auto" in said
        assert "Traceback" not in text and "reference_train/" not in text
        # the half-written folder was removed; nothing else is on that disk
        assert lab3.ssh(FULL_HOST, f"ls -A {ckpt}").stdout == ""
        first = {i: checkpoint_steps(on_host(lab3, i, ckpt)) for i in (0, 2)}

        # 2. room for two checkpoints less a little: warned at step 4, stopped before step 6
        lab3.resize_small_disk(FULL_HOST, ckpt, "900k")
        proc = train("--resume", "auto")
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2, text[-4000:]
        if first[0]:  # labhost1 finished its step 2 before the job was stopped
            assert "labhost2 (rank 1) had no checkpoint: step_000002 sent from labhost1" in text
        size = size_on(lab3, FULL_HOST, ckpt / "step_000004")
        warning = re.search(r"warning: labhost2: ([\d.]+ KiB) free in (\S+), room for fewer "
                            r"than 2 checkpoints of ([\d.]+ KiB): free room on labhost2", text)
        assert warning and warning.groups()[1:] == (str(ckpt), human(size)), text[-4000:]
        assert text.count("warning: labhost2:") == 1
        left = free_on(lab3, FULL_HOST, ckpt)
        assert (f"error: labhost2: no room to write checkpoint step_000006 {said_folder}"
                f"{human(left)} free there, {human(size + MARGIN)} needed (checked before writing; "
                "nothing was written)") in text, text[-4000:]
        assert "Traceback" not in text and "reference_train/" not in text
        kept = lab3.ssh(FULL_HOST, f"ls -A {ckpt}").stdout.split()
        assert kept == ["latest", "step_000002", "step_000004"], kept
        assert lab3.host_read(FULL_HOST, ckpt / "latest").strip() == "step_000004"
        assert whole_on(lab3, FULL_HOST, ckpt / "step_000002")
        assert whole_on(lab3, FULL_HOST, ckpt / "step_000004")
        steps_on = {i: checkpoint_steps(on_host(lab3, i, ckpt)) for i in (0, 2)}
        newest = max(max(steps) for steps in steps_on.values())
        # The lowest rank holding it sends it (reference_train/resume.py); labhost1 may
        # not have written step 6 before the job was stopped (seen in CI): then labhost3.
        source = next(lab3.hosts[i].name for i in (0, 2) if newest in steps_on[i])

        # 3. room freed: resumed, trained to the end, the uninterrupted run's losses
        lab3.resize_small_disk(FULL_HOST, ckpt, "16m")
        proc = train("--resume", "auto")
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        assert f"at step {newest}" in proc.stdout and "is damaged" not in text
        if newest > 4:
            assert f"labhost2 (rank 1) had step 4: step_{newest:06d} sent from {source}" in text
        assert "warning: labhost2:" not in text
        assert lab3.host_exists(FULL_HOST, ckpt / f"step_{STEPS:06d}" / "state.json")
    finally:
        lab3.heal(FULL_HOST)

    losses = {r["step"]: r["loss"] for r in records(out / "metrics.jsonl") if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in losses.items():
        assert abs(loss - reference[step]) <= 1e-6 * abs(reference[step]), (step, loss, reference[step])
