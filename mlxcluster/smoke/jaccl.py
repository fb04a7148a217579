"""JACCL from an inventory: the RDMA matrix from the hosts' live topology.

``mlxcluster smoke --backend jaccl -i INVENTORY`` needs what a JACCL hostfile
holds (an ``rdma`` row per host: the ``rdma_<enX>`` device on the cable to
each peer). It probes every host as doctor does (``collect_captures``: the
same probe, ``system_profiler SPThunderboltDataType``, ``ibv_devices``,
``sw_vers``), judges per host whether it can take part, and builds the hostfile
with the generator ``mlxcluster hostfile generate --backend jaccl`` uses
(``generate_mlx_hostfile`` on ``build_topology``), so smoke launches exactly
what that command writes from the same captures.

A host cannot take part when it is not macOS 26.2+, lists no ``rdma_*``
device, has no Thunderbolt link faster than 40 Gb/s (rdma devices exist on
TB4 links too, where JACCL crashes), lacks the rdma device of a cable it
uses, or has no cable to some other host (JACCL needs a full mesh). Every
such reason is named per host; then the backend is "unavailable" (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mlxcluster.capture import IBV_DEVICES, SW_VERS, HostCapture
from mlxcluster.doctor_collect import collect_captures
from mlxcluster.errors import BackendUnavailable
from mlxcluster.hostfile import MlxHostfile
from mlxcluster.hostfile_generate import generate_mlx_hostfile
from mlxcluster.inventory import Inventory
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.parsers.sw_vers import parse_sw_vers
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.preflight import JACCL_MIN_MACOS
from mlxcluster.smoke.run import SmokeReport, run_backend
from mlxcluster.topology import TB5_MIN_GBPS, Topology, build_topology

FIX = ("JACCL needs macOS 26.2+ on every host, RDMA enabled ('rdma_ctl enable' in Recovery, "
       "check with ibv_devices) and a Thunderbolt 5 cable between every pair of hosts; "
       "mlxcluster doctor -i INVENTORY --backend jaccl shows the details, or test "
       "--backend ring")

Collect = Callable[[Inventory], dict[str, HostCapture]]


@dataclass(frozen=True)
class JacclPlan:
    """The hostfile for the run and the ranks carrying its ips and rdma rows."""

    hostfile: MlxHostfile
    hosts: tuple[RankHost, ...]


class JacclUnavailable(BackendUnavailable):
    """JACCL cannot run on these hosts; ``reasons`` maps host -> why (every reason)."""

    def __init__(self, reasons: dict[str, str], total: int):
        self.reasons = dict(reasons)
        lines = "\n".join(f"  {host}: {why}" for host, why in self.reasons.items())
        super().__init__(f"jaccl cannot run: {len(self.reasons)} of {total} host(s) cannot "
                         f"take part:\n{lines}", FIX)


def _system(capture: HostCapture) -> str | None:
    """Darwin, Linux...; None when the captures do not say (no probe, no sw_vers)."""
    probe = capture.probe() or {}
    system = (probe.get("os") or {}).get("system")
    if system:
        return str(system)
    return "Darwin" if capture.text(SW_VERS) is not None else None


def _command_status(capture: HostCapture, command: str) -> str | None:
    """What the probe said of running ``command`` (ok, absent, timeout...), if anything."""
    probe = capture.probe() or {}
    status = (probe.get("commands") or {}).get(command)
    return str(status) if status else None


def host_reasons(name: str, capture: HostCapture, topology: Topology) -> list[str]:
    """Every reason ``name`` cannot take part in a JACCL run (empty when it can)."""
    if capture.error:
        return [f"not probed: {capture.error}"]
    reasons = []
    system = _system(capture)
    if system is not None and system != "Darwin":
        reasons.append(f"runs {system}, not macOS (JACCL needs macOS 26.2 or later)")
    elif system == "Darwin":
        version = parse_sw_vers(capture.text(SW_VERS)).version_tuple
        if version and version < JACCL_MIN_MACOS:
            reasons.append(f"runs macOS {'.'.join(map(str, version))}, JACCL needs 26.2 or later")
    host = topology.hosts[name]
    if capture.text(IBV_DEVICES) is None:
        status = _command_status(capture, "ibv_devices")
        why = {"absent": "ibv_devices not found", None: "ibv_devices not captured"}.get(
            status, f"ibv_devices: {status}")
        reasons.append(f"no rdma_* devices ({why})")
    elif not host.rdma_devices:
        reasons.append("no rdma_* devices (ibv_devices lists none: RDMA is disabled)")
    links = [lk for lk in topology.links if name in (lk.a, lk.b)]
    fast = [lk for lk in links if lk.speed_gbps is not None and lk.speed_gbps > TB5_MIN_GBPS]
    if not fast:
        seen = ", ".join(f"{lk.interface_of(name) or '?'} -> {lk.b if lk.a == name else lk.a} "
                         + (f"{lk.speed_gbps:g} Gb/s" if lk.speed_gbps is not None else "? Gb/s")
                         for lk in links)
        reasons.append(f"no Thunderbolt link faster than {TB5_MIN_GBPS:g} Gb/s"
                       + (f" ({seen})" if seen else " (no Thunderbolt cable to another host)"))
        return reasons
    for lk in links:
        other = lk.b if lk.a == name else lk.a
        if lk not in fast:
            reasons.append(f"the cable {lk.interface_of(name) or '?'} -> {other} is not "
                           f"Thunderbolt 5 ({lk.speed_gbps or '?'} Gb/s, JACCL needs > "
                           f"{TB5_MIN_GBPS:g})")
        device = f"rdma_{lk.interface_of(name)}"
        if host.rdma_devices and device not in host.rdma_devices:
            reasons.append(f"no {device} for the cable to {other} (ibv_devices lists "
                           f"{', '.join(host.rdma_devices)})")
    unlinked = [o for o in topology.names() if o != name and not topology.links_between(name, o)]
    if unlinked:
        reasons.append(f"no Thunderbolt cable to {', '.join(unlinked)} (JACCL needs one between "
                       "every pair of hosts)")
    return reasons


def plan_from_captures(inventory: Inventory, captures: dict[str, HostCapture],
                       hosts: Sequence[RankHost]) -> JacclPlan:
    """The JACCL hostfile for ``inventory`` from ``captures`` (one per host),
    and ``hosts`` (the ranks, in inventory order) with its ips and rdma rows.
    JacclUnavailable names every host that cannot take part and why."""
    topology = build_topology({h.name: captures[h.name] for h in inventory.hosts})
    reasons = {h.name: "; ".join(why) for h in inventory.hosts
               if (why := host_reasons(h.name, captures[h.name], topology))}
    if reasons:
        raise JacclUnavailable(reasons, len(inventory.hosts))
    # The inventory's env reaches the ranks as --env (smoke's rank_env), not as "envs".
    hostfile = generate_mlx_hostfile(inventory, "jaccl", topology)
    ranks = tuple(replace(rank, ips=entry.ips, rdma=entry.rdma)
                  for rank, entry in zip(hosts, hostfile.hosts, strict=True))
    return JacclPlan(hostfile, ranks)


def plan_jaccl(inventory: Inventory, hosts: Sequence[RankHost],
               collect: Collect | None = None) -> JacclPlan:
    """Probe every host live (with the ranks' python), then plan_from_captures."""
    pythons = {h.name: h.python for h in hosts}
    probed = replace(inventory, hosts=tuple(replace(h, python=pythons.get(h.name, h.python))
                                            for h in inventory.hosts))
    return plan_from_captures(inventory, (collect or collect_captures)(probed), hosts)


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
