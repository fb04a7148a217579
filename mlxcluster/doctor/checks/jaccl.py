"""Doctor checks of what JACCL (RDMA over Thunderbolt 5) needs on each Mac
beyond the cabling (replayable: they read captures only).

- rdma-enabled: ``rdma_ctl status`` says ``enabled`` (it exits 0 either way);
  without that capture, ``ibv_devices`` listing devices says the same.
- rdma-ports-active: every RDMA device on a cable the plan uses is
  PORT_ACTIVE in ``ibv_devinfo`` (a PORT_DOWN device fails at run time with
  "[jaccl] Couldn't allocate protection domain").
- thunderbolt-ipv4: every Thunderbolt interface on such a cable has an IPv4
  address (JACCL takes only IPv4-mapped GIDs, which exist only once the port
  has one: "Changing queue pair to RTR failed with errno 22", mlx #3467).
- jaccl-queue-pairs: the queue pairs the plan opens on each RDMA device stay
  within macOS's 10 per device (mlx PR #4209), and a mesh within MLX's 8 hosts.

The cables the plan uses: with ``--backend jaccl`` every cable between hosts
(the full mesh), with ``jaccl-ring`` the cables between ring neighbours.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import (
    BAD,
    Verdict,
    captured_texts,
    doctor_check,
    grouped_fixes,
    join_hosts,
    readable_text,
    skip,
)
from mlxcluster.doctor.checks.common import WARN as WARN_MARK
from mlxcluster.doctor.checks.topology import JACCL, _topology
from mlxcluster.doctor.fixes.macos import IP_PLAN
from mlxcluster.errors import MlxclusterError
from mlxcluster.facts.capture import IBV_DEVICES, IBV_DEVINFO, RDMA_CTL
from mlxcluster.facts.parsers.ibv import parse_ibv_devices, parse_ibv_devinfo
from mlxcluster.facts.parsers.ifconfig import ipv4_addresses
from mlxcluster.facts.parsers.rdma_ctl import DISABLED, ENABLED, parse_rdma_ctl_status
from mlxcluster.hostfile.hostfile import MlxHostfile, load_hostfile
from mlxcluster.hostfile.ipplan import plan_ips
from mlxcluster.topology.topology import Link, Topology

RECOVERY_STEPS = ("shut it down, hold the power button until 'Loading startup options' appears, choose "
                  "Options > Continue, open Utilities > Terminal, run 'rdma_ctl enable', reboot; "
                  "'rdma_ctl status' then prints 'enabled'")
ONLY_JACCL = "only needed for --backend jaccl / jaccl-ring"


def planned_links(t: Topology, backend: str | None) -> list[Link]:
    """The cables JACCL will use: all of them for the mesh, the ring's hops for jaccl-ring."""
    if backend != "jaccl-ring" or not t.ring:
        return list(t.links)
    ring = list(t.ring)
    hops = {frozenset(p) for p in zip(ring, ring[1:] + ring[:1], strict=True)}
    return [lk for lk in t.links if frozenset((lk.a, lk.b)) in hops]


def _ends(links: list[Link], host: str) -> list[tuple[str | None, str]]:
    """(interface, peer) of each planned cable end on ``host``."""
    return [(lk.interface_of(host), lk.b if host == lk.a else lk.a) for lk in links if host in (lk.a, lk.b)]


def planned_ends(ctx: CheckContext, t: Topology) -> tuple[dict[str, list[tuple[str | None, str]]], str]:
    """Host -> (interface, peer) of each RDMA connection the plan makes, and
    where the plan came from: the ``--hostfile`` rdma matrix when given (the
    neighbours only for jaccl-ring), else the cables."""
    path = ctx.options.get("hostfile")
    planned = _rows_from_hostfile(path, ctx) if path else None
    if planned is None:
        links = planned_links(t, ctx.backend)
        return {name: _ends(links, name) for name in t.hosts}, "the cables"
    rows, order = planned
    n = len(order)
    ends: dict[str, list[tuple[str | None, str]]] = {}
    for i, host in enumerate(order):
        peers = [order[(i - 1) % n], order[(i + 1) % n]] if ctx.backend == "jaccl-ring" else order
        for peer in dict.fromkeys(p for p in peers if p != host):
            for dev in rows.get(host, {}).get(peer, ()):
                ends.setdefault(host, []).append((dev.removeprefix("rdma_"), peer))
    return ends, f"hostfile {path}"


def jaccl_only(fn: Callable[[CheckContext], Verdict]) -> Callable[[CheckContext], Verdict]:
    """A check that skips unless the backend is jaccl or jaccl-ring."""

    @functools.wraps(fn)
    def checked(ctx: CheckContext) -> Verdict:
        return fn(ctx) if ctx.backend in JACCL else skip(ONLY_JACCL)

    return checked


