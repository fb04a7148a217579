"""``doctor --fix --yes`` on real sshd hosts: one host's key unknown, the
inventory without MLX_MPI_LIBNAME and the OpenBLAS preload (the lab's mlx
runs the reference BLAS; OpenBLAS is installed). After the fix, ``doctor
--strict --backend mpi`` passes, the inventory's comments are kept, a second
``--fix`` finds nothing to change, and ``--undo`` puts the inventory and the
known_hosts file back byte for byte.

Host-to-host SSH is not covered here (this lab's hosts share this machine's
``/root/.ssh``): tests/lab/test_doctor_fix_combined_lab.py fixes it on hosts
with a ``~/.ssh`` each.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import waits

pytestmark = pytest.mark.lab


def mlxcluster(lab, env, *args: str) -> subprocess.CompletedProcess:
    return waits.run([sys.executable, "-m", "mlxcluster", *args], env=env)


def test_fix_yes_then_strict_passes_twice_is_once_and_undo_restores(lab3, tmp_path):
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    text = inventory.read_text().replace("hosts:\n", "# the lab's hosts\nhosts:   # one per namespace\n")
    inventory.write_text(text)
    env = lab3.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    doctor = ("doctor", "-i", str(inventory), "--backend", "mpi", "--no-data-path")
    lab3.forget_host_key(1)
    try:
        known_before = lab3.known_hosts.read_bytes()
        fixed = mlxcluster(lab3, env, *doctor, "--fix", "--yes")
        assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr
        out = fixed.stdout
        assert f"trust {lab3.hosts[1].ip}'s ssh-ed25519 key SHA256:" in out
        assert "[✗] -> [✓] Host keys known" in out
        assert "[!] -> [✓] MLX finds libmpi without mlxcluster" in out
        assert "[!] -> [✓] mlx uses an optimised BLAS (Linux)" in out
        after = inventory.read_text()
        assert "# the lab's hosts\nhosts:   # one per namespace\n" in after
        assert after.count("MLX_MPI_LIBNAME:") == 3 and after.count("LD_PRELOAD:") == 3
        assert (tmp_path / "lab.yaml.bak").read_text() == text
        strict = mlxcluster(lab3, env, *doctor, "--strict")
        assert strict.returncode == 0, strict.stdout[-3000:]
        again = mlxcluster(lab3, env, *doctor, "--fix", "--yes")
        assert again.returncode == 0 and "fix plan: nothing here can be fixed" in again.stdout
        assert inventory.read_text() == after
        [journal] = sorted((tmp_path / "config" / "mlxcluster" / "fixes").glob("*.json"))
        undo = mlxcluster(lab3, env, "doctor", "--undo", str(journal))
        assert undo.returncode == 0, undo.stdout + undo.stderr
        assert inventory.read_text() == text
        assert lab3.known_hosts.read_bytes() == known_before
    finally:
        lab3.heal()
