"""Data-path checks: the inventory's data IPs exist on their hosts, and every
host reaches every other host's ring ports over TCP (errno mapped to a cause).

Evidence is keyed by the TARGET host: a port dropped by one host's firewall
shows up as that host failing to accept connections from the others.
"""

from __future__ import annotations

import ipaddress

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    BAD,
    Verdict,
    doctor_check,
    from_hosts,
    join_hosts,
    probed_hosts,
    skip,
    worst,
)

# errno name (as the connecting host reported it) -> cause. macOS numbers
# differ from Linux (60/61/65 vs 110/111/113) but the names are the same.
CONNECT_CAUSES = {
    "ECONNREFUSED": "refused: nothing listening there, or a firewall rejects the port",
    "ETIMEDOUT": "timed out: a firewall drops the port, or the link is down",
    "EHOSTUNREACH": "no route to host: wrong subnet, cable or interface down",
    "ENETUNREACH": "network unreachable: no interface/route on that subnet",
    "EHOSTDOWN": "host down (no ARP answer on the link)",
    "EADDRNOTAVAIL": "the connecting host cannot use that address family/route",
    "ECONNRESET": "reset: a firewall or proxy kills the connection",
}
BIND_CAUSES = {
    "EADDRNOTAVAIL": "this IP is not assigned on the host",
    "EADDRINUSE": "port already in use (a job still running?)",
    "EACCES": "not permitted to listen on that port",
}


def explain_errno(name: str) -> str:
    """A cause for a connect errno name; unknown names are shown as they are."""
    return CONNECT_CAUSES.get(name, name)


@doctor_check("data-ips-present", "Inventory data IPs are assigned on their hosts")
def data_ips_present(ctx: CheckContext) -> Verdict:
    if ctx.inventory is None:
        return skip("no inventory (replay of a capture folder)")
    facts = probed_hosts(ctx)
    evidence, bad = {}, []
    for host in ctx.inventory.hosts:
        f = facts.get(host.name)
        if not host.ips:
            evidence[host.name] = "no data IPs in the inventory (the ssh target is used)"
            continue
        if f is None or not f.interfaces:
            evidence[host.name] = "not probed"
            continue
        owned = {}
        for iface in f.interfaces:
            for a in iface.get("addrs", []):
                owned[a.get("address")] = iface
        problems = []
        for ip in host.ips:
            iface = owned.get(str(ipaddress.ip_address(ip)))
            if iface is None:
                problems.append(f"{ip} is not assigned on this host")
            elif iface.get("up") is False:
                problems.append(f"{ip} is on {iface.get('name')}, which is down")
        if problems:
            evidence[host.name] = BAD + "; ".join(problems)
            bad.append(host.name)
        else:
            evidence[host.name] = ", ".join(f"{ip} on {owned[str(ipaddress.ip_address(ip))].get('name')}"
                                            for ip in host.ips)
    # Nothing checked is no pass: no data IPs to look for, or no host to look on.
    if not any(h.ips for h in ctx.inventory.hosts):
        return skip("no data IPs in the inventory", evidence)
    if not any(h.ips and h.name in facts and facts[h.name].interfaces for h in ctx.inventory.hosts):
        return skip("no host with data IPs was probed", evidence)
    hint = None
    if bad:
        hint = (f"fix the IP plan on {join_hosts(bad)} or the inventory ips (interfaces renumber after a "
                "reboot: re-run 'mlxcluster topology')")
    return Verdict(worst(bool(bad), False), evidence, hint)


@doctor_check("data-path", "Data path: TCP from every host to every other host's ring ports", live=True)
def data_path(ctx: CheckContext) -> Verdict:
    report = ctx.services["live"].data_path
    if report is None:
        return skip("fewer than two hosts answered over SSH")
    evidence: dict[str, str] = {}
    bad: list[str] = []
    causes: set[str] = set()
    for target, endpoints in report.endpoints.items():
        if target in report.skipped:
            evidence[target] = f"not tested ({report.skipped[target]})"
            continue
        binds = report.bind_errors.get(target, [])
        # An IP missing from its host is data-ips-present's finding; only note it here.
        notes = [f"{ip}:{port} not tested ({BIND_CAUSES[err]}, see data-ips-present)"
                 for ip, port, err in binds if err == "EADDRNOTAVAIL"]
        problems = [_bind_problem(ip, port, err, report.holders.get(target, {}).get((ip, port)))
                    for ip, port, err in binds if err != "EADDRNOTAVAIL"]
        failures: dict[tuple[str, int, str], list[str]] = {}
        ok_sources = set()
        others = [h for h in report.endpoints if h != target and h not in report.skipped]
        for c in report.connects:
            if c.target != target:
                continue
            if c.result == "ok":
                ok_sources.add(c.source)
            else:
                failures.setdefault((c.ip, c.port, c.result), []).append(c.source)
                causes.add(c.result)
        for (ip, port, err), sources in sorted(failures.items()):
            problems.append(f"{ip}:{port} from {from_hosts(sources, others)}: {explain_errno(err)}")
        if problems:
            evidence[target] = BAD + "; ".join(problems + notes)
            bad.append(target)
        else:
            tested = {(c.ip, c.port) for c in report.connects if c.target == target}
            ports = ", ".join(f"{e.ip}:{e.port}" for e in endpoints if (e.ip, e.port) in tested) or "nothing"
            evidence[target] = "; ".join([f"{ports} reachable from {from_hosts(ok_sources, others) or 'no other host'}"]
                                         + notes)
    return Verdict(worst(bool(bad), False), evidence, _hint(bad, causes, report))


def _bind_problem(ip: str, port: int, err: str, holder: str | None) -> str:
    if err == "EADDRINUSE" and holder:
        return f"cannot listen on {ip}:{port}: port already in use by {holder}"
    return f"cannot listen on {ip}:{port}: {BIND_CAUSES.get(err, err)}"


def _hint(bad: list[str], causes: set[str], report) -> str | None:
    if not bad:
        return None
    first = min(e.port for eps in report.endpoints.values() for e in eps)
    last = max(e.port for eps in report.endpoints.values() for e in eps)
    parts = []
    if causes & {"ETIMEDOUT", "ECONNREFUSED", "ECONNRESET"}:
        parts.append(f"allow TCP {first}-{last} in on {join_hosts(bad)} (macOS: System Settings > Network > "
                     "Firewall, allow your python; Linux: nft/iptables accept that range)")
    if causes & {"EHOSTUNREACH", "ENETUNREACH", "EHOSTDOWN"}:
        parts.append("check cables and the IP plan; for MPI restrict traffic to the working subnet with "
                     "--mca btl_tcp_if_include <subnet>")
    busy = sorted({str(h) for h, errs in report.bind_errors.items() for _, _, err in errs if err == "EADDRINUSE"})
    if busy:
        parts.append(f"on {join_hosts(busy)} stop what holds the ring port (kill the pid named above: an old run "
                     f"left behind?) or move the ring ports with mlx.launch --starting-port")
    if not parts:
        parts.append("fix the listed addresses")
    return "; ".join(parts)



