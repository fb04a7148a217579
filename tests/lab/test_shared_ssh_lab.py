"""A job logs in to each host once (jobs.connections, ssh.shared): the python
check (smoke: the worker's staging) opens one shared connection per host, and
the launcher's start of every rank, its stop calls and our sweep ride on it;
when the command is over no master connection of it is left here and its
socket folder (``/tmp/mlxc-PID-...``, PID the command's) is gone.

Counted from the lab hosts' own sshd logs ("Accepted publickey" per login),
for `mlxcluster run --no-preflight` on ring and MPI, for a job that passes
and one whose rank 1 fails (the launcher's stop calls and the sweep's KILL
then also go to every host), and for `mlxcluster smoke`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import waits
from tests.lab.jobs import ALLSUM, FAILS, bracketed, left_on_hosts, training_setup

pytestmark = pytest.mark.lab

LOGIN = re.compile(r"Accepted publickey for ")


def logins(lab) -> dict[str, int]:
    """Logins each lab host's sshd has accepted so far."""
    return {h.name: len(LOGIN.findall((lab.state / f"sshd_{h.name}.log").read_text(errors="replace")))
            for h in lab.hosts}


def socket_folders(pid: int | str = "*") -> set[str]:
    return {str(p) for p in Path("/tmp").glob(f"mlxc-{pid}-*")}


def left_of(pid: int, there_before: set[str]) -> tuple[list[str], list[str]]:
    """The socket folders and the ssh master connections still there of the
    mlxcluster command that ran as ``pid``. A folder ``there_before`` it ran is
    another's: an earlier process with the same pid, killed (seen in CI)."""
    folders = sorted(socket_folders(pid) - there_before)
    masters = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if f"/tmp/mlxc-{pid}-" in cmdline and "[mux]" in cmdline and \
                not any(f"{old}/" in cmdline for old in there_before):
            masters.append(cmdline)
    return folders, masters


def run_cli(lab, argv: list[str], env: dict[str, str], cwd: Path):
    """Run `python -m mlxcluster ARGV`; returns (exit code, output, what it left
    (left_of), logins per host it made)."""
    before, folders_before = logins(lab), socket_folders()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mlxcluster", *argv], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = waits.communicate(proc, f"mlxcluster {argv[0]}")
    after = logins(lab)
    added = {name: after[name] - before[name] for name in after}
    print(f"{' '.join(argv[:1])} (exit {proc.returncode}, {time.monotonic() - start:.1f} s): "
          f"logins per host {added}")
    return proc.returncode, out, left_of(proc.pid, folders_before), added


@pytest.mark.parametrize("backend", ["ring", "mpi"])
@pytest.mark.parametrize("script,code", [(ALLSUM, 0), (FAILS, 3)], ids=["passes", "rank1-fails"])
def test_a_job_logs_in_once_per_host_and_leaves_no_connection(lab3, tmp_path, backend, script, code):
    inventory, env = training_setup(lab3, tmp_path)
    (tmp_path / "prog.py").write_text(script)
    returncode, out, left, added = run_cli(
        lab3, ["run", "-i", str(inventory), "--backend", backend, "--logs", str(tmp_path / "logs"),
               "--no-preflight", "--", "python", str(tmp_path / "prog.py")], env, tmp_path)
    assert returncode == code, out[-3000:]
    assert added == {h.name: 1 for h in lab3.hosts}, out[-3000:]
    assert left == ([], [])
    run_id = re.search(r"run (mlxrun-[0-9a-f]+):", out).group(1)
    assert left_on_hosts(lab3, bracketed(run_id)) == {}


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_smoke_logs_in_once_per_host(lab3, tmp_path, backend):
    """smoke stages its worker, launches, collects and sweeps on one login per host."""
    inventory, env = training_setup(lab3, tmp_path)
    returncode, out, left, added = run_cli(
        lab3, ["smoke", "-i", str(inventory), "--backend", backend], env, tmp_path)
    assert returncode == 0, out[-3000:]
    assert added == {h.name: 1 for h in lab3.hosts}, out[-3000:]
    assert left == ([], [])
