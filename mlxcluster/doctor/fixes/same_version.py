"""One version of a distribution on every host: what the fixes of
``mlx-version`` (``mlx_version``) and ``mlx-lm-version`` (``mlx_lm_version``)
share.

X (``version_choice``: the version asked for, else the most hosts', a tie
to this machine's or the newest) goes into the inventory's python of each
host that has another version or none; the plan says which rule chose X.
The wheels of X (with its dependencies where the package says so) and
of the version the host had (the undo needs it, and the host may reach no
index later) are fetched once here for the host's platform and Python, sent
over the same SSH connection and installed from the file (``wheels``)::

    here:    python -m pip download mlx-lm==0.32.2 --only-binary=:all: --platform macosx_14_0_arm64 ... \\
                 -d ~/.cache/mlxcluster/wheels/mlx_lm-0.32.2/macosx_14_0_arm64-cp312
    send:    each wheel the host lacks, by sha256, into ~/.cache/mlxcluster/wheels on the host
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" mlx-lm==0.32.2 $(PY -c ... mlx's version)

The undo installs the previous version the same way; where there was none,
it uninstalls what pip said it installed (``Package.undo_new``), else there
is no way back. An install that installed nothing is ``unchanged``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.apply import APPLIERS, ApplyContext
from mlxcluster.doctor.fixes.plan import Action, FixInput
from mlxcluster.doctor.fixes.version_choice import Choice


@dataclass(frozen=True)
class Package:
    """A distribution made one version everywhere, and how."""

    dist: str  # as pip names it: mlx, mlx-lm
    kind: str  # its actions' kind (plan.KIND_ORDER; the applier below)
    absent: str  # what the plan says a host without a version has
    companions: dict[str, str] = field(default_factory=dict)  # system -> a distribution pinned to X too
    deps: bool = False  # X's wheels fetched with its dependencies (a host lacking them gets them)
    keep: str | None = None  # a distribution the install leaves at the host's version (wheels.kept_as_installed)
    undo_new: bool = False  # no version before: the undo uninstalls what pip installed

    def requirements(self, system: str, version: str) -> list[str]:
        companion = self.companions.get(system)
        return [f"{self.dist}=={version}", *([f"{companion}=={version}"] if companion else [])]

    def install_command(self, python: str, system: str, version: str) -> str:
        return wheels.install_command(python, self.requirements(system, version), self.keep)


PACKAGES: dict[str, Package] = {}  # by kind: what the applier installs


def register(package: Package) -> Package:
    """``package``'s actions applied by ``apply_install``."""
    PACKAGES[package.kind] = package
    APPLIERS[package.kind] = apply_install
    return package


def version_dir(package: Package, version: str, key: str) -> Path:
    """Where the wheels of ``package`` ``version`` for one platform and Python are fetched here."""
    return wheels.fetch_dir(package.dist, version, key)


def plan_hosts(fix: FixInput, package: Package, choice: Choice, previous: dict[str, str | None]) -> list[Action]:
    """One action per host of ``previous`` (host -> the version it has, None:
    none): X (``choice``, its rule said in the plan) installed; the version it
    had fetched too, for the undo."""
    here = sys.executable
    version = choice.version
    actions = []
    for name, before in previous.items():
        h = wheels.install_host(fix, name, fix.result.fix_data[name])
        if h is None:
            continue
        downloads = [wheels.download_argv(here, h.target, package.requirements(h.target.system, v),
                                          str(version_dir(package, v, h.key)), deps=package.deps and v == version)
                     for v in dict.fromkeys([version, before]) if v]
        what = f"{f'{package.dist} {before}' if before else package.absent} -> {package.dist} {version}"
        back = "" if before or package.undo_new else " (no way back: the version there is unknown)"
        actions.append(wheels.install_action(fix, h, package.kind, what, downloads,
                                             package.install_command(h.python, h.target.system, version),
                                             {"version": version, "previous": before},
                                             f"; {choice.said(package.dist)}{back}"))
    return actions


def apply_install(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Fetch (here, once) the wheels of X and of the version the host had,
    send what it lacks, install X from them; the undo: the old version
    installed the same way, or what pip installed uninstalled."""
    package = PACKAGES[action.kind]
    p = action.params
    t = wheels.Target(**p["target"])
    timeout = max(ctx.timeout, wheels.FETCH_TIMEOUT)
    files = [w for v in dict.fromkeys([p["version"], p.get("previous")]) if v
             for w in wheels.fetched(t, package.requirements(t.system, v), version_dir(package, v, p["key"]),
                                     timeout, deps=package.deps and v == p["version"])]
    log: list[str] = []
    ok, output = wheels.send_and_install(ctx, p, list(dict.fromkeys(files)),
                                         package.install_command(p["python"], t.system, p["version"]), log)
    if not ok:
        return {"status": "failed", "output": "\n".join(log), "undo": None}
    if not wheels.installed_by(output):  # X was there already: nothing to undo
        return {"status": "unchanged", "output": "\n".join(log), "undo": None}
    undo = None
    if p.get("previous"):
        undo = wheels.remote_undo(p, [package.install_command(p["python"], t.system, p["previous"])])
    elif package.undo_new:
        undo = wheels.uninstall_undo(p, output)
    return {"status": "applied", "output": "\n".join(log), "undo": undo}