def jaccl_cables(ctx: CheckContext) -> tuple[Topology, dict[str, list[tuple[str | None, str]]]]:
    """The topology, and planned_ends of each host."""
    t = _topology(ctx)
    return t, planned_ends(ctx, t)[0]


def rdma_state(capture) -> tuple[str | None, str]:
    """(ENABLED / DISABLED / None for unknown, evidence) of one host's captures."""
    text = readable_text(capture, RDMA_CTL)
    devices_text = readable_text(capture, IBV_DEVICES)
    devices = [d.name for d in parse_ibv_devices(devices_text)]
    if text is not None:
        status = parse_rdma_ctl_status(text)
        if status.state in (ENABLED, DISABLED):
            return status.state, f"rdma_ctl status: {status.said}"
        if devices:  # rdma_ctl could not say, but the devices exist only with RDMA on
            return ENABLED, f"ibv_devices lists {', '.join(devices)} (rdma_ctl said {status.said!r})"
        return None, f"rdma_ctl status said {status.said or 'nothing'!r}, not 'enabled'"
    if devices_text is not None:
        if devices:
            return ENABLED, f"ibv_devices lists {', '.join(devices)} (rdma_ctl status not captured)"
        return DISABLED, "ibv_devices lists no device (rdma_ctl status not captured)"
    return None, "neither rdma_ctl status nor ibv_devices captured (macOS before 26.2?)"


@doctor_check("rdma-enabled", "RDMA over Thunderbolt enabled on every Mac (rdma_ctl status)")
def rdma_enabled(ctx: CheckContext) -> Verdict:
    evidence, off = {}, []
    for name, capture in ctx.captures.items():
        state, said = rdma_state(capture)
        evidence[name] = said if state == ENABLED else BAD + said
        if state != ENABLED:
            off.append(name)
    if ctx.backend not in JACCL:
        return skip(ONLY_JACCL, {n: e.removeprefix(BAD) for n, e in evidence.items()})
    if not off:
        return Verdict(Status.PASS, evidence)
    return Verdict(Status.FAIL, evidence,
                   f"RDMA is not confirmed on {join_hosts(off)}; on each of them: {RECOVERY_STEPS}. "
                   "rdma_ctl exits 0 whether RDMA is on or off: doctor reads what it prints")


@doctor_check("rdma-ports-active", "The RDMA devices on the planned cables are PORT_ACTIVE (ibv_devinfo)")
@jaccl_only
def rdma_ports_active(ctx: CheckContext) -> Verdict:
    _, plan = jaccl_cables(ctx)
    texts, unknown = captured_texts(ctx, IBV_DEVINFO)
    evidence = dict.fromkeys(ctx.captures, "ibv_devinfo not captured")  # replaced where read
    down, fixes = [], []
    for name, text in texts.items():
        states = {d.name: d for d in parse_ibv_devinfo(text)}
        ends = plan.get(name, [])
        if not ends:  # no cable known: at least one port must be up for JACCL to use this Mac
            shown = ", ".join(f"{d} {'PORT_ACTIVE' if i.active else '/'.join(i.port_states) or '?'}"
                              for d, i in states.items()) or "no device"
            if any(i.active for i in states.values()):
                evidence[name] = f"no planned cable known; {shown}"
            else:
                evidence[name] = BAD + f"no PORT_ACTIVE device: {shown}"
                down.append(name)
                fixes.append((name, "check the Thunderbolt cables and that the peer has RDMA enabled", None))
            continue
        parts, bad = [], []
        for iface, peer in ends:
            dev = f"rdma_{iface}" if iface else None
            info = states.get(dev or "")
            if info is None:
                parts.append(f"{dev or '?'} (cable to {peer}) not listed by ibv_devinfo")
                bad.append(dev or "?")
            elif not info.active:
                parts.append(f"{dev} (cable to {peer}) {'/'.join(info.port_states) or 'no port state'}")
                bad.append(dev)
                fixes.append((name, f"on {name} reseat the cable of {iface} (to {peer}) and make sure "
                                    f"{peer} has RDMA enabled; 'ibv_devinfo -d {dev}' must say PORT_ACTIVE", name))
            else:
                parts.append(f"{dev} (cable to {peer}) PORT_ACTIVE")
        evidence[name] = (BAD if bad else "") + "; ".join(parts)
        if bad:
            down.append(name)
    if len(unknown) == len(ctx.captures):
        return skip("needs ibv_devinfo captures (doctor --collect runs it on each host)", evidence)
    if not down:
        return Verdict(Status.PASS if not unknown else Status.WARN, evidence,
                       f"no ibv_devinfo from {join_hosts(unknown)}: their ports are unchecked" if unknown else None)
    return Verdict(Status.FAIL, evidence,
                   "a PORT_DOWN device makes JACCL fail with \"[jaccl] Couldn't allocate protection domain\": "
                   + (grouped_fixes(fixes) or "fix the devices named") +
                   "; 'mlxcluster hostfile generate --backend jaccl' skips PORT_DOWN devices when another cable joins the pair")


