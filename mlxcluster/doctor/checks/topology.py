"""Doctor checks on the Thunderbolt topology (replayable: no live calls).

Each check builds the topology from ``ctx.captures`` and reports per-host
evidence; hints carry the exact commands to fix what is wrong. The intended
backend (``ctx.backend``) decides what is fatal: JACCL needs TB5 cables, a
full mesh (jaccl) or ring (jaccl-ring), rdma_* devices and no Thunderbolt
Bridge; ring and MPI merely run slower.
"""

from __future__ import annotations

import shlex

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import Verdict, doctor_check
from mlxcluster.doctor.fixes.macos import BRIDGE_OFF
from mlxcluster.errors import MlxclusterError
from mlxcluster.facts.capture import IBV_DEVICES
from mlxcluster.hostfile.hostfile import MlxHostfile, load_hostfile
from mlxcluster.topology.topology import TB5_MIN_GBPS, Topology, build_topology

# JACCL's RDMA needs Thunderbolt 5; rdma_* devices exist on TB4 too, where it crashes.
JACCL = ("jaccl", "jaccl-ring")


def _topology(ctx: CheckContext) -> Topology:
    cached = ctx.options.get("_topology")
    if cached is None:
        cached = build_topology(ctx.captures)
        ctx.options["_topology"] = cached
    return cached


def _with_tb(t: Topology) -> list[str]:
    return [n for n, h in t.hosts.items() if h.state == "ok"]


def _speed(value) -> str:
    return "? Gb/s" if value is None else f"{value:g} Gb/s"


def _cables_of(t: Topology, name: str) -> str:
    parts = []
    for lk in t.links:
        if name in (lk.a, lk.b):
            other = lk.b if name == lk.a else lk.a
            parts.append(f"{lk.interface_of(name) or '?'} -> {other} {_speed(lk.speed_gbps)}")
    return ", ".join(parts)


