"""Generated hostfiles drive real launches: mlx.launch (ring) and mpirun (MPI)
across the lab's three hosts, all_sum == 3 on every rank."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from tests.lab.jobs import run_job

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
VENV = Path(sys.executable).parent.parent
EXPECTED = [(0, 3, 3, "labhost1"), (1, 3, 3, "labhost2"), (2, 3, 3, "labhost3")]


def generate(*args):
    result = CliRunner().invoke(main, ["hostfile", "generate", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_generated_ring_hostfile_launches(lab3, tmp_path):
    inv = lab3.write_inventory(tmp_path / "inv.yaml")
    hostfile = tmp_path / "ring.json"
    generate("-i", str(inv), "--backend", "ring", "-o", str(hostfile))
    check = CliRunner().invoke(main, ["hostfile", "check", str(hostfile), "-i", str(inv)])
    assert check.exit_code == 0, check.output
    rows = run_job([str(VENV / "bin" / "mlx.launch"), "--hostfile", str(hostfile),
                    "--python", lab3.python, str(HERE / "allsum.py"), "ring"], lab3)
    assert rows == EXPECTED


def test_generated_mpi_command_runs(lab3, tmp_path):
    inv = lab3.write_inventory(tmp_path / "inv.yaml")
    hostfile = tmp_path / "hosts"
    out = generate("-i", str(inv), "--backend", "mpi", "-o", str(hostfile),
                   "--mpi-libname", str(VENV / "lib" / "libmpi.so.40"),
                   "--mpi-arg=--allow-run-as-root", "--script", str(HERE / "allsum.py"))
    # Each host as the inventory logs in (user: root), which mpirun hands to ssh as is
    assert hostfile.read_text() == "".join(f"root@{h.ip} slots=1\n" for h in lab3.hosts)
    args = (tmp_path / "hosts.args").read_text()
    assert f"--mca btl_tcp_links 4 --mca plm_ssh_no_tree_spawn 1 --mca btl_tcp_if_include {lab3.subnet}" in args
    command = shlex.split(out.splitlines()[-1])  # the printed, ready-to-run command
    assert command[:5] == ["mpirun", "--hostfile", str(hostfile), "-np", "3"]
    # The inventory python here is the lab dispatcher, with no mpirun beside it.
    command[0] = str(VENV / "bin" / "mpirun")
    rows = run_job(command + ["mpi"], lab3)
    assert rows == EXPECTED


def test_generated_mpi_json_hostfile_launches_with_mlx_launch(lab3, tmp_path):
    inv = lab3.write_inventory(tmp_path / "inv.yaml")
    hostfile = tmp_path / "mpi.json"
    generate("-i", str(inv), "--backend", "mpi", "--format", "mlx", "-o", str(hostfile),
             "--mpi-libname", str(VENV / "lib" / "libmpi.so.40"))
    # mlx.launch ignores --python for the mpi backend (mpirun execs the command
    # itself), so the interpreter goes in the command.
    rows = run_job([str(VENV / "bin" / "mlx.launch"), "--hostfile", str(hostfile),
                    "--mpi-arg=--allow-run-as-root", "--",
                    lab3.python, str(HERE / "allsum.py"), "mpi"], lab3)
    assert rows == EXPECTED
