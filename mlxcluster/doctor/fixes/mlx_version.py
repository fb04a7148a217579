"""The fix for ``mlx-version``: one mlx on every host.

mlx X goes into the inventory's python on each host that has another (or
none that imports); X is ``doctor --fix --mlx-version X``, else the version
most hosts have, on a tie this machine's when it is one of them, else the
newest of them (``version_choice``). Macs linked only by Thunderbolt often cannot reach a
package index, so the wheels are fetched once, here, for each host's
platform and Python (what the probe reported), then sent over the same SSH
connection and installed from the file::

    here:    python -m pip download mlx==0.32.4 mlx-metal==0.32.4 --no-deps --only-binary=:all: \\
                 --platform macosx_14_0_arm64 --python-version 3.12 --implementation cp --abi cp312 \\
                 -d ~/.cache/mlxcluster/wheels/mlx-0.32.4/macosx_14_0_arm64-cp312
    send:    each wheel the host lacks, by sha256, into ~/.cache/mlxcluster/wheels on the host
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" mlx==0.32.4 mlx-metal==0.32.4

On macOS mlx's wheel needs ``mlx-metal`` (its ``Requires-Dist``, for
``platform_system == "Darwin"``), on Linux ``mlx[cpu]`` needs ``mlx-cpu``:
both are fetched with ``--no-deps`` by name (pip here, on Linux, would
skip the Darwin one). The version the host had is fetched and sent as
well, before anything changes: the undo is the same install of that version
from the host's own copy. A host whose Python (major.minor) differs from
the others' is not changed: mlx's wheels are per Python version and this
fix does not change a host's Python (the check's hint says what to do).
"""

from __future__ import annotations

import re
import subprocess
import sys

from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.doctor.fixes.same_version import Package, plan_hosts, register
from mlxcluster.doctor.fixes.version_choice import Choice, version_here
from mlxcluster.doctor.fixes.version_choice import choose_version as choose
from mlxcluster.doctor.fixes.wheels import (  # noqa: F401 (Target, platform_tags...: this fix's API too)
    FETCH_TIMEOUT,
    HOST_WHEELS,
    Target,
    platform_tags,
    python_minor,
    target_of,
    wheel_cache,
    wheel_key,
)
from mlxcluster.errors import InputError

PACKAGE = "mlx"
COMPANION = {"Darwin": "mlx-metal", "Linux": "mlx-cpu"}  # what mlx's wheel needs there
MLX = register(Package(PACKAGE, "mlx-install", "no mlx that imports", companions=COMPANION))


def requirements(system: str, version: str) -> list[str]:
    return MLX.requirements(system, version)


def download_argv(python: str, t: Target, version: str, dest: str) -> list[str]:
    """``pip download`` of mlx X and its companion for ``t``, run here."""
    return wheels.download_argv(python, t, requirements(t.system, version), dest)


def install_command(python: str, system: str, version: str) -> str:
    """The install on the host, from the wheels sent there (no index;
    ``--isolated``: no pip config or PIP_* variable of the host's adds other
    links or constraints)."""
    return MLX.install_command(python, system, version)


def choose_version(versions: dict[str, str | None], wanted: str | None = None) -> Choice:
    """X for the hosts' mlx (None: a host where it does not import):
    ``wanted`` (--mlx-version) when given, else ``version_choice``'s rule
    with this machine's mlx."""
    return choose(PACKAGE, versions, here=version_here(PACKAGE), wanted=wanted, wanted_by="--mlx-version")


def available_versions(python: str = sys.executable, timeout: float = 120.0) -> list[str]:
    """mlx's versions on the package index pip here uses (``pip index versions``)."""
    p = subprocess.run([python, "-m", "pip", "index", "versions", PACKAGE, "--disable-pip-version-check"],
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    found = re.search(r"^Available versions:\s*(.+)$", p.stdout, re.M)
    if p.returncode != 0 or not found:
        why = (p.stderr or p.stdout).strip().splitlines()
        raise InputError(f"could not ask the package index for mlx's versions: {why[-1] if why else p.returncode}",
                         "--fix fetches the wheels on this machine: it needs a package index (PyPI) here")
    return [v.strip() for v in found.group(1).split(",")]


def check_mlx_version(version: str, versions=None) -> None:
    """InputError (exit 2, before any host is probed) for a version the index
    does not have; ``versions``: what lists them (``available_versions``)."""
    known = (versions or available_versions)()
    if version not in known:
        raise InputError(f"mlx {version} is not on the package index",
                         f"its versions: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}")


def plan_mlx(fix: FixInput) -> list[Action]:
    """One action per host not on X (python like the others'); nothing
    when no X can be chosen (no mlx here nor on any host)."""
    data = fix.result.fix_data
    choice = choose_version({h: d.get("mlx") for h, d in data.items()}, fix.options.get("mlx_version"))
    if choice.version is None:
        return []
    return plan_hosts(fix, MLX, choice, {name: d.get("mlx") or d.get("installed") for name, d in data.items()
                                         if d.get("mlx") != choice.version and not d.get("python_refused")})


SAME_MLX = Fix("mlx X (--mlx-version, else the most hosts', a tie to this machine's or the newest) installed "
               "from wheels fetched here", plan_mlx)