def _ipv4_of(t: Topology, host: str, iface: str | None) -> tuple[str, ...] | None:
    """IPv4 addresses on ``iface`` (ifconfig capture), or None when ifconfig was not captured."""
    interfaces = t.hosts[host].interfaces
    if not interfaces:
        return None
    found = interfaces.get(iface or "")
    return ipv4_addresses(found) if found else ()


@doctor_check("thunderbolt-ipv4", "Every Thunderbolt port JACCL uses has an IPv4 address", fix=IP_PLAN)
@jaccl_only
def thunderbolt_ipv4(ctx: CheckContext) -> Verdict:
    t, plan = jaccl_cables(ctx)
    if not any(plan.values()):
        return skip("no Thunderbolt cable between hosts known (see thunderbolt-links)")
    evidence, bare, unknown, bare_ends = {}, [], [], set()
    for name in t.hosts:
        ends = plan.get(name, [])
        if not ends:
            continue
        parts, missing = [], False
        for iface, peer in ends:
            addrs = _ipv4_of(t, name, iface)
            if addrs is None:
                parts.append(f"{iface or '?'} (cable to {peer}): ifconfig not captured")
                unknown.append(name)
            elif addrs:
                parts.append(f"{iface} (cable to {peer}) {', '.join(addrs)}")
            else:
                parts.append(f"{iface or '?'} (cable to {peer}) has no IPv4 address")
                missing = True
                bare_ends.add((name, iface))
        evidence[name] = (BAD if missing else "") + "; ".join(parts)
        if missing:
            bare.append(name)
    if not bare:
        if len(set(unknown)) == len(evidence):
            return skip("needs ifconfig captures of the cabled hosts", evidence)
        return Verdict(Status.PASS if not unknown else Status.WARN, evidence,
                       f"no ifconfig from {join_hosts(set(unknown))}" if unknown else None)
    return Verdict(Status.FAIL, evidence, _ipv4_hint(t, bare), _ip_plan_fix_data(t, bare_ends))


def _ip_plan_fix_data(t: Topology, bare_ends: set[tuple[str, str | None]]) -> dict[str, dict]:
    """Host -> its part of the IP plan (``fixes/macos.py`` ``ip_plan_commands``):
    both ends of every cable with an end without IPv4 (one /30 needs both), where
    both hosts' ifconfig was captured (what each end had before is its undo)."""
    try:
        ip_plan = plan_ips(t)
    except MlxclusterError:
        return {}
    data: dict[str, dict] = {}
    for cable in ip_plan.cables:
        lk = cable.link
        ends = ((lk.a, lk.a_interface, cable.a_ip, cable.b_ip), (lk.b, lk.b_interface, cable.b_ip, cable.a_ip))
        if not any((host, iface) in bare_ends for host, iface, _, _ in ends):
            continue
        if not all(t.hosts[host].interfaces for host, *_ in ends):
            continue
        for host, iface, mine, peer in ends:
            interfaces = t.hosts[host].interfaces
            bridge = interfaces.get("bridge0")
            d = data.setdefault(host, {"bridge": bridge.name if bridge else None,
                                       "bridge_up": bool(bridge and bridge.up), "ends": []})
            had = interfaces.get(iface or "")
            d["ends"].append({"interface": iface, "address": mine, "peer": peer,
                              "before": list(had.inet) if had else []})
    return data


def _ipv4_hint(t: Topology, bare: list[str]) -> str:
    why = ("JACCL uses only IPv4-mapped GIDs, which a port publishes once it has an IPv4 address; without one "
           "it fails with 'Changing queue pair to RTR failed with errno 22' (mlx #3467). The self-assigned "
           "169.254 address can take minutes to appear. Give each cable a /30 "
           "('mlxcluster hostfile generate --plan-ips --from DIR' prints this plan)")
    try:
        plan = plan_ips(t)
    except MlxclusterError:
        return why + "."
    return why + ": " + " | ".join(f"on {h}: " + "; ".join(plan.commands(h)) for h in bare)


# ---- jaccl-queue-pairs ----------------------------------------------------------------

# macOS 26.5.1: the 11th ibv_create_qp on one Thunderbolt RDMA device fails with
# errno 16 (EBUSY), whether spread over contexts or not (mlx PR #4209, issue #3162).
QUEUE_PAIRS_PER_DEVICE = 10
# mlx/distributed/jaccl/mesh.cpp: "The JACCL mesh supports up to 8 peers" (size, self included).
MESH_MAX_HOSTS = 8


