"""--out on storage several hosts see (a NAS, an NFS or SMB home): each
checkpoint written once, read everywhere.

In the lab ``lab.disk`` is each host's own directory; everything else (this
test's ``tmp_path``) is one filesystem that all three hosts and this machine
see: the shared disk. Before the fix every host's writer renamed each
checkpoint into the same folder, and with 3 hosts checkpointing every step a
rank crashed at the 5th (`OSError: [Errno 39] Directory not empty`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests import waits
from tests.lab.jobs import mlx_launch_trainer, on_host, training_setup
from tests.train_support import run_trainer, train_losses

pytestmark = pytest.mark.lab

STEPS, STOP = 300, 150  # a checkpoint every step: 300 checkpoints, 3 hosts, one folder


def common(data: Path) -> list[str]:
    return ["--config", "tiny", "--steps", str(STEPS), "--global_batch", "6", "--log_every", "1",
            "--eval_every", "0", "--sample_tokens", "0", "--checkpoint_every", "1",
            "--data", str(data)]


@pytest.fixture(scope="module")
def reference(lab_data, tmp_path_factory) -> dict[int, float]:
    """The same run uninterrupted, in one process with the same global batch
    (no checkpoints: they change no loss)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run_trainer([*common(lab_data), "--out", str(out), "--checkpoint_every", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_losses(out)


def assert_matches(got: dict[int, float], reference: dict[int, float], steps) -> None:
    for s in steps:
        assert abs(got[s] - reference[s]) <= 1e-6 * abs(reference[s]), (s, got[s], reference[s])


def no_leftovers(checkpoints: Path) -> None:
    """No temporary or moved-aside checkpoint folder, no storage token."""
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith(".")] == []
    assert not (checkpoints.parent / ".mlxcluster-storage").exists()


def test_three_hosts_checkpoint_every_step_into_one_folder_and_resume(lab3, lab_data, tmp_path,
                                                                     reference):
    inventory, env = training_setup(lab3, tmp_path)
    out = tmp_path / "nas" / "run"  # seen by every host and by this machine

    def train(*extra: str) -> str:
        proc = waits.run(
            [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
             "--", *common(lab_data), "--out", str(out), *extra],
            env=env,
            cwd=tmp_path)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        assert "Errno 39" not in text and "Directory not empty" not in text
        return text

    # doctor, asked before the run: the hosts and this machine see one folder there
    out.mkdir(parents=True)
    doctor = waits.run([sys.executable, "-m", "mlxcluster", "doctor", "-i", str(inventory),
                             "--shared-path", str(out)], env=env, cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "[✓] one folder: labhost1, labhost2, labhost3, this machine" in doctor.stdout
    assert (f"✓ shared storage: labhost1, labhost2, labhost3, this machine see one {out}"
            in doctor.stdout), doctor.stdout
    assert list(out.iterdir()) == []  # its tokens gone

    said = train("--stop_after", str(STOP))
    assert (f"shared storage: labhost1, labhost2, labhost3 see one --out {out}: checkpoints and "
            "exports written once, by rank 0 on labhost1") in said, said[-4000:]
    for h in lab3.hosts:  # the data folder here is the hosts' too: not sent, not hashed there
        assert (f"data: {h.name} sees {lab_data} here, one folder with this machine's (shared "
                "storage): nothing sent") in said, said[-4000:]
    checkpoints = out / "checkpoints"
    assert (checkpoints / "latest").read_text() == f"step_{STOP:06d}\n"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == [f"step_{STOP - 1:06d}",
                                                                  f"step_{STOP:06d}"]
    no_leftovers(checkpoints)

    said = train("--resume", "auto")
    assert f"resumed from {checkpoints / f'step_{STOP:06d}'} at step {STOP}" in said, said[-4000:]
    assert " sent from " not in said  # every host sees the one copy: nothing to send
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert_matches(losses, reference, range(1, STEPS + 1))
    assert (checkpoints / "latest").read_text() == f"step_{STEPS:06d}\n"
    assert (out / "model" / "model.safetensors").is_file()
    no_leftovers(checkpoints)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_doctor_says_each_host_has_its_own_disk(lab3, tmp_path):
    inventory, env = training_setup(lab3, tmp_path)
    doctor = waits.run([sys.executable, "-m", "mlxcluster", "doctor", "-i", str(inventory),
                             "--shared-path", str(lab3.disk)], env=env, cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    for name in ("labhost1", "labhost2", "labhost3", "this machine"):
        assert f"[✓] its own folder: {name}" in doctor.stdout, doctor.stdout
    assert f"✓ no shared storage: each host has its own {lab3.disk}" in doctor.stdout
    for i in range(3):
        assert not lab3.host_exists(i, lab3.disk / ".mlxcluster-storage")


def launch(lab, tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """The trainer under a plain `mlx.launch --hostfile` (no mlxcluster)."""
    return mlx_launch_trainer(lab, tmp_path, args)


def test_two_hosts_on_one_folder_and_one_on_its_own_disk_each_get_the_checkpoint_once(
        lab3, lab_data, tmp_path, reference):
    """labhost1 and labhost2 see --out as one folder (their --out, on their own
    disks, is a link to the shared one), labhost3 has its own. The shared
    folder loses its newest checkpoints: labhost3 sends the newest, written
    there once; then again with that folder as --resume PATH of a new --out."""
    name = f"mixed-{uuid.uuid4().hex[:8]}"
    out = lab3.disk / name  # the path every rank is given
    shared = tmp_path / "nas" / name
    shared.mkdir(parents=True)
    links = [on_host(lab3, i, out) for i in (0, 1)]
    for link in links:
        link.symlink_to(shared)
    try:
        args = [*common(lab_data), "--out", str(out), "--keep_checkpoints", "0"]
        proc = launch(lab3, tmp_path, [*args, "--stop_after", "4"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        assert (f"shared storage: labhost1, labhost2 see one --out {out}: checkpoints and "
                "exports written once, by rank 0 on labhost1") in text, text[-4000:]
        own = on_host(lab3, 2, out) / "checkpoints"
        assert sorted(p.name for p in (shared / "checkpoints").glob("step_*")) == [
            f"step_{s:06d}" for s in range(1, 5)]
        assert sorted(p.name for p in own.glob("step_*")) == [f"step_{s:06d}" for s in range(1, 5)]

        for s in (3, 4):  # the shared copy loses its newest two
            for f in (shared / "checkpoints" / f"step_{s:06d}").iterdir():
                f.unlink()
            (shared / "checkpoints" / f"step_{s:06d}").rmdir()
        proc = launch(lab3, tmp_path, [*args, "--resume", "auto", "--stop_after", "8"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        sent = [ln for ln in text.splitlines() if " sent from " in ln]
        assert len(sent) == 1, text[-4000:]  # once, for the two hosts that share the folder
        assert ("labhost1 (rank 0) had step 2: step_000004 sent from labhost3" in sent[0]
                and "(one copy for rank 1 on labhost2, which share its --out)" in sent[0]), sent
        assert "at step 4" in text
        assert_matches(train_losses(shared), reference, range(5, 9))
        for root in (shared / "checkpoints", own):
            assert (root / "step_000008" / "state.json").is_file()
            assert (root / "latest").read_text() == "step_000008\n"
            no_leftovers(root)

        # --resume PATH outside a new --out (on every host's own disk): which hosts share
        # PATH is found out for PATH, so the shared folder's lost step 8 is written once there
        shutil.rmtree(shared / "checkpoints" / "step_000008")
        again = lab3.disk / f"{name}-again"
        proc = launch(lab3, tmp_path, [*common(lab_data), "--out", str(again), "--keep_checkpoints",
                                       "0", "--resume", str(out / "checkpoints"), "--stop_after", "10"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        assert "shared storage:" not in text  # the new --out: each host its own
        sent = [ln for ln in text.splitlines() if " sent from " in ln]
        assert len(sent) == 1 and ("labhost1 (rank 0) had step 7: step_000008 sent from labhost3"
                                   in sent[0]) and "one copy for rank 1 on labhost2" in sent[0], text
        assert "at step 8" in text
        assert_matches(train_losses(on_host(lab3, 0, again)), reference, range(9, 11))
        assert (shared / "checkpoints" / "step_000008" / "state.json").is_file()
        no_leftovers(shared / "checkpoints")
    finally:
        for link in links:
            link.unlink(missing_ok=True)
