"""``doctor --fix --yes`` on real sshd hosts, one of them without PyYAML at
the same python path: labhost2's site-packages is an overlay in its mount
namespace (the real one below, its changes in a folder of its own) with
``yaml`` removed, so the trainer's ``import yaml`` fails there. trainer-deps
fails naming labhost2 and PyYAML; the fix fetches this machine's PyYAML
wheel here, sends it over its SSH connection into labhost2's own
``~/.cache/mlxcluster`` (every host has a home of its own: ``lab3_own_home``), installs it from the file; the
re-check passes; ``--undo`` uninstalls it. This machine's venv and the other
hosts are never changed.

Needs the package index (pip download) here, as the fix does.
"""

from __future__ import annotations

import os
import sysconfig
from importlib import metadata

import pytest

from mlxcluster.doctor.fixes import wheels
from tests.lab.mlx_overlay import (
    mlxcluster,
    overlay_venv,
    venv_scripts_here,
    wheels_here,
    wheels_on,
)

pytestmark = pytest.mark.lab

YAML_VERSION = "import importlib.metadata as m, yaml; print(m.version('PyYAML'))"


@pytest.fixture
def no_yaml_on_labhost2(lab3_own_home, tmp_path, monkeypatch):
    """labhost2: the same python path without PyYAML (removed in an overlay over
    site-packages); the wheels fetched here go to
    a cache of this test's (XDG_CACHE_HOME, also the fix's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = sysconfig.get_paths()["purelib"]
    mount, umount = overlay_venv(tmp_path / "overlay")
    host = lab3_own_home.hosts[1]
    made = lab3_own_home.ssh(host, f"{mount}rm -rf {site}/yaml {site}/_yaml {site}/[Pp][Yy][Yy]aml-*.dist-info && "
                                   f"{lab3_own_home.python} -c \"{YAML_VERSION}\"", timeout=60)
    try:
        assert "No module named 'yaml'" in made.stderr, made.stdout + made.stderr
        yield host
    finally:  # the host as it was: its python, and no wheels in its home
        lab3_own_home.ssh(host, f'rm -rf "$HOME/.cache/mlxcluster/wheels"; {umount}', timeout=30)


def test_fix_installs_pyyaml_from_a_wheel_sent_here_and_undo_removes_it(lab3_own_home, tmp_path, no_yaml_on_labhost2):
    host = no_yaml_on_labhost2
    ours_before = wheels_here()
    scripts_before = venv_scripts_here()
    version = metadata.version("PyYAML")
    inventory = lab3_own_home.write_inventory(tmp_path / "lab.yaml")
    env = lab3_own_home.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    fixed = mlxcluster(env, "doctor", "-i", str(inventory), "--no-data-path", "--fix", "--yes")
    out = fixed.stdout
    # doctor fails naming the host, the distribution and the command ...
    assert f"    {host.name}: ✗ no PyYAML in " in out, out[-3000:] + fixed.stderr
    assert f"    fix: on {host.name}: {lab3_own_home.python} -m pip install PyYAML=={version} (or doctor --fix" in out, \
        out[:6000]
    # ... the fix installs this machine's version from a wheel fetched here ...
    assert f"  [trainer-deps] {host.name}: install PyYAML=={version} in {lab3_own_home.python} (Linux x86_64, " \
           "Python 3.11): the trainer's ranks import it" in out, out[-3000:]
    assert f"      on {host.name}: {lab3_own_home.python} -m pip install --isolated --disable-pip-version-check " \
           f'--no-index --find-links "$HOME/.cache/mlxcluster/wheels" PyYAML=={version}' in out
    assert f"  applied   [trainer-deps] {host.name}:" in out
    # ... and the re-check passes.
    assert "[✗] -> [✓] What the trainer imports is installed on every host" in out, out[-3000:]
    assert lab3_own_home.ssh(host, f"{lab3_own_home.python} -c \"{YAML_VERSION}\"").stdout.split() == [version]
    sent = lab3_own_home.ssh(host, 'ls "$HOME/.cache/mlxcluster/wheels"').stdout.split()
    assert sent == [p.name for p in wheels.wheel_cache().rglob("*.whl")] == wheels_on(lab3_own_home, host)
    assert sent[0].startswith("pyyaml-")
    # labhost2's own home, and only there
    assert wheels_on(lab3_own_home, lab3_own_home.hosts[0]) == wheels_on(lab3_own_home, lab3_own_home.hosts[2]) == []
    assert wheels_here() == ours_before
    assert venv_scripts_here() == scripts_before  # labhost2's pip wrote its own bin/, not this machine's

    [journal] = sorted((tmp_path / "config" / "mlxcluster" / "fixes").glob("*.json"))
    undo = mlxcluster(env, "doctor", "--undo", str(journal))
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert f"restored  [trainer-deps] {host.name}:" in undo.stdout
    back = lab3_own_home.ssh(host, f"{lab3_own_home.python} -c \"{YAML_VERSION}\"")
    assert "No module named 'yaml'" in back.stderr, back.stdout + back.stderr
    for other in (lab3_own_home.hosts[0], lab3_own_home.hosts[2]):
        assert lab3_own_home.ssh(other, f"{lab3_own_home.python} -c \"{YAML_VERSION}\"").stdout.split() == [version]
    assert metadata.version("PyYAML") == version
    assert venv_scripts_here() == scripts_before  # and the undo too