def queue_pairs(rows: dict[str, dict[str, tuple[str, ...]]], order: list[str], backend: str) -> dict[str, dict[str, int]]:
    """Host -> device -> queue pairs one run creates on it.

    From MLX's JACCL (mlx/distributed/jaccl/mesh.cpp, ring.cpp): the mesh
    opens one Connection, with one queue pair, per peer on the device its row
    names for that peer; the ring opens one per device to its left neighbour
    and one per device to its right, so with two hosts (left == right) each
    device carries two. ``rows[host][peer]`` are the devices ``host`` uses to
    reach ``peer`` (the hostfile's rdma row)."""
    n = len(order)
    out: dict[str, dict[str, int]] = {}
    for i, host in enumerate(order):
        counts: dict[str, int] = {}
        if backend == "jaccl-ring":
            peers = [order[(i - 1) % n], order[(i + 1) % n]] if n > 1 else []
        else:
            peers = [p for p in order if p != host]
        for peer in peers:
            for dev in rows.get(host, {}).get(peer, ()):
                counts[dev] = counts.get(dev, 0) + 1
        out[host] = counts
    return out


def _rows_from_topology(t: Topology, backend: str | None) -> tuple[dict, list[str]]:
    order = list(t.ring) if backend == "jaccl-ring" and t.ring else t.names()
    rows: dict[str, dict[str, tuple[str, ...]]] = {h: {} for h in order}
    for lk in planned_links(t, backend):
        for me, other in ((lk.a, lk.b), (lk.b, lk.a)):
            iface = lk.interface_of(me)
            if iface and me in rows:
                rows[me][other] = rows[me].get(other, ()) + (f"rdma_{iface}",)
    return rows, order


def _rows_from_hostfile(path: str, ctx: CheckContext) -> tuple[dict, list[str]] | None:
    try:
        hf = load_hostfile(path)
    except MlxclusterError:
        return None  # hostfile-matches-topology reports it
    if not isinstance(hf, MlxHostfile) or not any(h.rdma for h in hf.hosts):
        return None
    names = {h.ssh: h.name for h in ctx.inventory.hosts} if ctx.inventory is not None else {}
    order = [names.get(h.ssh, h.ssh) for h in hf.hosts]
    rows = {}
    for me, entry in zip(order, hf.hosts, strict=True):
        rows[me] = {order[j]: ((d,) if isinstance(d, str) else tuple(d))
                    for j, d in enumerate(entry.rdma) if d is not None and j < len(order)}
    return rows, order


@doctor_check("jaccl-queue-pairs", "The JACCL plan fits each RDMA device's 10 queue pairs")
@jaccl_only
def jaccl_queue_pairs(ctx: CheckContext) -> Verdict:
    path = ctx.options.get("hostfile")
    planned = _rows_from_hostfile(path, ctx) if path else None
    source = f"hostfile {path}" if planned else "the cables"
    if planned is None:
        t = _topology(ctx)
        if not t.links:
            return skip("no Thunderbolt cable between hosts known, and no --hostfile with an rdma matrix")
        planned = _rows_from_topology(t, ctx.backend)
    rows, order = planned
    counts = queue_pairs(rows, order, ctx.backend)
    evidence, over = {}, []
    for host, per_device in counts.items():
        if not per_device:
            evidence[host] = "no RDMA device planned"
            continue
        too_many = {d: c for d, c in per_device.items() if c > QUEUE_PAIRS_PER_DEVICE}
        shown = ", ".join(f"{d} {c}" for d, c in sorted(per_device.items()))
        evidence[host] = (WARN_MARK if too_many else "") + f"queue pairs per device: {shown}"
        if too_many:
            over.append(host)
    big_mesh = ctx.backend == "jaccl" and len(order) > MESH_MAX_HOSTS
    if big_mesh:
        evidence["mesh"] = WARN_MARK + f"{len(order)} hosts; MLX's JACCL mesh takes at most {MESH_MAX_HOSTS}"
    if not over and not big_mesh:
        return Verdict(Status.PASS, evidence)
    hint = []
    if over:
        hint.append(f"on {join_hosts(over)} the plan ({source}) needs more than {QUEUE_PAIRS_PER_DEVICE} queue pairs "
                    "on one device: macOS gives 10 per Thunderbolt RDMA device and the 11th ibv_create_qp fails "
                    "with errno 16 (mlx PR #4209); spread the connections over more ports/cables")
    if big_mesh:
        hint.append(f"a JACCL mesh of {len(order)} hosts fails at start ('The JACCL mesh supports up to "
                    f"{MESH_MAX_HOSTS} peers'): use --backend jaccl-ring, or at most {MESH_MAX_HOSTS} hosts")
    return Verdict(Status.WARN, evidence, "; ".join(hint))
