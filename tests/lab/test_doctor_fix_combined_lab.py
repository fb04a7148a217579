"""Issue 30's combined proof of ``doctor --fix`` on real sshd hosts set up one
by one, as Macs are: every host's ``~/.ssh`` is its own (``own_ssh``: a home
per host, which its ssh and sshd use; only this machine's key is authorized,
in the lab's own file), with no keys or known_hosts between the hosts;
labhost2 on another mlx at the same python path (tests/lab/mlx_overlay.py);
an inventory with comments, without MLX_MPI_LIBNAME and the OpenBLAS preload.

After ``doctor --fix --yes``: ``doctor --strict`` passes for mpi and ring,
smoke runs on ring and MPI, an mpirun started on each host reaches the two
others with that host's own keys, the comments are kept; a second run
changes nothing; ``--undo`` (each journal, newest first) puts every host's
``~/.ssh`` and the inventory back byte for byte, and labhost2's mlx.

Needs the package index (pip download) here, as the mlx fix does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import waits
from tests.lab.mlx_overlay import OLD, other_mlx, versions

pytestmark = pytest.mark.lab


def mlxcluster(env, *args: str) -> subprocess.CompletedProcess:
    return waits.run([sys.executable, "-m", "mlxcluster", *args], env=env)


def ssh_dirs(lab) -> dict[str, bytes | None]:
    """Every path under every host's ~/.ssh: file bytes, None for a folder."""
    out = {}
    for h in lab.hosts:
        for path in sorted(lab.host_home(h).glob(".ssh/**/*")) + [lab.host_home(h) / ".ssh"]:
            if path.exists():
                out[str(path)] = None if path.is_dir() else path.read_bytes()
    return out


def test_fix_every_host_then_strict_smoke_mpirun_from_each_host_twice_is_once_undo(make_lab, tmp_path,
                                                                                    monkeypatch):
    started = time.monotonic()
    lab = make_lab(3, own_ssh=True)
    monkeypatch.chdir(tmp_path)  # smoke's run folders, if any, stay here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the wheels: fetched once, here
    env = lab.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    inventory = lab.write_inventory(tmp_path / "lab.yaml")
    text = ("# set up one by one, as Macs are\n"
            + inventory.read_text().replace("hosts:\n", "hosts:   # one per namespace\n"))
    inventory.write_text(text)
    h1, h2, h3 = lab.hosts
    mpirun = Path(lab.default_python).parent / "mpirun"
    here = versions(lab, h1)
    with other_mlx(lab, h2, tmp_path / "overlay"):
        before = ssh_dirs(lab)
        assert before == {}  # no keys, no known_hosts between the hosts
        # The lab gives no trust between hosts: labhost1's own ssh is refused.
        assert lab.ssh(h1, f"ssh -o BatchMode=yes {h2.ip} true").returncode == 255
        doctor = ("doctor", "-i", str(inventory), "--no-data-path")

        fixed = mlxcluster(env, *doctor, "--backend", "mpi", "--fix", "--yes")
        out = fixed.stdout
        assert fixed.returncode == 0, out[-4000:] + fixed.stderr
        for src, dst in ((h1, h2), (h1, h3), (h2, h1), (h2, h3), (h3, h1), (h3, h2)):
            assert f"  applied   [host-to-host-ssh] {dst.name}: {src.name} -> {dst.name}: " in out, out[-4000:]
        assert f"  applied   [mlx-version] {h2.name}:" in out
        assert "[!] -> [✓] SSH between the hosts, every pair" in out
        assert "[✗] -> [✓] mlx importable, the same version everywhere" in out
        assert "[!] -> [✓] MLX finds libmpi without mlxcluster" in out
        assert "[!] -> [✓] mlx uses an optimised BLAS (Linux)" in out
        assert versions(lab, h2) == here
        after = inventory.read_text()
        assert after.startswith("# set up one by one, as Macs are\n") and "hosts:   # one per namespace\n" in after, \
            after  # comments kept
        assert after.count("MLX_MPI_LIBNAME:") + after.count("LD_PRELOAD:") >= 2
        # Each host: its own key, the others' public keys once, their host keys; no private key copied.
        fixed_ssh = ssh_dirs(lab)
        pubs = {h.name: (lab.host_home(h) / ".ssh" / "id_ed25519.pub").read_bytes() for h in lab.hosts}
        assert len({(lab.host_home(h) / ".ssh" / "id_ed25519").read_bytes() for h in lab.hosts}) == 3
        for h in lab.hosts:
            authorized = (lab.host_home(h) / ".ssh" / "authorized_keys").read_bytes()
            assert sorted(authorized.splitlines()) == sorted(p.strip() for n, p in pubs.items() if n != h.name)
            known = (lab.host_home(h) / ".ssh" / "known_hosts").read_text()
            assert sorted(line.split()[0] for line in known.splitlines()) == sorted(o.ip for o in lab.hosts
                                                                                    if o is not h)

        for backend in ("mpi", "ring"):
            strict = mlxcluster(env, "doctor", "-i", str(inventory), "--backend", backend, "--strict")
            assert strict.returncode == 0, f"{backend}:\n{strict.stdout[-3000:]}"
        for backend in ("ring", "mpi"):
            smoke = mlxcluster(env, "smoke", "-i", str(inventory), "--backend", backend,
                               "--sizes", "1K:2K", "--dtypes", "float32")
            assert smoke.returncode == 0, f"{backend}:\n{smoke.stdout[-3000:]}{smoke.stderr[-2000:]}"
        # An mpirun started on a host reaches the others with that host's own keys (every pair).
        for h in lab.hosts:
            others = [o for o in lab.hosts if o is not h]
            run = lab.ssh(h, f"{mpirun} --allow-run-as-root --host {','.join(o.ip for o in others)} -n 2 hostname",
                          timeout=60)
            assert run.returncode == 0 and sorted(run.stdout.split()) == [o.name for o in others], \
                f"mpirun on {h.name}: {run.stdout}{run.stderr}"

        again = mlxcluster(env, *doctor, "--backend", "mpi", "--fix", "--yes")
        assert again.returncode == 0 and "fix plan: nothing here can be fixed" in again.stdout, again.stdout[-3000:]
        assert inventory.read_text() == after and ssh_dirs(lab) == fixed_ssh

        journals = sorted((tmp_path / "config" / "mlxcluster" / "fixes").glob("*.json"), reverse=True)
        assert journals
        for journal in journals:  # newest first
            undo = mlxcluster(env, "doctor", "--undo", str(journal))
            assert undo.returncode == 0, undo.stdout + undo.stderr
        assert inventory.read_text() == text
        assert ssh_dirs(lab) == before
        assert versions(lab, h2) == [OLD, OLD]
    print(f"combined fix proof: {time.monotonic() - started:.1f} s")
