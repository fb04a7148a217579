"""`mlxcluster train` across three real lab hosts, on ring and MPI, and when a host is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests import waits
from tests.lab.jobs import REPO, run_train, training_setup

pytestmark = pytest.mark.lab


def assert_nothing_left(lab, out):
    """No trainer of this run remains on any host (matched by its unique --out path;
    the [r] keeps pgrep, and the ssh running it, from matching themselves)."""
    for h in lab.hosts:
        left = lab.ssh(h, f"pgrep -af '[r]eference_train.*{out.name}' || true").stdout.strip()
        assert left == "", f"{h.name} still runs: {left}"


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_train_across_three_hosts(lab3, lab_data, tmp_path, backend):
    proc, out = run_train(lab3, tmp_path, lab_data, backend)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[✓] 3 host(s) run" in proc.stdout
    assert f"[✓] smoke: all_sum over 3 ranks on {backend} = 3" in proc.stdout
    assert "ranks 3 | global batch 6 = 3 ranks x 1 accum x 2" in proc.stdout
    # The run's record is on this machine, though no rank ran here ...
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["ranks"] == 3 and len(r["peak_mem_mb"]) == 3 for r in train)
    assert records[0]["event"] == "start" and records[0]["step"] == 0
    assert "step      3/3 | loss" in (out / "train.log").read_text()
    assert (out / "loss.png").stat().st_size > 0 and not (out / "checkpoints").exists()
    # ... and every host keeps its own checkpoints, and no record.
    for h in lab3.hosts:
        assert lab3.host_read(h, out / "checkpoints" / "latest").strip() == "step_000003"
        assert not lab3.host_exists(h, out / "metrics.jsonl")
    assert "train finished on 3 rank(s)" in proc.stdout
    assert_nothing_left(lab3, out)


def test_the_record_here_stays_whole_across_a_resume(lab3, lab_data, tmp_path):
    """Stopped at step 2 and resumed to 4: this machine's metrics.jsonl holds every
    step once, and its train.log both launches; the hosts resumed from their own disks."""
    inventory, env = training_setup(lab3, tmp_path)
    out = lab3.disk / f"run-{uuid.uuid4().hex[:8]}"

    def train(*extra: str) -> subprocess.CompletedProcess:
        proc = waits.run(
            [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
             "--config", "tiny", "--", "--steps", "4", "--global_batch", "6", "--data",
             str(lab_data), "--out", str(out), "--sample_tokens", "0", *extra],
            env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    train("--stop_after", "2")
    proc = train("--resume")
    assert "at step 2" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert [(r["event"], r["step"]) for r in records if "event" in r] == [("start", 0),
                                                                          ("start", 2)]
    assert (out / "train.log").read_text().count("== ") == 2
    assert_nothing_left(lab3, out)


def test_preflight_names_the_host_with_the_wrong_python(lab3, lab_data, tmp_path):
    other = os.path.join(sys.base_prefix, "bin", "python3")
    try:
        lab3.set_host_python(2, other)
        proc, out = run_train(lab3, tmp_path, lab_data, "ring")
    finally:
        lab3.heal(2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # doctor's check names the host, and nothing was launched
    assert "[✗] mlx importable, the same version everywhere  [mlx-version]" in proc.stderr
    blamed = [ln for ln in proc.stderr.splitlines() if ln.strip().startswith("labhost3:")]
    assert blamed and "0.32" not in blamed[0], proc.stderr
    assert "doctor found 1 failing check(s)" in proc.stderr
    assert not out.exists()


def test_a_failing_rank_stops_every_host_and_gives_its_code(lab3, lab_data, tmp_path):
    other = os.path.join(sys.base_prefix, "bin", "python3")
    try:
        lab3.set_host_python(2, other)  # rank 2 cannot import mlx: exits 1 at once
        proc, out = run_train(lab3, tmp_path, lab_data, "ring", "--no-preflight", steps=1000)
    finally:
        lab3.heal(2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "train failed: rank 2 exited with code 1" in proc.stderr
    # mlx.launch runs remote ranks on a terminal, so their stderr arrives on stdout
    assert "No module named 'mlx'" in proc.stdout + proc.stderr
    assert_nothing_left(lab3, out)


def test_train_from_an_mlx_launch_hostfile(lab3, lab_data, tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": h.ip, "ips": [h.ip]} for h in lab3.hosts]}))
    out = lab3.disk / f"run-{uuid.uuid4().hex[:8]}"
    env = lab3.env()
    env["PYTHONPATH"] = str(REPO)
    proc = waits.run(
        [sys.executable, "-m", "mlxcluster", "train", "--hostfile", str(hostfile), "--python",
         lab3.python, "--config", "tiny", "--", "--steps", "2", "--global_batch", "6",
         "--data", str(lab_data), "--out", str(out), "--sample_tokens", "0"],
        env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[✓] 3 host(s) run" in proc.stdout and "all_sum over 3 ranks on ring = 3" in proc.stdout
    assert "step      2/2 | loss" in proc.stdout
    assert_nothing_left(lab3, out)


def ssh_logins(lab) -> dict[str, int]:
    """How many ssh logins each host's sshd has accepted so far (its own log)."""
    counts = {}
    for h in lab.hosts:
        log = lab.state / f"sshd_{h.name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        counts[h.name] = text.count("Accepted publickey")
    return counts


def test_a_batch_that_does_not_split_over_the_hosts_starts_nothing(lab3, lab_data, tmp_path):
    """The tiny config's global batch of 8 over 3 hosts: exit 2 with the
    arithmetic and the fix before any preflight; no host is even logged into."""
    inventory, env = training_setup(lab3, tmp_path)
    out = lab3.disk / f"run-{uuid.uuid4().hex[:8]}"
    lab3.ssh(0, "true", check=True)  # the logs are live: this login is counted
    before = ssh_logins(lab3)
    assert before["labhost1"] >= 1, before
    proc = waits.run(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--config", "tiny",
         "--", "--steps", "3", "--data", str(lab_data), "--out", str(out)],
        env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("error: global_batch 8 does not split over 3 ranks (8 % 3 = 2): use --global_batch "
            "6 or 9") in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "launching" not in proc.stdout and "[✓]" not in proc.stdout
    assert ssh_logins(lab3) == before  # no probe, no smoke, no rank on any host
    assert not out.exists()
    assert_nothing_left(lab3, out)
