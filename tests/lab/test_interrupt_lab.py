"""Ctrl-C / SIGTERM in the middle of a run across three real lab hosts: the
command stops every rank on every host, removes the run's files there, and
exits 128 + the signal. Checked over ssh on every host, as a user would."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.interrupt_helpers import (
    SmokeWorkersRunning,
    interrupt_when,
    processes_with,
    smoke_run_id,
)
from tests.lab.jobs import data_here, left_on_hosts, our_prted, training_setup

pytestmark = pytest.mark.lab

MLXCLUSTER = [sys.executable, "-m", "mlxcluster"]


def on_the_hosts(lab, marker: str) -> list[str]:
    """What runs on this lab's hosts with ``marker`` in its command line: not
    this machine's whole process table, where another test worker's doctor
    may run agents of its own lab at the same moment."""
    return [line for h in lab.hosts for line in lab.host_processes(h) if marker in line]


def test_ctrl_c_stops_a_smoke_run_on_every_host(lab3, tmp_path):
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    run = interrupt_when([*MLXCLUSTER, "smoke", "-i", str(inventory), "--backend", "ring",
                          "--bench", "--sizes", "1K:64M", "--phase-timeout", "120"],
                         SmokeWorkersRunning(3), signal.SIGINT, env=lab3.env(), cwd=str(tmp_path))
    assert run.returncode == 130, run.stderr
    assert "interrupted (SIGINT): smoke ring run" in run.stderr
    assert "stopped on every host" in run.stderr
    run_id = smoke_run_id(run.stderr)
    pattern = f"[{run_id[0]}]{run_id[1:]}"
    assert left_on_hosts(lab3, pattern, f"/tmp/{pattern}") == {}
    assert processes_with(run_id) == []


@pytest.mark.parametrize("backend, sig", [("ring", signal.SIGTERM), ("mpi", signal.SIGINT)])
def test_interrupt_stops_training_on_every_host(lab3, lab_data, tmp_path, backend, sig):
    inventory, env = training_setup(lab3, tmp_path)
    out = lab3.disk / f"run-{backend}"  # every host's own disk; the record here
    metrics = out / "metrics.jsonl"
    run = interrupt_when(
        [*MLXCLUSTER, "train", "-i", str(inventory), "--backend", backend, "--config", "tiny",
         "--no-preflight", "--", "--steps", "100000", "--global_batch", "6", "--data",
         str(data_here(lab3, lab_data)), "--out", str(out), "--sample_tokens", "0"],
        lambda _: metrics.exists() and '"loss"' in metrics.read_text(), sig, env=env,
        cwd=str(tmp_path), ready_timeout=180)
    name = signal.Signals(sig).name
    assert run.returncode == 128 + sig, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"interrupted ({name}): the job was stopped on every rank" in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert left_on_hosts(lab3, f"[r]eference_train.*--out {out}") == {}  # this run only
    assert our_prted(lab3) == []  # no Open MPI daemon of this lab either
    steps = metrics.read_text()
    time.sleep(2)  # an absence to prove: a rank still training would log a step (well under 1 s each) meanwhile
    assert metrics.read_text() == steps  # nobody trains on


@pytest.mark.parametrize("moment", ["agents running", "a host not answering"])
def test_ctrl_c_stops_doctor_at_once_and_on_every_host(lab3, tmp_path, moment):
    """Interrupted while its data-path agents run on the hosts, or while it
    waits on a host whose SSH port drops packets (--connect-timeout 30),
    doctor exits at once, not after its timeouts, and no agent or hop script
    is left on any host."""
    from mlxcluster.doctor.datapath import AGENT
    from mlxcluster.ssh.hops import HOPS

    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    # --backend mpi: doctor makes the host-to-host hops only for mpi.
    argv = [*MLXCLUSTER, "doctor", "-i", str(inventory), "--backend", "mpi", "--connect-timeout", "30"]
    if moment == "agents running":
        # Their connects to labhost3's data ports wait out their timeout: the
        # agents run for seconds, not the fraction of one a healthy lab takes
        # (the poll below, every 0.2 s, once missed them all: CI, 2026-11-24).
        lab3.drop_port(lab3.hosts[2], "32323-32400")
        ready = lambda _: bool(on_the_hosts(lab3, AGENT))  # noqa: E731
    else:
        # Interrupted while the hosts' hops to labhost3 wait on its dropped port.
        lab3.drop_port(lab3.hosts[2], 22)
        ready = lambda _: bool(on_the_hosts(lab3, HOPS))  # noqa: E731
    try:
        run = interrupt_when(argv, ready, signal.SIGINT, env=lab3.env())
        assert run.returncode == 130, run.stdout + run.stderr
        assert "interrupted (SIGINT)" in run.stderr and "Traceback" not in run.stderr
        assert run.seconds_to_exit < 3.0
        # Each ends itself once its session's sshd is gone (the agent at its
        # stdin's end, the hop script at its output's), while labhost3 still
        # drops: in moments, not at its hops' 30 s or once healed (CI,
        # 2026-11-30: hop scripts found 1 s after doctor had exited).
        left = lambda: on_the_hosts(lab3, AGENT) + on_the_hosts(lab3, HOPS)  # noqa: E731
        deadline = time.monotonic() + 15
        while left() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left() == []
    finally:
        lab3.heal(lab3.hosts[2])
