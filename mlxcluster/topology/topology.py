"""The Thunderbolt topology of a cluster, built from per-host captures.

Per host: its receptacles (each mapped to an interface through networksetup's
"Thunderbolt N" -> enX, never assumed), what is cabled to each (a peer Mac,
possibly behind docks, and other devices), the RDMA devices and whether the
Thunderbolt Bridge holds the Thunderbolt interfaces. Across hosts: cables,
matched by domain UUID (a port's peer UUID is the far bus's own domain UUID),
else inferred from the peer's name/model and equal link speed when exactly
one candidate fits (ties are never guessed). From the cables: the
connectivity matrix, the best ring and whether the hosts form a full mesh.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from mlxcluster.facts.capture import (
    HARDWARE,
    HARDWARE_PORTS,
    IBV_DEVICES,
    IBV_DEVINFO,
    IFCONFIG,
    THUNDERBOLT,
    HostCapture,
)
from mlxcluster.facts.parsers.hardware import parse_hardware
from mlxcluster.facts.parsers.hardware_ports import (
    bridge_interface,
    parse_hardware_ports,
    thunderbolt_interfaces,
)
from mlxcluster.facts.parsers.ibv import parse_ibv_devices, parse_ibv_devinfo
from mlxcluster.facts.parsers.ifconfig import Interface, parse_ifconfig
from mlxcluster.facts.parsers.thunderbolt import TbDevice, parse_thunderbolt

# The ring search is exact (depth-first); beyond this many hosts it could take too long.
MAX_RING_SEARCH_HOSTS = 16
# Search steps before settling for the best ring found so far (deterministic).
RING_SEARCH_BUDGET = 200_000
TB5_MIN_GBPS = 40.0  # a Thunderbolt 5 link is faster than this (TB4 links run at 40 Gb/s)


@dataclass(frozen=True)
class Peer:
    name: str  # "Mac Studio"
    model: str | None  # "Mac15,14"
    uuid: str | None  # the far bus's domain UUID


@dataclass(frozen=True)
class Port:
    receptacle: int | None
    interface: str | None  # from networksetup "Thunderbolt N"; None when unknown
    connected: bool
    speed_gbps: float | None
    peer: Peer | None = None
    via: tuple[str, ...] = ()  # docks between this port and the peer
    devices: tuple[str, ...] = ()  # non-Mac devices on this port
    uuid: str | None = None  # this bus's own domain UUID

    def to_json(self) -> dict[str, Any]:
        return {
            "receptacle": self.receptacle,
            "interface": self.interface,
            "connected": self.connected,
            "speed_gbps": self.speed_gbps,
            "peer": None if self.peer is None else {
                "name": self.peer.name, "model": self.peer.model, "uuid": self.peer.uuid},
            "via": list(self.via),
            "devices": list(self.devices),
        }


@dataclass(frozen=True)
class HostTopology:
    name: str
    ports: tuple[Port, ...]
    rdma_devices: tuple[str, ...]
    bridge_holds_thunderbolt: bool | None  # None: ifconfig or networksetup missing
    state: str = "ok"  # thunderbolt parse state: ok / no_hardware / unknown / missing / unreadable
    model_name: str | None = None  # what peers call this Mac ("Mac Studio")
    model_id: str | None = None  # "Mac15,14" when SPHardware was captured
    bridge_members: tuple[str, ...] = ()
    interfaces: dict[str, Interface] = field(default_factory=dict, compare=False)
    # RDMA device -> PORT_ACTIVE or not, from ibv_devinfo; {} when not captured.
    rdma_active: dict[str, bool] = field(default_factory=dict, compare=False)

    def port_down(self, device: str) -> bool:
        """ibv_devinfo shows ``device`` and none of its ports is PORT_ACTIVE."""
        return self.rdma_active.get(device) is False

    def port_ipv4(self, port: Port) -> list[str] | None:
        """The IPv4 addresses (169.254 self-assigned included) on a port's
        interface; None when ifconfig was not captured or the port has no interface."""
        if not self.interfaces or not port.interface:
            return None
        iface = self.interfaces.get(port.interface)
        return [a.split("/")[0] for a in iface.inet] if iface else []

    def to_json(self) -> dict[str, Any]:
        ports = []
        for p in self.ports:
            entry = p.to_json()
            entry["ipv4"] = self.port_ipv4(p)
            device = f"rdma_{p.interface}" if p.interface else None
            entry["rdma_active"] = self.rdma_active.get(device) if device else None
            ports.append(entry)
        return {
            "ports": ports,
            "rdma_devices": list(self.rdma_devices),
            "bridge_holds_thunderbolt": self.bridge_holds_thunderbolt,
        }


@dataclass(frozen=True)
class Link:
    a: str
    a_interface: str | None
    b: str
    b_interface: str | None
    speed_gbps: float | None
    matched_by: str  # "uuid" | "inferred"
    a_receptacle: int | None = None
    b_receptacle: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a, "a_interface": self.a_interface,
            "b": self.b, "b_interface": self.b_interface,
            "speed_gbps": self.speed_gbps, "matched_by": self.matched_by,
        }

    def interface_of(self, host: str) -> str | None:
        return self.a_interface if host == self.a else self.b_interface if host == self.b else None


@dataclass(frozen=True)
class Topology:
    hosts: dict[str, HostTopology]
    links: tuple[Link, ...]
    ring: tuple[str, ...] | None
    full_mesh: bool

    def names(self) -> list[str]:
        return list(self.hosts)

    def links_between(self, a: str, b: str) -> list[Link]:
        """Every cable joining a and b, in a stable order."""
        return [lk for lk in self.links if {lk.a, lk.b} == {a, b} and a != b]

    def matrix(self) -> list[list[int]]:
        """Number of cables between each pair, hosts in ``names()`` order."""
        names = self.names()
        return [[len(self.links_between(a, b)) if a != b else 0 for b in names] for a in names]

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": {n: h.to_json() for n, h in self.hosts.items()},
            "links": [lk.to_json() for lk in self.links],
            "ring": list(self.ring) if self.ring is not None else None,
            "full_mesh": self.full_mesh,
        }


# ---- per host --------------------------------------------------------------


def _find_peer(devices: tuple[TbDevice, ...], via: tuple[TbDevice, ...] = ()):
    """The first Mac on a port, depth first, with the docks in front of it."""
    for dev in devices:
        if dev.is_mac:
            return dev, via
        found = _find_peer(dev.children, via + (dev,))
        if found[0] is not None:
            return found
    return None, ()


def _non_mac_names(devices: tuple[TbDevice, ...]) -> list[str]:
    names = []
    for dev in devices:
        if dev.is_mac:
            continue  # what sits behind another Mac is that Mac's business
        names.append(dev.name)
        names.extend(_non_mac_names(dev.children))
    return names


# The capture files the topology is built from.
TOPOLOGY_FILES = (THUNDERBOLT, HARDWARE_PORTS, IFCONFIG, IBV_DEVICES, IBV_DEVINFO, HARDWARE)


def unreadable_files(captures: dict[str, HostCapture]) -> dict[str, dict[str, str]]:
    """Host -> {path of a topology capture file: why it cannot be read}; such a file
    counts as not captured (the host's Thunderbolt state is then "unreadable")."""
    out = {}
    for name, capture in captures.items():
        problems = {capture.path(f): why for f, why in capture.problems().items() if f in TOPOLOGY_FILES}
        if problems:
            out[name] = problems
    return out


def build_host(capture: HostCapture) -> HostTopology:
    """One host's ports, RDMA devices and bridge state from its raw captures."""
    problems = capture.problems()

    def text(file_name: str) -> str | None:  # an unreadable file counts as not captured
        return None if file_name in problems else capture.text(file_name)

    tb_text = text(THUNDERBOLT)
    report = parse_thunderbolt(tb_text) if tb_text is not None else None
    hw_ports_text = text(HARDWARE_PORTS)
    hw_ports = parse_hardware_ports(hw_ports_text) if hw_ports_text is not None else ()
    tb_ifaces = thunderbolt_interfaces(hw_ports)
    ports = []
    for bus in report.buses if report else ():
        mac, via = _find_peer(bus.devices)
        speeds = [s for s in [bus.speed_gbps, *(d.speed_gbps for d in via)] if s is not None]
        ports.append(Port(
            receptacle=bus.receptacle,
            interface=tb_ifaces.get(bus.receptacle) if bus.receptacle is not None else None,
            connected=bus.connected,
            speed_gbps=min(speeds) if speeds else None,
            peer=Peer(mac.name, mac.model, mac.uuid) if mac else None,
            via=tuple(d.name for d in via),
            devices=tuple(_non_mac_names(bus.devices)),
            uuid=bus.uuid,
        ))
    # Receptacle order, unknown receptacles last: buses come listed out of order.
    ports.sort(key=lambda p: (p.receptacle is None, p.receptacle or 0))

    ibv_text = text(IBV_DEVICES)
    rdma = tuple(sorted(d.name for d in parse_ibv_devices(ibv_text))) if ibv_text else ()

    devinfo_text = text(IBV_DEVINFO)
    rdma_active = {d.name: d.active for d in parse_ibv_devinfo(devinfo_text)} if devinfo_text else {}

    ifconfig_text = text(IFCONFIG)
    interfaces = parse_ifconfig(ifconfig_text) if ifconfig_text is not None else {}
    bridge_name = bridge_interface(hw_ports) or "bridge0"
    members = interfaces[bridge_name].members if bridge_name in interfaces else ()
    if ifconfig_text is None or hw_ports_text is None:
        holds = None
    else:
        holds = any(m in tb_ifaces.values() for m in members)

    hardware = parse_hardware(text(HARDWARE)) if text(HARDWARE) else None
    bus_names = {b.host_name for b in report.buses if b.host_name} if report else set()
    model_name = (hardware.model_name if hardware else None) or (
        next(iter(bus_names)) if len(bus_names) == 1 else None)
    return HostTopology(
        name=capture.name,
        ports=tuple(ports),
        rdma_devices=rdma,
        bridge_holds_thunderbolt=holds,
        state=report.state if report else "unreadable" if THUNDERBOLT in problems else "missing",
        model_name=model_name,
        model_id=hardware.model_id if hardware else None,
        bridge_members=tuple(members),
        interfaces=interfaces,
        rdma_active=rdma_active,
    )


# ---- across hosts -----------------------------------------------------------


def _link(a: str, pa: Port, b: str, pb: Port, how: str) -> Link:
    speeds = [s for s in (pa.speed_gbps, pb.speed_gbps) if s is not None]
    if (a, pa.receptacle or 0) > (b, pb.receptacle or 0):
        a, pa, b, pb = b, pb, a, pa
    return Link(a, pa.interface, b, pb.interface, min(speeds) if speeds else None, how,
                pa.receptacle, pb.receptacle)


def _describes(peer: Peer, host: HostTopology) -> bool:
    """Could ``peer`` (seen from the far end of a cable) be ``host``?"""
    if host.model_name is None or peer.name != host.model_name:
        return False
    return host.model_id is None or peer.model is None or peer.model == host.model_id


def match_links(hosts: dict[str, HostTopology]) -> tuple[Link, ...]:
    """Cables between hosts: by domain UUID, then inferred where unambiguous."""
    by_uuid = {p.uuid: (n, p) for n, h in hosts.items() for p in h.ports if p.uuid}
    used: set[tuple[str, int]] = set()
    links = []
    for name, host in hosts.items():
        for i, port in enumerate(host.ports):
            if not port.connected or port.peer is None or port.peer.uuid not in by_uuid:
                continue
            other, far = by_uuid[port.peer.uuid]
            j = hosts[other].ports.index(far)
            if other == name or (name, i) in used or (other, j) in used:
                continue
            used.update({(name, i), (other, j)})
            links.append(_link(name, port, other, far, "uuid"))

    def open_ports(name):
        return [(i, p) for i, p in enumerate(hosts[name].ports)
                if p.connected and p.peer is not None and (name, i) not in used]

    # Candidate pairs: each side's peer looks like the other host, equal speed.
    candidates = []
    for a, b in itertools.combinations(hosts, 2):
        for i, pa in open_ports(a):
            for j, pb in open_ports(b):
                if (_describes(pa.peer, hosts[b]) and _describes(pb.peer, hosts[a])
                        and pa.speed_gbps is not None and pa.speed_gbps == pb.speed_gbps):
                    candidates.append(((a, i), (b, j)))
    for end_a, end_b in candidates:
        # A port with more than one candidate partner is a tie: leave it unmatched.
        if sum(end_a in c for c in candidates) == 1 and sum(end_b in c for c in candidates) == 1:
            used.update({end_a, end_b})
            links.append(_link(end_a[0], hosts[end_a[0]].ports[end_a[1]],
                               end_b[0], hosts[end_b[0]].ports[end_b[1]], "inferred"))
    links.sort(key=lambda lk: (lk.a, lk.b, lk.a_receptacle or 0, lk.b_receptacle or 0))
    return tuple(links)


def _count(links: tuple[Link, ...], a: str, b: str) -> int:
    return sum(1 for lk in links if {lk.a, lk.b} == {a, b})


def find_ring(names: list[str], links: tuple[Link, ...]) -> tuple[str, ...] | None:
    """The ring through every host with the fastest slowest hop, or None.

    Rings are scored by (slowest hop capacity, total capacity); a hop's
    capacity sums its cables. Among equal scores the lexicographically first
    order starting at the first host wins, so the answer is deterministic.
    Depth-first over cabled pairs only, with branch-and-bound pruning and a
    step budget (after which the best ring found so far is returned).
    """
    if len(names) <= 1:
        return tuple(names) or None
    if len(names) > MAX_RING_SEARCH_HOSTS:
        return None
    cap: dict[tuple[str, str], float] = {}
    for lk in links:
        if lk.a != lk.b:
            for key in ((lk.a, lk.b), (lk.b, lk.a)):
                cap[key] = cap.get(key, 0.0) + (lk.speed_gbps or 0.0) + 1e-9
    best: list = [None, None]  # order, score
    fastest = max(cap.values(), default=0.0)
    budget = [RING_SEARCH_BUDGET]

    def walk(path: list[str], slowest: float, total: float) -> None:
        budget[0] -= 1
        # Bound: the hops still to come run at best at the fastest cable; a path
        # that cannot strictly beat the best ring found is dropped (ties keep
        # the earlier, lexicographically first, order).
        hops_left = len(names) - len(path) + 1
        if best[1] is not None and (budget[0] < 0 or
                                    (slowest, total + hops_left * fastest) <= best[1]):
            return
        here = path[-1]
        if len(path) == len(names):
            back = cap.get((here, path[0]))
            if back is not None:
                score = (min(slowest, back), total + back)
                if best[1] is None or score > best[1]:
                    best[0], best[1] = tuple(path), score
            return
        for nxt in names:
            c = cap.get((here, nxt))
            if c is not None and nxt not in path:
                walk(path + [nxt], min(slowest, c), total + c)

    walk([names[0]], float("inf"), 0.0)
    return best[0]


def is_full_mesh(names: list[str], links: tuple[Link, ...]) -> bool:
    """Every pair of hosts joined by at least one cable."""
    return all(_count(links, a, b) > 0 for a, b in itertools.combinations(names, 2))


def build_topology(captures: dict[str, HostCapture]) -> Topology:
    """The whole cluster's topology; hosts in name order."""
    hosts = {name: build_host(captures[name]) for name in sorted(captures)}
    links = match_links(hosts)
    names = list(hosts)
    return Topology(hosts, links, find_ring(names, links), is_full_mesh(names, links))
