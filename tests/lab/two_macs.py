"""Two Macs from zero, as a new user has them (issue 37 item 7): two lab
hosts set up one by one, and this machine, where the user types.

- every host has its own disk, its own HOME with its own ``~/.ssh`` (only
  this machine's key authorized, no keys or known_hosts between the hosts)
  and no copy of this project (``make_lab(2, own_ssh=True)``);
- labhost1 has what this machine has (the venv's mlx and mlx-lm);
- labhost2, the Mac set up later, has an older mlx (``OLD``, 0.32.3) at the
  same python path and no mlx-lm (an overlay over the venv in its mount
  namespace: ``tests/lab/mlx_overlay.py``);
- a working folder holding ``./cluster.yaml`` (what ``mlxcluster discover
  --write cluster.yaml`` leaves), where the user's commands are run with no
  ``-i``, as typed (``TwoMacs.mlxcluster``).

The wheels a fix fetches go to a cache of the test's (XDG_CACHE_HOME), the
journals to its config folder (XDG_CONFIG_HOME); pip's own HTTP cache stays
this machine's, as when the user runs the fix (~48 MB of mlx-lm's
dependencies are not downloaded again on every run).

A test takes the ``two_macs`` fixture (tests/lab/conftest.py) and runs the
user's commands in turn: ``doctor --imports mlx_lm``, ``doctor --imports
mlx_lm --fix --yes`` (tests/lab/test_two_macs_lab.py), then what comes next
(``serve MODEL``) on the same hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.doctor.fixes.mlx_version import MLX
from tests.lab.mlx_overlay import OLD, installed_of, other_version

REPO = Path(__file__).resolve().parents[2]
# What a host's python has, read in one ssh round trip (mlx_overlay.versions).
DISTS = ("mlx", "mlx-cpu", "mlx-lm")
# labhost2's mlx_lm imported, and the versions it then has.
IMPORTS_MLX_LM = "import mlx_lm, importlib.metadata as m; print(*(m.version(d) for d in ('mlx', 'mlx-cpu', 'mlx-lm')))"


@dataclass
class TwoMacs:
    """The two hosts, the folder the user types in, and its environment."""

    lab: object  # tests.lab.Lab
    folder: Path  # holds ./cluster.yaml
    env: dict[str, str]

    @property
    def first(self):
        """labhost1: what this machine has."""
        return self.lab.hosts[0]

    @property
    def second(self):
        """labhost2, set up later: mlx ``OLD``, no mlx-lm (until a fix)."""
        return self.lab.hosts[1]

    def mlxcluster(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """``mlxcluster ARGS`` as typed in the folder (no -i: ./cluster.yaml)."""
        return subprocess.run([sys.executable, "-m", "mlxcluster", *args], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def versions(self, host) -> list[str]:
        """mlx's, mlx-cpu's and mlx-lm's versions with ``host``'s python (``-``: not installed)."""
        return self.lab.ssh(host, f"{self.lab.python} -c \"{installed_of(DISTS)}\"", timeout=60).stdout.split()

    def imports_mlx_lm(self, host) -> subprocess.CompletedProcess:
        """``import mlx_lm`` with ``host``'s python; its stdout: mlx's, mlx-cpu's and mlx-lm's versions."""
        return self.lab.ssh(host, f"{self.lab.python} -c \"{IMPORTS_MLX_LM}\"", timeout=60)


@contextmanager
def two_macs_from_zero(make_lab, tmp_path: Path, monkeypatch) -> Iterator[TwoMacs]:
    """Two hosts set up one by one, labhost2 on mlx ``OLD`` without mlx-lm
    (the module's docstring), until the block ends."""
    lab = make_lab(2, own_ssh=True)
    pip_cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pip")
    monkeypatch.setenv("PIP_CACHE_DIR", pip_cache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # other_version fetches there too
    folder = tmp_path / "work"
    folder.mkdir()
    lab.write_inventory(folder / "cluster.yaml")
    env = lab.env({**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    env.pop("MLXCLUSTER_INVENTORY", None)
    env["PYTHONPATH"] = str(REPO)  # this checkout's mlxcluster, typed from another folder
    with other_version(lab, lab.hosts[1], tmp_path / "overlay", MLX, OLD, without=("mlx-lm",)):
        yield TwoMacs(lab, folder, env)
