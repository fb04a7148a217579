"""The fix for ``trainer-deps``: what the trainer's ranks import, installed
where it is missing.

Each distribution a host lacks goes into the inventory's python there, at
the version this machine has (mlxcluster's python: the one the trainer was
tried with here), else the version most hosts have (a tie: the newest of
them, ``version_choice``), else the newest the index has. As for
mlx (``mlx_version``, ``wheels``), the wheels are fetched once, here, for
each host's platform and Python, with their dependencies (tokenizers needs
huggingface_hub...), sent over the same SSH connection and installed with
no index::

    here:    python -m pip download PyYAML==6.0.2 --only-binary=:all: --platform manylinux_2_36_x86_64 ... \\
                 --python-version 3.11 --implementation cp --abi cp311 \\
                 -d ~/.cache/mlxcluster/wheels/pyyaml-6.0.2/manylinux_2_36_x86_64-cp311
    send:    each wheel the host lacks, by sha256, into ~/.cache/mlxcluster/wheels on the host
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" PyYAML==6.0.2

The undo uninstalls exactly what that install said it installed (pip's
``Successfully installed`` line), dependencies included; a distribution
that was there before is never touched.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes.apply import APPLIERS, ApplyContext
from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.doctor.fixes.version_choice import (
    THIS_MACHINES,
    Choice,
    choose_version,
    version_here,
)
from mlxcluster.doctor.fixes.wheels import (  # noqa: F401 (installed_by: this fix's API too)
    FETCH_TIMEOUT,
    Target,
    download_argv,
    fetch_dir,
    fetched,
    install_action,
    install_command,
    install_host,
    installed_by,
    send_and_install,
    uninstall_undo,
)


def choose(dist: str, hosts: dict[str, str | None]) -> Choice:
    """This machine's version of ``dist`` (the trainer was tried with it),
    else ``version_choice``'s rule for the hosts' versions; None: the
    newest the index has."""
    mine = version_here(dist)
    return choose_version(dist, hosts, here=mine, wanted=mine, wanted_by=THIS_MACHINES)


def requirement(dist: str, version: str | None) -> str:
    return f"{dist}=={version}" if version else dist


def wheel_dir(dist: str, version: str | None, key: str) -> Path:
    """Where one distribution's wheels (its dependencies too) for one platform
    and Python are fetched here."""
    return fetch_dir(dist, version, key)


def plan_trainer_deps(fix: FixInput) -> list[Action]:
    """One action per host that lacks a distribution the launch needs."""
    here = sys.executable
    actions = []
    for name, d in fix.result.fix_data.items():
        h = install_host(fix, name, d) if d.get("missing") else None
        if h is None:
            continue
        choices = {dist: choose(dist, others) for dist, others in d["missing"].items()}
        versions = {dist: c.version for dist, c in choices.items()}
        reqs = [requirement(dist, v) for dist, v in versions.items()]
        downloads = [download_argv(here, h.target, [r], str(wheel_dir(dist, v, h.key)), deps=True)
                     for r, (dist, v) in zip(reqs, versions.items(), strict=True)]
        why = "; ".join(c.said(dist) if c.version else f"{dist}: the newest the index has"
                        for dist, c in choices.items())
        actions.append(install_action(fix, h, "trainer-install", f"install {', '.join(reqs)}", downloads,
                                      install_command(h.python, reqs), {"versions": versions},
                                      f": the trainer's ranks import {'them' if len(reqs) > 1 else 'it'} ({why})"))
    return actions


# ---- applying ----

def apply_trainer_install(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Fetch (here, once) each missing distribution's wheels, send what the
    host lacks, install them; the undo uninstalls what pip installed."""
    p = action.params
    t = Target(**p["target"])
    timeout = max(ctx.timeout, FETCH_TIMEOUT)
    files = list(dict.fromkeys(w for dist, v in p["versions"].items()
                               for w in fetched(t, [requirement(dist, v)], wheel_dir(dist, v, p["key"]), timeout,
                                                deps=True)))
    log: list[str] = []
    reqs = [requirement(dist, v) for dist, v in p["versions"].items()]
    ok, output = send_and_install(ctx, p, files, install_command(p["python"], reqs), log)
    if not ok:
        return {"status": "failed", "output": "\n".join(log), "undo": None}
    undo = uninstall_undo(p, output)
    return {"status": "applied" if undo else "unchanged", "output": "\n".join(log), "undo": undo}


APPLIERS["trainer-install"] = apply_trainer_install

TRAINER_DEPS = Fix("what the trainer imports, installed from wheels fetched here", plan_trainer_deps)
