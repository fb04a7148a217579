"""A job logs in to each host once (jobs.connections, ssh.shared): the python
check opens one shared connection per host, and the launcher's start of
every rank, its stop calls and our sweep ride on it; when the job is over no
master connection of it is left here and its socket folder is gone.

Counted from the lab hosts' own sshd logs ("Accepted publickey" per login),
for `mlxcluster run --no-preflight` on ring and MPI, for a job that passes
and one whose rank 1 fails (the launcher's stop calls and the sweep's KILL
then also go to every host).
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest

from tests.lab.jobs import bracketed, left_on_hosts
from tests.lab.test_run_lab import ALLSUM, FAILS, run_on_lab

pytestmark = pytest.mark.lab

LOGIN = re.compile(r"Accepted publickey for ")


def logins(lab) -> dict[str, int]:
    """Logins each lab host's sshd has accepted so far."""
    return {h.name: len(LOGIN.findall((lab.state / f"sshd_{h.name}.log").read_text(errors="replace")))
            for h in lab.hosts}


def job_folders() -> set[str]:
    """The socket folders of jobs running now (ssh.shared.open_folder)."""
    return {str(p) for p in Path("/tmp").glob("mlxc-*")}


def orphaned_masters() -> list[str]:
    """ssh master connections ("ssh: /tmp/mlxc-XXXX/HASH [mux]") whose job's
    socket folder is gone: left behind by a job that is over. (Other jobs on
    this machine may hold masters in their own folders meanwhile.)"""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        match = re.search(r"(/tmp/mlxc-[^/\s]+)/\S+ \[mux\]", cmdline)
        if match and not Path(match.group(1)).exists():
            found.append(cmdline)
    return found


@pytest.mark.parametrize("backend", ["ring", "mpi"])
@pytest.mark.parametrize("script,code", [(ALLSUM, 0), (FAILS, 3)], ids=["passes", "rank1-fails"])
def test_a_job_logs_in_once_per_host_and_leaves_no_connection(lab3, tmp_path, backend, script, code):
    before_folders = job_folders()
    before = logins(lab3)
    proc, run_id, took = run_on_lab(lab3, tmp_path, backend, script, "--no-preflight")
    after = logins(lab3)
    out = proc.stdout + proc.stderr
    added = {name: after[name] - before[name] for name in after}
    print(f"run {backend} (exit {proc.returncode}, {took:.1f} s): logins per host {added}")
    assert proc.returncode == code, out[-3000:]
    assert added == {h.name: 1 for h in lab3.hosts}, out[-3000:]
    assert job_folders() - before_folders == set()  # this job's folder is removed
    assert orphaned_masters() == []
    assert left_on_hosts(lab3, bracketed(run_id)) == {}
