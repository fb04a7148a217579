"""Where the data IPs live and how each host's routes reach them.

data-ip-kinds (ring, mpi): every data IP on the same kind of link (all
Thunderbolt or all LAN), none on Wi-Fi, each on its host's fastest interface.

Does each host's routing table send the data IPs where they belong?
(replayable: reads ``routes.txt``, i.e. ``netstat -rn -f inet`` on macOS and
``ip route`` on Linux, as collected by the probe).

data-ip-routes, for every backend: a data IP (the inventory's ``ips``; on a
replay without inventory, the IPv4 addresses of the Thunderbolt ports on
cables) must not be
- captured: the route a host would use to reach it runs through a VPN or
  tunnel interface (utun, ipsec, ppp, tun, wg, tailscale...) or lies in the
  overlay range 100.64.0.0/10 (Tailscale, CGNAT);
- claimed twice: two interfaces of the same host both have a connected
  (on-link) route to it, e.g. 169.254/16 on Wi-Fi and on a Thunderbolt port,
  or a stray 10.0.0.0/8 on another interface. Which one the kernel uses is
  then an accident of route order.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import (
    BAD,
    WARN,
    Verdict,
    captured_texts,
    doctor_check,
    host_facts_of,
    join_hosts,
    readable_text,
    skip,
    worst,
)
from mlxcluster.facts.capture import HARDWARE_PORTS, IFCONFIG, ROUTES
from mlxcluster.facts.parsers.hardware_ports import parse_hardware_ports
from mlxcluster.facts.parsers.ifconfig import ipv4_addresses, parse_ifconfig
from mlxcluster.facts.parsers.routes import Route, parse_routes
from mlxcluster.topology.topology import build_topology

TUNNEL = re.compile(r"^(utun|ipsec|ppp|tun|tap|wg|tailscale|zt|gpd|nordlynx|proton)\d*$", re.I)
OVERLAY = ipaddress.IPv4Network("100.64.0.0/10")


def data_ips(ctx: CheckContext) -> tuple[dict[str, list[str]], str]:
    """Host -> its data IPs (IPv4), and where they came from."""
    out: dict[str, list[str]] = {}
    if ctx.inventory is not None:
        for host in ctx.inventory.hosts:
            ips = [ip for ip in host.ips if ipaddress.ip_address(ip).version == 4]
            if ips:
                out[host.name] = ips
        if out:
            return out, "the inventory's ips"
    t = ctx.options.get("_topology") or build_topology(ctx.captures)
    for lk in t.links:
        for host in (lk.a, lk.b):
            iface = t.hosts[host].interfaces.get(lk.interface_of(host) or "")
            for ip in ipv4_addresses(iface) if iface else ():
                out.setdefault(host, []).append(ip)
    return out, "the Thunderbolt ports' addresses"


def _connected(r: Route) -> bool:
    """An on-link route (no next hop): the interface says the network is on its wire."""
    return (not r.neighbour and r.network.prefixlen > 0
            and (r.gateway is None or r.gateway.startswith("link#")))


def _is_tunnel(r: Route) -> bool:
    return bool(TUNNEL.match(r.interface or "")) or r.network.subnet_of(OVERLAY)


def best_route(routes, ip: ipaddress.IPv4Address) -> Route | None:
    """The route an unbound socket to ``ip`` takes: longest prefix, unscoped, not a neighbour entry."""
    fits = [r for r in routes if ip in r.network and not r.scoped and not r.neighbour]
    return max(fits, key=lambda r: r.network.prefixlen, default=None)


def route_problems(routes, ip: str, own: bool) -> list[str]:
    """What is wrong with how a host's ``routes`` reach ``ip`` (its own data IP when ``own``)."""
    addr = ipaddress.IPv4Address(ip)
    problems = []
    claims = {}
    for r in routes:
        if _connected(r) and addr in r.network and r.network.prefixlen < 32:
            claims.setdefault(r.interface, r)
    if len(claims) > 1:
        # Most specific first: the one the kernel uses for an unbound socket.
        ordered = sorted(claims.values(), key=lambda r: (-r.network.prefixlen, r.scoped))
        shown = " and ".join(r.shown() + (" (scoped)" if r.scoped else "") for r in ordered)
        problems.append(f"{ip}: claimed by {len(claims)} interfaces: {shown}")
    if not own:
        best = best_route(routes, addr)
        if best is not None and _is_tunnel(best):
            direct = [r for r in claims.values() if r is not best]
            other = f"; the direct route would be {direct[0].shown()}" if direct else ""
            problems.append(f"{ip}: goes into the VPN/overlay route {best.shown()}{other}")
    return problems


