"""`mlxcluster smoke` on the 3-host lab: ring and MPI across real sshd hosts
(real mlx.launch / mpirun traffic between network namespaces), a small
benchmark, and faults: a rank that exits non-zero and a data port dropped on
one host both end the run within its timeout, name the host, and leave no
process of the run on any host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxcluster.jobs.plan import MPI_BTL_PORT, RING_PORT
from tests import waits
from tests.interrupt_helpers import SmokeWorkersRunning
from tests.lab.jobs import assert_nothing_left

pytestmark = pytest.mark.lab


SMALL = ["--sizes", "1K:2K", "--dtypes", "float32"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Every smoke of this module runs from a folder of its own: a hang's
    report (./runs/stall-RUN_ID by default) never lands in the checkout."""
    monkeypatch.chdir(tmp_path)


def smoke(lab, lab_inventory, *args: str, env: dict[str, str] | None = None):
    """Run the real CLI as a subprocess with the lab's ssh on PATH."""
    started = time.monotonic()
    proc = waits.run([sys.executable, "-m", "mlxcluster", "smoke", "-i", str(lab_inventory),
                           *args, "--json"], env={**lab.env(), **(env or {})})
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["backends"][0], time.monotonic() - started


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_three_hosts_pass_with_bench(lab3_own_tmp, lab_inventory, backend):
    code, run, _ = smoke(lab3_own_tmp, lab_inventory, "--backend", backend, *SMALL, "--bench")
    assert code == 0, run["reason"]
    assert [(r["rank"], r["host"], r["status"]) for r in run["ranks"]] == [
        (0, "labhost1", "passed"), (1, "labhost2", "passed"), (2, "labhost3", "passed")]
    assert run["checks"] == 3 * 3 * 4  # 3 ranks x 3 sizes x (all_sum, all_gather, 2 send/recv)
    assert {b["op"] for b in run["bench"]} == {"all_sum", "all_gather", "send_recv"}
    assert all(b["ranks"] == 3 and b["p50_s"] > 0 for b in run["bench"])
    assert_nothing_left(lab3_own_tmp, run)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_failing_rank_names_its_host(lab3_own_tmp, lab_inventory, backend):
    code, run, elapsed = smoke(lab3_own_tmp, lab_inventory, "--backend", backend, *SMALL, "--phase-timeout", "20",
                               env={"MLXCLUSTER_SMOKE_FAIL_RANK": "2"})
    # The deadline bounds each phase; staging and cleanup over ssh come on top.
    assert code == 1 and elapsed < 20 + 10
    assert run["reason"] == "rank 2 on labhost3: exited with code 3 in phase ready"
    assert "test hook: rank 2 fails on purpose" in run["ranks"][2]["stderr_tail"]
    assert_nothing_left(lab3_own_tmp, run)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_dropped_data_port_names_its_host(lab3_own_tmp, lab_inventory, backend, tmp_path):
    # labhost3 runs rank 2: drop what its peers connect to (ring: its listen
    # port; MPI: the pinned btl_tcp port range).
    port = RING_PORT + 2 if backend == "ring" else f"{MPI_BTL_PORT}-{MPI_BTL_PORT + 15}"
    lab3_own_tmp.drop_port(lab3_own_tmp.hosts[2], port)
    try:
        code, run, elapsed = smoke(lab3_own_tmp, lab_inventory, "--backend", backend, *SMALL,
                                   "--phase-timeout", "8", "--stall-dir", str(tmp_path))
    finally:
        lab3_own_tmp.heal(lab3_own_tmp.hosts[2])
    assert code == 4  # no progress within the deadline: a stall (docs/smoke.md, exit codes)
    assert elapsed < 8 + 25
    assert run["reason"].startswith("rank 2 on labhost3: no progress for 8 s"), run["reason"]
    assert "unreachable from here (timed out)" in run["reason"]
    assert [r["status"] for r in run["ranks"]] == ["stopped", "stopped", "hung"]
    assert (tmp_path / f"stall-{run['run_id']}" / "summary.txt").exists()  # the evidence, kept
    assert_nothing_left(lab3_own_tmp, run)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_the_inventorys_ssh_config_reaches_the_launcher(lab3_own_tmp, tmp_path, backend):
    """Hosts named by Host aliases that only the inventory's ssh_config
    defines, and the plain ssh on PATH (not the lab's wrapper, which adds -F):
    mlx.launch and mpirun still reach every host, through the launcher ssh
    mlxcluster gives them. Before, only our own ssh calls read ssh_config."""
    lab_inventory = lab3_own_tmp.write_inventory(tmp_path / "aliases.yaml", use_names=True)
    path = ":".join(p for p in lab3_own_tmp.env()["PATH"].split(":") if p != str(lab3_own_tmp.bin_dir))
    code, run, _ = smoke(lab3_own_tmp, lab_inventory, "--backend", backend, *SMALL, env={"PATH": path})
    assert code == 0, run["reason"]
    assert [(r["host"], r["status"]) for r in run["ranks"]] == [
        ("labhost1", "passed"), ("labhost2", "passed"), ("labhost3", "passed")]
    assert_nothing_left(lab3_own_tmp, run)


