"""Find Macs on the local network with Bonjour (mDNS / DNS-SD).

A Mac with Remote Login on announces ``_ssh._tcp``; every Mac also announces
``_device-info._tcp`` whose TXT record carries its model (``model=Mac16,9``).
Both use the computer name as the instance name, which is how the two are
joined. ``browse`` listens for ``timeout`` seconds and returns what answered;
``discovered_inventory`` turns the result into an inventory (validated by
the same loader as a hand-written one) and ``inventory_yaml`` writes it.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from dataclasses import dataclass, field

from mlxcluster.inventory import Inventory, parse_inventory

SSH_SERVICE = "_ssh._tcp.local."
DEVICE_INFO_SERVICE = "_device-info._tcp.local."


@dataclass
class DiscoveredHost:
    """One machine that answered, joined across the two services."""

    instance: str  # Bonjour instance name (the computer name, may contain spaces)
    server: str | None = None  # e.g. studio-1.local.
    addresses: list[str] = field(default_factory=list)
    ssh_port: int | None = None
    model: str | None = None

    @property
    def name(self) -> str:
        """An inventory-safe name derived from the instance name."""
        return inventory_name(self.instance)

    @property
    def target(self) -> str | None:
        """The ssh target: the first IPv4 address (works without mDNS name resolution)."""
        v4 = [a for a in self.addresses if ipaddress.ip_address(a).version == 4]
        return (v4 or self.addresses or [None])[0]


def inventory_name(instance: str) -> str:
    """'Studio 1 (2)' -> 'studio-1-2': letters, digits, '.', '_', '-' only."""
    name = re.sub(r"[^a-z0-9._-]+", "-", instance.lower()).strip("-._")
    return (name or "host")[:63]


def _instance(full_name: str, service: str) -> str:
    return full_name[: -len(service) - 1] if full_name.endswith("." + service) else full_name


def browse(timeout: float = 3.0, interfaces: list[str] | None = None) -> list[DiscoveredHost]:
    """Browse both services for ``timeout`` seconds; hosts sorted by name.

    ``interfaces``: local IPv4 addresses to browse from (default: all).
    """
    from zeroconf import InterfaceChoice, ServiceBrowser, ServiceStateChange, Zeroconf

    found: dict[tuple[str, str], None] = {}
    lock = threading.Lock()

    def on_change(zeroconf, service_type, name, state_change):
        if state_change is ServiceStateChange.Added:
            with lock:
                found[(service_type, name)] = None

    zc = Zeroconf(interfaces=interfaces or InterfaceChoice.All)
    try:
        browser = ServiceBrowser(zc, [SSH_SERVICE, DEVICE_INFO_SERVICE], handlers=[on_change])
        time.sleep(timeout)
        browser.cancel()
        hosts: dict[str, DiscoveredHost] = {}
        with lock:
            names = list(found)
        for service_type, full_name in names:
            info = zc.get_service_info(service_type, full_name, timeout=1500)
            instance = _instance(full_name, service_type)
            host = hosts.setdefault(instance, DiscoveredHost(instance))
            if info is None:
                continue
            if service_type == SSH_SERVICE:
                host.server = info.server
                host.ssh_port = info.port
                for addr in info.parsed_addresses():
                    if addr not in host.addresses:
                        host.addresses.append(addr)
            else:
                props = {k.decode(): (v.decode() if isinstance(v, bytes) else v)
                         for k, v in (info.properties or {}).items()}
                host.model = props.get("model")
    finally:
        zc.close()
    return sorted(hosts.values(), key=lambda h: h.name)


def discovered_inventory(hosts: list[DiscoveredHost], *, cluster: str, python: str,
                         user: str | None = None, ssh_config: str | None = None) -> Inventory:
    """An Inventory of the hosts that announce SSH (validated like a file)."""
    return parse_inventory(inventory_yaml(hosts, cluster=cluster, python=python, user=user,
                                          ssh_config=ssh_config), source="<discovered>")


def inventory_yaml(hosts: list[DiscoveredHost], *, cluster: str, python: str, user: str | None = None,
                   ssh_config: str | None = None) -> str:
    """The inventory file text for the hosts that announce SSH (names made unique)."""
    lines = [f"# written by 'mlxcluster discover' on {time.strftime('%Y-%m-%d %H:%M')}",
             f"cluster: {cluster}"]
    if user:
        lines.append(f"user: {user}")
    lines.append(f"python: {python}")
    if ssh_config:
        lines.append(f"ssh_config: {ssh_config}")
    lines.append("hosts:")
    seen: set[str] = set()
    for h in hosts:
        if not h.target or not h.ssh_port:
            continue
        name, i = h.name, 2
        while name in seen:
            name, i = f"{h.name}-{i}", i + 1
        seen.add(name)
        model = f"  # {h.model}" if h.model else ""
        lines += [f"  - name: {name}{model}", f"    ssh: {h.target}"]
        if h.ssh_port != 22:
            lines.append(f"    port: {h.ssh_port}")
    return "\n".join(lines) + "\n"
