"""``doctor --fix --yes --imports mlx_lm`` on real sshd hosts, one of them on
another mlx-lm at the same python path: labhost2's site-packages is an
overlay in its mount namespace (tests/lab/mlx_overlay.py) holding mlx-lm
0.31.3 (its requirements, mlx's included, met by the venv's), the others the
venv's. mlx-lm-version fails naming labhost2; the fix fetches the venv's
mlx-lm here with its dependencies, sends them into labhost2's own
``~/.cache/mlxcluster`` (every host has a home of its own: ``lab3_own_home``), installs it from the file keeping
labhost2's mlx; the re-check passes; ``--undo`` puts 0.31.3 back. This
machine's venv and the other hosts are never changed.

Needs the package index (pip download) here, as the fix does.
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest

from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.mlx_lm_version import MLX_LM
from tests.lab.mlx_overlay import (
    mlxcluster,
    other_version,
    venv_scripts_here,
    versions,
    wheels_here,
    wheels_on,
)

pytestmark = pytest.mark.lab

OLD_LM = "0.31.3"  # on PyPI; needs mlx>=0.31.2 (macOS only) and transformers>=5: the venv's do
DISTS = ("mlx", "mlx-cpu", "mlx-lm")  # read in one ssh round trip per host


@pytest.fixture
def other_mlx_lm_on_labhost2(lab3_own_home, tmp_path, monkeypatch):
    """labhost2: the same python path, mlx-lm 0.31.3 and a home cache of its own;
    the wheels fetched here go to a cache of this test's (XDG_CACHE_HOME, also
    the fix's). pip keeps this machine's HTTP cache, as the fix run by hand
    would: ~48 MB of wheels are not downloaded again on every run."""
    pip_cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pip")
    monkeypatch.setenv("PIP_CACHE_DIR", pip_cache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with other_version(lab3_own_home, lab3_own_home.hosts[1], tmp_path / "overlay", MLX_LM, OLD_LM):
        yield lab3_own_home.hosts[1]


def test_fix_installs_the_others_mlx_lm_keeps_mlx_and_undo_puts_it_back(lab3_own_home, tmp_path, other_mlx_lm_on_labhost2):
    host = other_mlx_lm_on_labhost2
    ours_before = wheels_here()
    scripts_before = venv_scripts_here()
    here = [metadata.version(d) for d in DISTS]  # every host's but labhost2's: the lab3_own_home shares this venv
    new, mlx = here[-1], here[:-1]
    assert versions(lab3_own_home, host, DISTS) == [*mlx, OLD_LM]
    inventory = lab3_own_home.write_inventory(tmp_path / "lab.yaml")
    env = lab3_own_home.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    fixed = mlxcluster(env, "doctor", "-i", str(inventory), "--no-data-path", "--imports", "mlx_lm", "--fix", "--yes")
    out = fixed.stdout
    # doctor fails naming the host, its version, the others' and the command ...
    assert "[✗] mlx-lm installed, the same version everywhere (when the job runs it)  [mlx-lm-version]" in out, \
        out[-4000:] + fixed.stderr
    assert f"    {host.name}: ✗ mlx-lm {OLD_LM} (others: {new}) in {lab3_own_home.python}" in out
    assert f"    fix: on {host.name}: {lab3_own_home.python} -m pip install mlx-lm=={new} (mlx-lm {new}: on 2 of 3 hosts; " \
           "or doctor --fix --imports mlx_lm" in out
    # ... the fix installs the others' version from wheels fetched here, with its dependencies ...
    assert f"  [mlx-lm-version] {host.name}: mlx-lm {OLD_LM} -> mlx-lm {new} in {lab3_own_home.python} (Linux x86_64, " \
           "Python 3.11)" in out, out[-4000:]
    assert f"      on {host.name}: {lab3_own_home.python} -m pip install --isolated --disable-pip-version-check --no-index " \
           f'--find-links "$HOME/.cache/mlxcluster/wheels" mlx-lm=={new} $({lab3_own_home.python} -c ' in out
    assert f"  applied   [mlx-lm-version] {host.name}:" in out
    # ... and the re-check passes, the host's mlx as it was.
    assert "[✗] -> [✓] mlx-lm installed, the same version everywhere (when the job runs it)  [mlx-lm-version]" \
        in out, out[-4000:]
    assert versions(lab3_own_home, host, DISTS) == here
    sent = lab3_own_home.ssh(host, 'ls "$HOME/.cache/mlxcluster/wheels"').stdout.split()
    fetched_here = sorted(p.name for p in wheels.wheel_cache().rglob("*.whl"))
    assert sorted(sent) == fetched_here == wheels_on(lab3_own_home, host) and f"mlx_lm-{OLD_LM}-py3-none-any.whl" in sent
    assert any(w.startswith("transformers-") for w in sent)  # its dependencies went too
    # labhost2's own home, and only there
    assert wheels_on(lab3_own_home, lab3_own_home.hosts[0]) == wheels_on(lab3_own_home, lab3_own_home.hosts[2]) == []
    assert wheels_here() == ours_before
    assert venv_scripts_here() == scripts_before  # labhost2's pip wrote its own bin/, not this machine's
    assert versions(lab3_own_home, lab3_own_home.hosts[2], DISTS) == here

    [journal] = sorted((tmp_path / "config" / "mlxcluster" / "fixes").glob("*.json"))
    undo = mlxcluster(env, "doctor", "--undo", str(journal))
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert f"restored  [mlx-lm-version] {host.name}:" in undo.stdout
    assert versions(lab3_own_home, host, DISTS) == [*mlx, OLD_LM]
    assert [metadata.version(d) for d in DISTS] == here
    assert venv_scripts_here() == scripts_before  # and the undo too
