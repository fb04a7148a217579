"""``doctor --fix --yes`` on real sshd hosts, one of them on another mlx at
the same python path: labhost2's site-packages is an overlay in its mount
namespace (the real one below, its changes in a folder of its own) holding
mlx 0.32.3, the others the venv's 0.32.4. The fix fetches the wheels here,
sends them over its SSH connection into labhost2's own ``~/.cache/mlxcluster``
(every host has its own home), installs 0.32.4 from the file; the re-check passes; ``--undo``
puts 0.32.3 back. This machine's venv and the other hosts are never changed.

Needs the package index (pip download) here, as the fix does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxcluster.doctor.fixes import mlx_version as fix
from tests.lab.mlx_overlay import (
    OLD,
    VERSION_OF,
    mlxcluster,
    other_mlx,
    venv_scripts_here,
    wheels_here,
    wheels_on,
)

pytestmark = pytest.mark.lab


@pytest.fixture
def other_mlx_on_labhost2(lab3_own_home, tmp_path, monkeypatch):
    """labhost2: the same python path, mlx 0.32.3 and a home cache of its own (tests/lab/mlx_overlay.py);
    the wheels fetched here go to a cache of this test's (XDG_CACHE_HOME, also the fix's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with other_mlx(lab3_own_home, lab3_own_home.hosts[1], tmp_path / "overlay"):
        yield lab3_own_home.hosts[1]


def test_fix_installs_the_others_mlx_from_wheels_sent_here_and_undo_puts_it_back(lab3_own_home, tmp_path,
                                                                                   other_mlx_on_labhost2):
    host = other_mlx_on_labhost2
    ours_before = wheels_here()
    scripts_before = venv_scripts_here()
    inventory = lab3_own_home.write_inventory(tmp_path / "lab.yaml")
    env = lab3_own_home.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    here = subprocess.run([sys.executable, "-c", VERSION_OF], capture_output=True, text=True).stdout.split()
    new = here[0]
    fixed = mlxcluster(env, "doctor", "-i", str(inventory), "--no-data-path", "--fix", "--yes")
    out = fixed.stdout
    assert f"  [mlx-version] {host.name}: mlx {OLD} -> mlx {new} in {lab3_own_home.python} (Linux x86_64, Python 3.11)" \
        in out, out[-3000:] + fixed.stderr
    assert f"      on {host.name}: {lab3_own_home.python} -m pip install --isolated --disable-pip-version-check --no-index " \
           f'--find-links "$HOME/.cache/mlxcluster/wheels" mlx=={new} mlx-cpu=={new}' in out
    assert f"  applied   [mlx-version] {host.name}:" in out
    assert "[✗] -> [✓] mlx importable, the same version everywhere  [mlx-version]" in out, out[-3000:]
    assert lab3_own_home.ssh(host, f"{lab3_own_home.python} -c \"{VERSION_OF}\"").stdout.split() == [new, new]
    # The wheels went to labhost2's own home, and only there.
    sent = lab3_own_home.ssh(host, 'ls "$HOME/.cache/mlxcluster/wheels"').stdout.split()
    fetched_here = sorted(p.name for p in fix.wheel_cache().rglob("*.whl"))
    assert sorted(sent) == fetched_here == wheels_on(lab3_own_home, host) and len(sent) == 4  # mlx and mlx-cpu, new and old
    assert wheels_on(lab3_own_home, lab3_own_home.hosts[0]) == wheels_on(lab3_own_home, lab3_own_home.hosts[2]) == []
    assert wheels_here() == ours_before
    assert venv_scripts_here() == scripts_before  # labhost2's pip wrote its own bin/, not this machine's
    for other in (lab3_own_home.hosts[0], lab3_own_home.hosts[2]):
        assert lab3_own_home.ssh(other, f"{lab3_own_home.python} -c \"{VERSION_OF}\"").stdout.split() == here

    [journal] = sorted((tmp_path / "config" / "mlxcluster" / "fixes").glob("*.json"))
    undo = mlxcluster(env, "doctor", "--undo", str(journal))
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert f"restored  [mlx-version] {host.name}:" in undo.stdout
    assert lab3_own_home.ssh(host, f"{lab3_own_home.python} -c \"{VERSION_OF}\"").stdout.split() == [OLD, OLD]
    assert subprocess.run([sys.executable, "-c", VERSION_OF], capture_output=True, text=True).stdout.split() == here
    assert venv_scripts_here() == scripts_before  # and the undo too