@doctor_check("thunderbolt-links", "Thunderbolt cables between the hosts")
def check_thunderbolt_links(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    if len(t.hosts) < 2 or not _with_tb(t):
        return Verdict(Status.SKIP,
                           {n: f"thunderbolt: {h.state}" for n, h in t.hosts.items()},
                           "needs system_profiler SPThunderboltDataType -json from 2+ hosts")
    hosts, lonely = {}, []
    linked = {(lk.a, lk.a_receptacle) for lk in t.links} | {(lk.b, lk.b_receptacle) for lk in t.links}
    for name, host in t.hosts.items():
        cables = _cables_of(t, name)
        unmatched = [f"{p.interface or '?'} -> {p.peer.name} ({p.peer.model or '?'}) not matched"
                     for p in host.ports if p.peer and (name, p.receptacle) not in linked]
        if host.state != "ok":
            hosts[name] = f"thunderbolt: {host.state}"
            lonely.append(name)
            continue
        hosts[name] = "; ".join(x for x in [cables, *unmatched] if x) or "no cable to another host"
        if not cables:
            lonely.append(name)
    if not lonely:
        return Verdict(Status.PASS, hosts)
    status = Status.FAIL if ctx.backend in JACCL else Status.WARN
    return Verdict(status, hosts,
        f"no Thunderbolt cable to another host from {', '.join(lonely)}: check the cables and "
        "run 'system_profiler SPThunderboltDataType' on each end; a Mac seen as 'not matched' "
        "could not be told apart from another one (capture all hosts, or SPHardwareDataType too)",
    )


@doctor_check("ring-or-mesh", "A Thunderbolt ring or full mesh through every host")
def check_ring_or_mesh(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    names = t.names()
    if len(names) < 2 or not _with_tb(t):
        return Verdict(Status.SKIP, {}, "needs Thunderbolt captures from 2+ hosts")
    evidence = {f"{a} -> {b}": "no cable" for i, a in enumerate(names) for b in names[i + 1:]
                if not t.links_between(a, b)}
    evidence["ring"] = " -> ".join([*t.ring, t.ring[0]]) if t.ring else "none"
    evidence["full mesh"] = "yes" if t.full_mesh else "no"
    need_mesh = ctx.backend == "jaccl"
    ok = t.full_mesh if need_mesh else t.ring is not None
    if ok:
        return Verdict(Status.PASS, evidence)
    if need_mesh and t.ring is not None:
        hint = ("jaccl needs a cable between every pair (the pairs above); "
                "or use --backend jaccl-ring, which needs only the ring")
    else:
        hint = ("cable the hosts listed above so that a ring passes through every host; "
                "'mlxcluster topology --from DIR --png topo.png' shows the cabling")
    status = Status.FAIL if ctx.backend in ("jaccl", "jaccl-ring") else Status.WARN
    return Verdict(status, evidence, hint)


@doctor_check("tb4-for-jaccl", "Cables fast enough for JACCL (Thunderbolt 5)")
def check_tb4_for_jaccl(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    if not t.links:
        return Verdict(Status.SKIP, {}, "no Thunderbolt cables between hosts")
    slow = [lk for lk in t.links if lk.speed_gbps is None or lk.speed_gbps <= TB5_MIN_GBPS]
    evidence = {f"{lk.a} {lk.a_interface} <-> {lk.b} {lk.b_interface}": _speed(lk.speed_gbps)
                for lk in t.links}
    if not slow:
        return Verdict(Status.PASS, evidence)
    if ctx.backend not in JACCL:
        return Verdict(Status.PASS, evidence,
                           "TB4-speed cables are fine for ring and MPI; JACCL would not work on them")
    return Verdict(Status.FAIL, evidence,
        "JACCL needs Thunderbolt 5 (80 Gb/s) on every cable; TB4 links expose rdma_* devices but "
        "JACCL crashes on them (ibv_reg_mr). Use TB5 ports and cables, or --backend ring",
    )


@doctor_check("rdma-devices", "RDMA devices for JACCL")
def check_rdma_devices(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    evidence, missing = {}, []
    for name, host in t.hosts.items():
        captured = ctx.captures[name].text(IBV_DEVICES) is not None
        used = sorted({lk.interface_of(name) for lk in t.links if name in (lk.a, lk.b)} - {None})
        absent = [f"rdma_{i}" for i in used if f"rdma_{i}" not in host.rdma_devices]
        if not captured:
            evidence[name] = "ibv_devices not captured (not installed, or macOS before 26.2)"
            missing.append(name)
        elif not host.rdma_devices:
            evidence[name] = "ibv_devices lists no device: RDMA is disabled"
            missing.append(name)
        else:
            evidence[name] = ", ".join(host.rdma_devices) + (
                f"; missing for cabled {', '.join(absent)}" if absent else "")
            if absent:
                missing.append(name)
    if ctx.backend not in JACCL:
        return Verdict(Status.SKIP, evidence,
                           "only needed for --backend jaccl / jaccl-ring")
    if not missing:
        return Verdict(Status.PASS, evidence)
    return Verdict(Status.FAIL, evidence,
        f"enable RDMA on {', '.join(missing)}: boot into Recovery (hold the power button), "
        "open Terminal, run 'rdma_ctl enable', reboot; needs macOS 26.2+ on every host; "
        "check with 'ibv_devices'",
    )


def _bridge_fix(name: str, members: tuple[str, ...]) -> str:
    # Member names come from the host's ifconfig output: quote them in a command to paste.
    cmds = [f"sudo ifconfig bridge0 deletem {shlex.quote(m)}" for m in members]
    cmds += ["sudo ifconfig bridge0 down",
             "sudo networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off"]
    return f"on {name}: " + "; ".join(cmds)


@doctor_check("thunderbolt-bridge", "Thunderbolt Bridge does not hold the Thunderbolt ports", fix=BRIDGE_OFF)
def check_thunderbolt_bridge(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    evidence, fixes = {}, []
    for name, host in t.hosts.items():
        if host.bridge_holds_thunderbolt is None:
            evidence[name] = "unknown (ifconfig or networksetup not captured)"
        elif host.bridge_holds_thunderbolt:
            evidence[name] = f"bridge0 holds {', '.join(host.bridge_members)}"
            fixes.append(_bridge_fix(name, host.bridge_members))
        else:
            evidence[name] = "bridge0 holds no Thunderbolt port"
    if all(h.bridge_holds_thunderbolt is None for h in t.hosts.values()):
        return Verdict(Status.SKIP, evidence,
                           "needs ifconfig and networksetup -listallhardwareports captures")
    if not fixes:
        return Verdict(Status.PASS, evidence)
    why = ("JACCL fails with 'Changing queue pair to RTR failed with errno 22' while bridge0 holds "
           "the ports" if ctx.backend in JACCL else
           "the bridge makes broadcast storms in 3+ host loops and can take the default route")
    return Verdict(Status.FAIL if ctx.backend in JACCL else Status.WARN, evidence,
        f"{why}. Fix: " + " | ".join(fixes) + ". macOS re-adds the ports after a reboot: re-run doctor",
        {n: {"members": list(h.bridge_members)} for n, h in t.hosts.items() if h.bridge_holds_thunderbolt},
    )


@doctor_check("link-speeds-differ", "All Thunderbolt cables run at the same speed")
def check_link_speeds_differ(ctx: CheckContext) -> Verdict:
    t = _topology(ctx)
    if not t.links:
        return Verdict(Status.SKIP, {}, "no Thunderbolt cables between hosts")
    evidence = {f"{lk.a} {lk.a_interface} <-> {lk.b} {lk.b_interface}": _speed(lk.speed_gbps)
                for lk in t.links}
    speeds = {lk.speed_gbps for lk in t.links}
    if len(speeds) == 1:
        return Verdict(Status.PASS, evidence)
    known = sorted(s for s in speeds if s is not None)
    slowest = _speed(known[0]) if known else "unknown"
    slow = [k for k, v in evidence.items() if v == slowest or v == "? Gb/s"]
    return Verdict(Status.WARN, evidence,
        f"the ring runs at its slowest cable ({slowest}): {', '.join(slow)}; reseat or replace "
        "that cable (a TB4/USB-C cable or a dock in between caps the speed)",
    )


def _hostfile_problems(hf: MlxHostfile, t: Topology, inventory) -> dict[str, str]:
    """Evidence of hostfile entries that the live cabling contradicts."""
    names = {}
    if inventory is not None:
        for h in inventory.hosts:
            names[h.ssh] = h.name
            names[h.name] = h.name
    ranks = [names.get(h.ssh, h.ssh) for h in hf.hosts]
    problems = {}
    for i, entry in enumerate(hf.hosts):
        me = ranks[i]
        if me not in t.hosts:
            problems[entry.ssh] = "not among the captured hosts"
            continue
        for j, dev in enumerate(entry.rdma):
            if dev is None or j >= len(ranks):
                continue
            wanted = {lk.interface_of(me) for lk in t.links_between(me, ranks[j])}
            for d in (dev,) if isinstance(dev, str) else dev:
                iface = d.removeprefix("rdma_")
                if iface not in wanted:
                    now = ", ".join(sorted(f"rdma_{w}" for w in wanted if w)) or "no cable"
                    problems[f"{entry.ssh} -> {hf.hosts[j].ssh}"] = (
                        f"hostfile says {d}, the cable is now on {now}")
        host = t.hosts[me]
        for ip in entry.ips:
            carriers = [n for n, iface in host.interfaces.items() if ip in
                        [a.split("/")[0] for a in iface.inet]]
            if host.interfaces and not carriers:
                problems[entry.ssh] = f"IP {ip} is on no interface of {me} any more"
    return problems


@doctor_check("hostfile-matches-topology", "The saved hostfile matches the cabling")
def check_hostfile_matches_topology(ctx: CheckContext) -> Verdict:
    path = ctx.options.get("hostfile")
    if not path:
        return Verdict(Status.SKIP, {},
                           "pass the hostfile you launch with (--hostfile FILE) to compare it")
    try:
        hf = load_hostfile(path)
    except MlxclusterError as err:
        return Verdict(Status.FAIL, {"hostfile": err.message},
                           err.hint)
    if not isinstance(hf, MlxHostfile):
        return Verdict(Status.SKIP,
                           {"hostfile": f"{path} is an MPI hostfile (no interfaces to compare)"})
    t = _topology(ctx)
    problems = _hostfile_problems(hf, t, ctx.inventory)
    if not problems:
        return Verdict(Status.PASS,
                           {h.ssh: "matches" for h in hf.hosts})
    backend = hf.backend or "ring"
    inv = ctx.inventory.path if ctx.inventory is not None and ctx.inventory.path else "INVENTORY"
    return Verdict(Status.FAIL, problems,
        "interfaces are renumbered after a reboot or a re-cabling; regenerate: "
        f"mlxcluster hostfile generate -i {inv} --backend {backend} --from DIR -o {path} --force",
    )
