"""Does each host's routing table send the data IPs where they belong?
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

from mlxcluster.capture import ROUTES
from mlxcluster.checks.base import CheckContext
from mlxcluster.checks.common import BAD, Verdict, doctor_check, join_hosts, skip, worst
from mlxcluster.parsers.ifconfig import ipv4_addresses
from mlxcluster.parsers.routes import Route, parse_routes
from mlxcluster.topology import build_topology

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
    evidence, bad, unread = {}, [], []
    for name, capture in ctx.captures.items():
        text = None if ROUTES in capture.problems() else capture.text(ROUTES)
        if text is None:
            evidence[name] = "routes not captured"
            unread.append(name)
            continue
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
