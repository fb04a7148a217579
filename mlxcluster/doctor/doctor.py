"""The doctor driver: inventory -> live captures -> checks -> a report.

``run_doctor`` probes live hosts (every host in parallel, see
``live``); ``replay_doctor`` runs every check that needs no live
host on captures loaded from a folder. Both return a ``DoctorReport``; the
CLI renders it. Checks come from ``CHECK_MODULES`` plus the optional
topology checks when that module exists.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcluster.doctor.checks.base import (
    REGISTRY,
    CheckContext,
    CheckResult,
    CheckSpec,
    run_checks,
    verdict,
)
from mlxcluster.doctor.live import LiveCollection, collect_live
from mlxcluster.errors import InputError
from mlxcluster.facts.capture import HostCapture
from mlxcluster.facts.collect import probe_locally
from mlxcluster.facts.facts import HostFacts, all_facts, facts_to_json
from mlxcluster.inventory.inventory import local_inventory

CHECK_MODULES = (
    "mlxcluster.doctor.checks.ssh",
    "mlxcluster.doctor.checks.captures",
    "mlxcluster.doctor.checks.software",
    "mlxcluster.doctor.checks.mpi",
    "mlxcluster.doctor.checks.network",
    "mlxcluster.doctor.checks.routes",
    "mlxcluster.doctor.checks.env",
    "mlxcluster.doctor.checks.power",
    "mlxcluster.doctor.checks.firewall",
    "mlxcluster.doctor.checks.model_split",
)
OPTIONAL_CHECK_MODULES = ("mlxcluster.doctor.checks.topology", "mlxcluster.doctor.checks.jaccl")
BACKENDS = ("any", "ring", "mpi", "jaccl", "jaccl-ring", "nccl")


@dataclass
class DoctorReport:
    verdict: str
    results: list[CheckResult]
    facts: dict[str, HostFacts]
    captures: dict[str, HostCapture]
    live: bool
    seconds: float
    cluster: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``doctor --json`` document (docs/doctor-reference.md, Output)."""
        return {
            "verdict": self.verdict,
            "hosts": {name: facts_to_json(f) for name, f in self.facts.items()},
            "checks": [r.to_json() for r in self.results],
        }

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status.value in ("fail", "crash")]

    def warned(self) -> list[CheckResult]:
        return [r for r in self.results if r.status.value == "warn"]


def load_checks() -> list[CheckSpec]:
    """Import the check modules (registering their checks); specs in module order."""
    modules = list(CHECK_MODULES)
    for name in OPTIONAL_CHECK_MODULES:
        try:
            importlib.import_module(name)
            modules.append(name)
        except ModuleNotFoundError as exc:  # the topology checks land separately
            if exc.name != name:
                raise
    for name in CHECK_MODULES:
        importlib.import_module(name)
    order = {m: i for i, m in enumerate(modules)}
    specs = [s for s in REGISTRY.values() if getattr(s.fn, "__module__", None) in order]
    return sorted(specs, key=lambda s: order[s.fn.__module__])  # stable: keeps definition order


def _report(ctx: CheckContext, started: float, cluster: str | None) -> DoctorReport:
    results = run_checks(ctx, load_checks())
    facts = ctx.services.get("facts") or all_facts(ctx.captures)
    return DoctorReport(verdict(results), results, facts, ctx.captures, ctx.live,
                        time.monotonic() - started, cluster)


def run_doctor(inventory, *, backend: str | None = None, connect_timeout: float = 5.0,
               command_timeout: float = 60.0, accept_new_host_keys: bool = False,
               data_path: bool = True, hostfile: str | None = None, runner=None,
               trainer_modules: tuple[str, ...] = (), model: str | None = None,
               pipeline: bool = False) -> DoctorReport:
    """Probe every inventory host live and run every check. With ``runner``
    (a ``ParamikoRunner`` the caller closes) its connections are used and
    stay open: ``doctor --fix`` applies and re-checks over them.
    ``trainer_modules``: what a `train` launch imports besides the trainer's
    own (tokenizers for its data; the trainer-deps check). ``model``: a
    model folder to judge serving over the hosts (``pipeline``: split by
    layers; the model-split check)."""
    started = time.monotonic()
    if inventory.ssh_config and not Path(inventory.ssh_config).is_file():
        raise InputError(f"ssh_config {inventory.ssh_config} (from {inventory.path}) does not exist",
                         "fix the inventory's ssh_config path or remove the line")
    live: LiveCollection = collect_live(inventory, connect_timeout=connect_timeout,
                                        command_timeout=command_timeout,
                                        accept_new_host_keys=accept_new_host_keys, data_path=data_path,
                                        runner=runner,
                                        # Only mpi may need SSH between hosts (checks/ssh.py host_to_host).
                                        host_to_host=backend == "mpi")
    ctx = CheckContext(live.captures, inventory=inventory, live=True, backend=backend,
                       services={"live": live},
                       options={"hostfile": hostfile, "trainer_modules": tuple(trainer_modules),
                                "model": model, "pipeline": pipeline})
    return _report(ctx, started, inventory.cluster)


def run_local_doctor(*, backend: str | None = None, python: str | None = None) -> DoctorReport:
    """Check this machine as the one host that local ranks (--local N) run on.
    The probe runs as a subprocess; the checks that need SSH are skipped."""
    started = time.monotonic()
    inventory = local_inventory(1, python=python)
    captures = {h.name: probe_locally(h) for h in inventory.hosts}
    ctx = CheckContext(captures, inventory=inventory, live=False, backend=backend)
    return _report(ctx, started, inventory.cluster)


def replay_doctor(captures: dict[str, HostCapture], *, inventory=None, backend: str | None = None,
                  hostfile: str | None = None, model: str | None = None, pipeline: bool = False) -> DoctorReport:
    """Run the checks that need no live host on saved captures.

    With an inventory that names none of the captured hosts nothing could be
    checked against it: that is an InputError, not an empty passing report.
    """
    started = time.monotonic()
    if inventory is not None and not set(inventory.names) & set(captures):
        raise InputError(
            f"the inventory{' ' + inventory.path if inventory.path else ''} names none of the captured hosts "
            f"(inventory: {', '.join(inventory.names)}; captured: {', '.join(captures) or 'none'})",
            "pass the inventory the folder was collected with (the folder names are its host names), "
            "or replay without -i",
        )
    ctx = CheckContext(captures, inventory=inventory, live=False, backend=backend,
                       options={"hostfile": hostfile, "replay": True, "model": model, "pipeline": pipeline})
    return _report(ctx, started, inventory.cluster if inventory else None)