@doctor_check("data-ip-routes", "No VPN, overlay or second interface captures a data IP")
def data_ip_routes(ctx: CheckContext) -> Verdict:
    ips, source = data_ips(ctx)
    if not ips:
        return skip("no data IPs known (inventory ips, or ifconfig of the Thunderbolt ports)")
    owner = {ip: host for host, addrs in ips.items() for ip in addrs}
    texts, unread = captured_texts(ctx, ROUTES)
    evidence = dict.fromkeys(ctx.captures, "routes not captured")  # replaced where read
    bad = []
    for name, text in texts.items():
        routes = parse_routes(text)
        problems = []
        for ip, host in owner.items():
            problems += [p.replace(f"{ip}:", f"{ip} ({host}):", 1) if host != name else p
                         for p in route_problems(routes, ip, own=host == name)]
        if problems:
            evidence[name] = BAD + "; ".join(problems)
            bad.append(name)
        else:
            evidence[name] = f"{len(owner)} data IPs ({source}) routed directly"
    if len(unread) == len(ctx.captures):
        return skip("needs routes.txt captures (doctor --collect saves them)", evidence)
    hint = None
    if bad:
        hint = (f"on {join_hosts(bad)}: a data IP inside a VPN/overlay route travels through the tunnel (slow, "
                "or nowhere), and a subnet two interfaces claim goes out of whichever the kernel picks. "
                "Disconnect the VPN or exclude the data subnet from it (Tailscale: do not accept routes that "
                "cover it), remove the stray address or route from the other interface, or give the data "
                "path its own subnet (mlxcluster hostfile generate --plan-ips)")
    return Verdict(worst(bool(bad), False), evidence, hint)


# ---- data-ip-kinds ------------------------------------------------------------------

WIFI, LAN, THUNDERBOLT = "Wi-Fi", "LAN", "Thunderbolt"
# What the field measured (docs/doctor-checks.md, data-ip-kinds).
KIND_COST = ("ring hostfiles that mix Wi-Fi/LAN and Thunderbolt addresses fail with '[ring] Couldn't connect "
             "(error: 60)' or crawl (exo #2309, #2295); measured: JACCL 25.4 tok/s vs ring over Wi-Fi "
             "8.7 tok/s, MPI over Wi-Fi 274 s vs 11 s over Thunderbolt (mlx #1210)")


@dataclass(frozen=True)
class HostInterface:
    name: str
    ipv4: tuple[str, ...]
    kind: str  # WIFI / LAN / THUNDERBOLT
    speed_mbps: int | None = None
    up: bool | None = None


def _kind(name: str, ports) -> str:
    port = next((p.name for p in ports if p.device == name), None)
    if port is not None:
        if port == "Wi-Fi":
            return WIFI
        if re.fullmatch(r"Thunderbolt( \d+| Bridge)", port):
            return THUNDERBOLT
        return LAN
    if re.match(r"^(wl|wlan|wifi)", name):
        return WIFI
    if name.startswith(("thunderbolt", "bridge0")):
        return THUNDERBOLT
    return LAN


