"""JACCL smoke from an inventory: the RDMA matrix from the hosts' live topology.

``mlxcluster smoke --backend jaccl -i INVENTORY`` needs what a JACCL hostfile
holds (an ``rdma`` row per host). jaccl_plan probes every host as doctor does,
judges per host whether it can take part and builds the hostfile with the
generator ``mlxcluster hostfile generate --backend jaccl`` uses, so smoke
launches exactly what that command writes from the same captures (and what
``train`` and ``run`` launch). When a host cannot take part the backend is
"unavailable" (exit 3) with every host's reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mlxcluster.errors import BackendUnavailable
from mlxcluster.facts import collect as doctor_collect
from mlxcluster.facts.capture import HostCapture
from mlxcluster.hostfile.hostfile import MlxHostfile
from mlxcluster.hostfile.jaccl_plan import Collect, JacclUnavailable, hostfile_from_captures
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.run import SmokeReport, run_backend


@dataclass(frozen=True)
class JacclPlan:
    """The hostfile for the run and the ranks carrying its ips and rdma rows."""

    hostfile: MlxHostfile
    hosts: tuple[RankHost, ...]


def plan_from_captures(inventory: Inventory, captures: dict[str, HostCapture],
                       hosts: Sequence[RankHost]) -> JacclPlan:
    """The JACCL hostfile for ``inventory`` from ``captures`` (one per host),
    and ``hosts`` (the ranks, in inventory order) with its ips and rdma rows.
    JacclUnavailable names every host that cannot take part and why."""
    hostfile = hostfile_from_captures(inventory, captures, "jaccl")
    ranks = tuple(replace(rank, ips=entry.ips, rdma=entry.rdma)
                  for rank, entry in zip(hosts, hostfile.hosts, strict=True))
    return JacclPlan(hostfile, ranks)


def plan_jaccl(inventory: Inventory, hosts: Sequence[RankHost],
               collect: Collect | None = None) -> JacclPlan:
    """Probe every host live (with the ranks' python), then plan_from_captures."""
    pythons = {h.name: h.python for h in hosts}
    probed = replace(inventory, hosts=tuple(replace(h, python=pythons.get(h.name, h.python))
                                            for h in inventory.hosts))
    return plan_from_captures(inventory, (collect or doctor_collect.collect_captures)(probed), hosts)


def run_jaccl(inventory: Inventory, hosts: tuple[RankHost, ...], opts: WorkerOptions,
              timeout_s: float = 60.0, collect: Collect | None = None,
              environ: dict[str, str] | None = None) -> SmokeReport:
    """The smoke run of jaccl on an inventory's hosts: planned from the live
    topology; "unavailable" with a reason per host when it cannot run."""
    try:
        plan = plan_jaccl(inventory, hosts, collect)
    except JacclUnavailable as err:
        return SmokeReport("jaccl", "unavailable", reason=f"{len(err.reasons)} of {len(hosts)} "
                           "host(s) cannot take part", host_reasons=err.reasons, hint=err.hint)
    except BackendUnavailable as err:  # e.g. the generator's own mesh check
        return SmokeReport("jaccl", "unavailable", reason=err.message, hint=err.hint or "")
    # The captures answered what the preflight would ask (macOS, rdma, TB5).
    return run_backend("jaccl", plan.hosts, opts, timeout_s, environ=environ,
                       reason_unavailable=lambda backend, ranks: None)
