"""The fix for ``mlx-version``: one mlx on every host.

mlx X goes into the inventory's python on each host that has another (or
none that imports); X is the version most hosts have, or ``doctor --fix
--mlx-version X``. Macs linked only by Thunderbolt often cannot reach a
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
from collections import Counter
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.apply import APPLIERS, ApplyContext
from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.doctor.fixes.wheels import (  # noqa: F401 (Target, platform_tags...: this fix's API too)
    FETCH_TIMEOUT,
    HOST_WHEELS,
    Target,
    fetch,
    install_action,
    install_host,
    platform_tags,
    python_minor,
    send_and_install,
    target_of,
    wheel_cache,
    wheel_key,
)
from mlxcluster.errors import InputError

PACKAGE = "mlx"
COMPANION = {"Darwin": "mlx-metal", "Linux": "mlx-cpu"}  # what mlx's wheel needs there


def requirements(system: str, version: str) -> list[str]:
    return [f"{PACKAGE}=={version}", f"{COMPANION[system]}=={version}"]


def download_argv(python: str, t: Target, version: str, dest: str) -> list[str]:
    """``pip download`` of mlx X and its companion for ``t``, run here."""
    return wheels.download_argv(python, t, requirements(t.system, version), dest)


def install_command(python: str, system: str, version: str) -> str:
    """The install on the host, from the wheels sent there (no index;
    ``--isolated``: no pip config or PIP_* variable of the host's adds other
    links or constraints)."""
    return wheels.install_command(python, requirements(system, version))


def choose_version(versions: dict[str, str | None], wanted: str | None = None) -> tuple[str | None, str]:
    """(X, why): ``wanted`` when given, else the version most hosts have; on
    a tie none (the user picks with --mlx-version)."""
    if wanted:
        return wanted, "--mlx-version"
    counts = Counter(v for v in versions.values() if v)
    if not counts:
        return None, "no host has an mlx that imports: pass --mlx-version"
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        tied = [v for v, n in ranked if n == ranked[0][1]]
        return None, (" and ".join(f"mlx {v} ({', '.join(h for h, hv in versions.items() if hv == v)})"
                                   for v in tied) + " are as common: pass --mlx-version " + " or ".join(tied))
    return ranked[0][0], f"on {ranked[0][1]} of {len(versions)} hosts"


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
    """One action per host not on X (python like the others'); nothing on a tie."""
    data = fix.result.fix_data
    version, _ = choose_version({h: d.get("mlx") for h, d in data.items()}, fix.options.get("mlx_version"))
    if version is None:
        return []
    here = sys.executable
    actions = []
    for name, d in data.items():
        if d.get("mlx") == version or d.get("python_refused"):
            continue
        h = install_host(fix, name, d)
        if h is None:
            continue
        previous = d.get("mlx") or d.get("installed")
        cache = str(wheel_cache())
        downloads = [download_argv(here, h.target, v, f"{cache}/mlx-{v}/{h.key}")
                     for v in dict.fromkeys([version, previous]) if v]
        before = f"mlx {previous}" if previous else "no mlx that imports"
        back = "" if previous else " (no way back: the version there is unknown)"
        actions.append(install_action(fix, h, "mlx-install", f"{before} -> mlx {version}", downloads,
                                      install_command(h.python, h.target.system, version),
                                      {"version": version, "previous": previous}, back))
    return actions


# ---- applying ----


def wheels_in(dest: Path, system: str, version: str) -> list[Path]:
    """The wheels of ``requirements(system, version)`` in ``dest`` (each name once)."""
    found = (wheels.wheel_of(dest, req.split("==")[0], version) for req in requirements(system, version))
    return [w for w in found if w]


def fetched(t: Target, version: str, key: str, timeout: float) -> list[Path]:
    """Both wheels for ``t``, fetched once into the cache here."""
    dest = wheel_cache() / f"mlx-{version}" / key
    have = wheels_in(dest, t.system, version)
    if len(have) < 2:
        dest.mkdir(parents=True, exist_ok=True)
        fetch(download_argv(sys.executable, t, version, str(dest)), dest, timeout)
        have = wheels_in(dest, t.system, version)
    if len(have) < 2:
        raise RuntimeError(f"pip download left {len(have)} of the 2 wheels of mlx {version} in {dest}")
    return have


def apply_mlx_install(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Fetch (here, once) the wheels of X and of the version the host had,
    send what it lacks, install X from them; the undo installs the old one
    the same way."""
    p = action.params
    t = Target(**p["target"])
    log: list[str] = []
    versions = [v for v in dict.fromkeys([p["version"], p.get("previous")]) if v]
    files = [w for v in versions for w in fetched(t, v, p["key"], max(ctx.timeout, FETCH_TIMEOUT))]
    ok, _ = send_and_install(ctx, p, files, install_command(p["python"], t.system, p["version"]), log)
    if not ok:
        return {"status": "failed", "output": "\n".join(log), "undo": None}
    undo = None
    if p.get("previous"):
        undo = {"kind": "remote", "ssh": p["ssh"], "user": p.get("user"), "port": p.get("port"),
                "commands": [install_command(p["python"], t.system, p["previous"])]}
    return {"status": "applied", "output": "\n".join(log), "undo": undo}


APPLIERS["mlx-install"] = apply_mlx_install

SAME_MLX = Fix("mlx X (the most hosts' or --mlx-version) installed from wheels fetched here", plan_mlx)
