"""When the machine running `mlxcluster train` goes away, on hosts with their
own disks: killed (`kill -9` of its process group), or cut off (its ssh to
every host dropped, the hosts' own links up). Within the lease every rank on
every host writes a last checkpoint at the step they agree on and ends;
`--resume auto` then gives the uninterrupted run's losses.

Before the lease (measured on this lab, issue 39): after such a kill both
ranks trained on to the last step of a 3000-step job, 74 s later, with
nobody watching them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests import waits
from tests.lab.jobs import (
    data_here,
    on_host,
    records,
    start_training,
    training_setup,
    wait_for_losses,
)
from tests.waits import CONTROLLER_GONE_BOUND_S, LEASE_TEST_S, poll_until

pytestmark = pytest.mark.lab


def ranks_of(out: Path) -> list[str]:
    """This run's rank processes on any lab host: the lab's hosts share this
    machine's process table (a rank's host is its sshd's namespace)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "rank_wrapper" in cmdline and f"--out {out}" in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline[:120]}")
    return found


def losses(metrics: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(metrics) if "loss" in r}


def last_checkpoint(lab, out: Path) -> list[int]:
    """The step of the newest checkpoint on each host's own disk."""
    steps = []
    for i in range(len(lab.hosts)):
        latest = on_host(lab, i, out / "checkpoints" / "latest").read_text().strip()
        assert on_host(lab, i, out / "checkpoints" / latest / "state.json").is_file()
        steps.append(int(latest[len("step_"):]))
    return steps


def train_to(lab, lab_data, tmp_path, out: Path, stop: int, *extra: str) -> subprocess.Popen:
    inventory, env = training_setup(lab, tmp_path)
    return subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--backend", "ring",
         "--config", "tiny", "--no-preflight", "--", "--steps", "100000", "--global_batch", "6",
         "--data", str(data_here(lab, lab_data)), "--out", str(out), "--sample_tokens", "0",
         "--stop_after", str(stop), *extra],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def end_ssh_masters(controller: int) -> None:
    """The killed controller's shared ssh connections (ControlPersist: they
    end on their own 30 s after their last session; the shared lab is
    checked before that)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(f"mlxc-{controller}-" in part for part in proc.info["cmdline"] or []):
            proc.kill()


def resumes_exactly(lab, lab_data, tmp_path, out: Path, last: int) -> None:
    """`--resume auto` from the last checkpoint (step ``last``), then an
    uninterrupted run (one after the other: two ring jobs on the same hosts
    would both take the ring's ports): the record's losses (before the
    controller went, and resumed) equal the uninterrupted run's within 1e-6."""
    metrics = out / "metrics.jsonl"
    stop = last + 3
    straight_out = lab.disk / f"straight-{uuid.uuid4().hex[:8]}"
    resumed = train_to(lab, lab_data, tmp_path, out, stop, "--resume", "auto")
    said = waits.communicate(resumed, "the resumed run", paths=[out])
    assert resumed.returncode == 0, said
    straight = train_to(lab, lab_data, tmp_path, straight_out, stop)
    assert waits.communicate(straight, "the straight run", paths=[straight_out])
    assert straight.returncode == 0
    assert f"resumed from {out / 'checkpoints' / f'step_{last:06d}'}" in said[0]
    want, got = losses(straight_out / "metrics.jsonl"), losses(metrics)
    assert set(range(last + 1, stop + 1)) <= set(got)
    for step, loss in got.items():  # before the controller went, and resumed
        assert abs(loss - want[step]) < 1e-6, (step, loss, want[step])


def wait_for_ranks_gone(out: Path, since: float) -> float:
    poll_until(lambda: not ranks_of(out), CONTROLLER_GONE_BOUND_S,
               f"every rank of {out} gone (left: {ranks_of(out)})")
    return time.monotonic() - since


def test_the_controller_killed_every_rank_checkpoints_and_stops_and_resume_is_exact(
        lab3, lab_data, tmp_path, short_lease):
    proc, metrics = start_training(lab3, lab_data, tmp_path, "ring")
    out = metrics.parent
    try:
        wait_for_losses(proc, metrics, 3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mlxcluster train, as a closed terminal kills it
    killed = time.monotonic()
    proc.communicate()
    took = wait_for_ranks_gone(out, killed)
    end_ssh_masters(proc.pid)
    print(f"every rank gone {took:.1f} s after the controller was killed (lease {LEASE_TEST_S} s)")
    assert took >= LEASE_TEST_S - 1  # they trained on until the lease ran out
    steps = last_checkpoint(lab3, out)
    assert len(set(steps)) == 1 and steps[0] >= max(losses(metrics)), steps  # one step, everywhere
    last = steps[0]

    resumes_exactly(lab3, lab_data, tmp_path, out, last)


def test_the_controller_cut_off_every_rank_checkpoints_and_stops_and_resume_is_exact(lab3, lab_data, tmp_path,
                                                                 short_lease):
    proc, metrics = start_training(lab3, lab_data, tmp_path, "ring")
    out = metrics.parent
    try:
        wait_for_losses(proc, metrics, 3)
        for host in lab3.hosts:  # ssh to every host dropped; the hosts' ring links stay up
            lab3.drop_port(host, 22)
        cut = time.monotonic()
        took = wait_for_ranks_gone(out, cut)
        print(f"every rank gone {took:.1f} s after the controller was cut off "
              f"(lease {LEASE_TEST_S} s)")
        assert took >= LEASE_TEST_S - 1
        # mlxcluster itself finds its hosts lost (ssh's keepalive) and ends, naming it.
        said = proc.communicate(timeout=CONTROLLER_GONE_BOUND_S + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        lab3.heal()
        # The hosts' sshd still hold the sessions of the cut connections (no
        # FIN came through, and sshd sends no keepalive by default): a
        # closed lid leaves them so on a Mac too, holding no rank.
        lab3.kill_host_processes()
    assert proc.returncode == 255, said
    assert "ssh connection to labhost" in said[1], said[1][-2000:]
    steps = last_checkpoint(lab3, out)
    assert len(set(steps)) == 1 and steps[0] >= max(losses(metrics)), steps
    resumes_exactly(lab3, lab_data, tmp_path, out, steps[0])