def host_interfaces(ctx: CheckContext, name: str) -> list[HostInterface]:
    """The host's interfaces with IPv4, from the probe (with link speeds) or ifconfig."""
    capture = ctx.captures[name]
    ports = parse_hardware_ports(readable_text(capture, HARDWARE_PORTS))
    facts = host_facts_of(ctx).get(name)
    out = []
    if facts is not None and facts.interfaces:
        for iface in facts.interfaces:
            ipv4 = tuple(a["address"] for a in iface.get("addrs", []) if a.get("family") == "inet" and "address" in a)
            if ipv4 and iface.get("name") and not ipv4[0].startswith("127."):
                out.append(HostInterface(iface["name"], ipv4, _kind(iface["name"], ports),
                                         iface.get("speed_mbps"), iface.get("up")))
        return out
    text = readable_text(capture, IFCONFIG)
    for iface in parse_ifconfig(text).values():
        ipv4 = tuple(a for a in ipv4_addresses(iface) if not a.startswith("127."))
        if ipv4:
            out.append(HostInterface(iface.name, ipv4, _kind(iface.name, ports), None, iface.up))
    return out


def _speed(mbps: int | None) -> str:
    if not mbps:
        return "speed unknown"
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps} Mb/s"


def _faster(mine: HostInterface, other: HostInterface) -> bool:
    """Is ``other`` a better home for a data IP than ``mine``?"""
    if other.up is False or other is mine:
        return False
    if mine.kind != THUNDERBOLT and other.kind == THUNDERBOLT:
        return True
    if mine.kind == WIFI and other.kind == LAN:
        return True
    if other.kind == mine.kind and other.speed_mbps:
        return not mine.speed_mbps or other.speed_mbps > mine.speed_mbps
    return False


@doctor_check("data-ip-kinds", "Data IPs all on Thunderbolt or all on LAN, none on Wi-Fi (ring, mpi)")
def data_ip_kinds(ctx: CheckContext) -> Verdict:
    if ctx.backend not in (None, "any", "ring", "mpi"):
        return skip("only for ring and mpi (JACCL uses the Thunderbolt ports by design)")
    if ctx.inventory is None or not any(h.ips for h in ctx.inventory.hosts):
        return skip("no data IPs in the inventory")
    evidence, warned, kinds = {}, [], {}
    for host in ctx.inventory.hosts:
        if host.name not in ctx.captures or not host.ips:
            continue
        interfaces = host_interfaces(ctx, host.name)
        if not interfaces:
            evidence[host.name] = "interfaces not captured"
            continue
        parts, notes = [], []
        for ip in host.ips:
            mine = next((i for i in interfaces if ip in i.ipv4), None)
            if mine is None:
                parts.append(f"{ip} on no interface (see data-ips-present)")
                continue
            kinds.setdefault(mine.kind, []).append(host.name)
            parts.append(f"{ip} on {mine.name} ({mine.kind}, {_speed(mine.speed_mbps)})")
            if mine.kind == WIFI:
                notes.append(f"{ip} is on Wi-Fi")
            better = [o for o in interfaces if _faster(mine, o)]
            if better:
                o = better[0]
                notes.append(f"{o.name} ({o.kind}, {_speed(o.speed_mbps)}) has {', '.join(o.ipv4)} and is faster")
        evidence[host.name] = (WARN if notes else "") + "; ".join(parts + notes)
        if notes:
            warned.append(host.name)
    mixed = THUNDERBOLT in kinds and len(kinds) > 1
    if mixed:
        slow = sorted({n for k, names in kinds.items() if k != THUNDERBOLT for n in names})
        for n in slow:
            if not evidence[n].startswith(WARN):
                evidence[n] = WARN + evidence[n]
                warned.append(n)
    if not kinds:
        return skip("no data IP found on a captured interface", evidence)
    if not warned:
        return Verdict(Status.PASS, evidence)
    what = []
    if mixed:
        what.append("the data IPs mix " + " and ".join(
            f"{k} ({join_hosts(set(v))})" for k, v in sorted(kinds.items())))
    if WIFI in kinds:
        what.append(f"data travels over Wi-Fi on {join_hosts(set(kinds[WIFI]))}")
    if any("is faster" in evidence[n] for n in warned):
        what.append("some data IPs are not on their host's fastest interface")
    return Verdict(Status.WARN, evidence,
                   "; ".join(what) + f". {KIND_COST}. Put every host's data IP on the same kind of link, the "
                   "fastest one (Thunderbolt: mlxcluster hostfile generate --plan-ips --from DIR)")