def test_a_host_lost_mid_run_is_named_and_the_rest_stopped(lab3_own_tmp, lab_inventory):
    """labhost3's link goes down while the benchmark runs: the run ends within
    its deadline, blames rank 2 on labhost3 for a lost ssh connection, stops
    the others, and names labhost3 as a host it could not clean up."""
    ready = SmokeWorkersRunning(3)
    proc = subprocess.Popen([sys.executable, "-m", "mlxcluster", "smoke", "-i", str(lab_inventory),
                             "--backend", "ring", "--bench", "--sizes", "1K:64M", "--phase-timeout", "30",
                             "--json"], env=lab3_own_tmp.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready(proc):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
        lab3_own_tmp.link_down(lab3_own_tmp.hosts[2])
        lost_at = time.monotonic()
        out, err = proc.communicate(timeout=120)
        ended_after = time.monotonic() - lost_at
    finally:
        if proc.poll() is None:
            proc.kill()
        lab3_own_tmp.heal(lab3_own_tmp.hosts[2])
    run = json.loads(out)["backends"][0]
    assert proc.returncode == 1 and ended_after < 30 + 25, (ended_after, err)
    assert run["reason"].startswith("rank 2 on labhost3: its ssh connection failed or was lost"), run["reason"]
    assert [r["status"] for r in run["ranks"]] == ["stopped", "stopped", "exited"]
    assert [p.split(":")[0] for p in run["cleanup_problems"]] == ["labhost3"]
    # Once labhost3 is back, do what the report says for it (its own /tmp holds the
    # run's files: the sweep could not reach it); then no host holds anything of the run.
    advice = run["cleanup_problems"][0].split("when it answers again: ")[1]
    for command in advice.split(", then "):
        assert command.startswith("ssh labhost3 "), advice
        lab3_own_tmp.ssh(lab3_own_tmp.hosts[2], command.removeprefix("ssh labhost3 ") + "; true")
    assert_nothing_left(lab3_own_tmp, {**run, "cleanup_problems": []})
    # sshd's sessions the cut link left, their commands ended (test_dead_host_lab; seen in CI)
    lab3_own_tmp.end_orphaned_sessions(lab3_own_tmp.hosts[2])


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_fish_login_shell_is_named_before_anything_is_launched(lab3_own_tmp, lab_inventory, backend):
    """labhost2's login shell is fish, which parses neither mlx.launch's nor
    mpirun's command line (measured: both hang, tests/lab/test_lab.py); smoke
    waited for its --phase-timeout, then called the rank not started. Now its
    preflight asks every host's login shell: exit 3 at once, labhost2 and the
    fix named, nothing staged or started anywhere."""
    lab3_own_tmp.set_login_shell(lab3_own_tmp.hosts[1], "fish")
    try:
        code, run, elapsed = smoke(lab3_own_tmp, lab_inventory, "--backend", backend, *SMALL,
                                   "--phase-timeout", "30")
    finally:
        lab3_own_tmp.heal(lab3_own_tmp.hosts[1])
    launcher = "mpirun" if backend == "mpi" else "mlx.launch"
    assert code == 3 and run["status"] == "unavailable", run
    assert run["reason"] == (
        f"labhost2: its login shell /usr/bin/fish cannot parse the command line {launcher} "
        "sends over ssh (the launch would hang, or that rank exit 2): chsh -s /bin/zsh (macOS) "
        "or chsh -s /bin/bash (Linux) there"), run["reason"]
    assert elapsed < 15, elapsed  # not the 30 s deadline
    assert run["run_id"] == "" and run["ranks"] == []  # nothing planned, so nothing launched
    for host in lab3_own_tmp.hosts:
        out = lab3_own_tmp.ssh(host, "ls -d /tmp/mlxsmoke-* 2>/dev/null; true")
        assert out.stdout.strip() == "", (host.name, out.stdout)


def test_jaccl_from_the_inventory_is_unavailable_per_host(lab3_own_tmp, lab_inventory):
    """No --hostfile needed: the RDMA matrix would come from the hosts' live
    topology; these Linux hosts have no RDMA and no Thunderbolt, each says so,
    exit 3, and no worker was copied or started anywhere."""
    proc = waits.run([sys.executable, "-m", "mlxcluster", "smoke", "--backend", "jaccl",
                           "-i", str(lab_inventory)], env=lab3_own_tmp.env())
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "3 of 3 host(s) cannot take part" in proc.stdout
    for h in lab3_own_tmp.hosts:
        assert (f"  {h.name}: runs Linux, not macOS (JACCL needs macOS 26.2 or later); no rdma_* "
                "devices (ibv_devices not found); no Thunderbolt link faster than 40 Gb/s (no "
                "Thunderbolt cable to another host)") in proc.stdout, proc.stdout
    assert "backend unavailable" in proc.stdout
    code, run, _ = smoke(lab3_own_tmp, lab_inventory, "--backend", "jaccl")
    assert code == 3 and run["status"] == "unavailable"
    # No run was planned: a run id and a launcher command exist from the plan on.
    assert run["run_id"] == "" and run["command"] == [] and run["ranks"] == []
    assert sorted(run["host_reasons"]) == [h.name for h in lab3_own_tmp.hosts]


def test_every_host_has_its_own_tmp(lab3_own_tmp):
    """The lab of this module: a file under /tmp on labhost2 is on no other host, nor here."""
    probe = "/tmp/own-tmp-probe.txt"
    lab3_own_tmp.ssh(1, f"echo labhost2 > {probe}", check=True)
    try:
        assert lab3_own_tmp.host_read(1, probe) == "labhost2\n"
        assert not lab3_own_tmp.host_exists(0, probe) and not lab3_own_tmp.host_exists(2, probe)
        assert not Path(probe).exists()
    finally:
        lab3_own_tmp.ssh(1, f"rm -f {probe}")
