"""Find Macs on the local network through Bonjour (mDNS / DNS-SD).

Macs with Remote Login on publish ``_ssh._tcp``; every Mac publishes
``_device-info._tcp`` whose TXT record carries its model (``model=Mac16,9``).
``browse`` listens for both, ``merge_records`` (pure) joins them per machine,
``probe_ssh`` reads each host's SSH banner (no credentials needed), and
``render_inventory`` (pure) writes an inventory that ``load_inventory`` accepts.
The probe of discovered hosts (``probe_discovered``) lives with the other
probes in ``mlxcluster/facts/collect.py``: facts sit above inventory.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import yaml

SSH_SERVICE = "_ssh._tcp.local."
DEVICE_INFO_SERVICE = "_device-info._tcp.local."
SERVICES = (SSH_SERVICE, DEVICE_INFO_SERVICE)


@dataclass(frozen=True)
class ServiceRecord:
    """One resolved DNS-SD service instance."""

    service: str  # e.g. "_ssh._tcp.local."
    instance: str  # e.g. "Studio 1" (the part before the service type)
    server: str | None  # e.g. "studio-1.local."
    addresses: tuple[str, ...]
    port: int | None
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DiscoveredHost:
    name: str  # instance name as published (may contain spaces)
    hostname: str | None  # "studio-1.local", no trailing dot
    addresses: tuple[str, ...]
    ssh_port: int | None  # None: no _ssh._tcp (Remote Login off)
    model: str | None  # from _device-info, e.g. "Mac16,9"
    ssh_banner: str | None = None  # filled by probe_ssh
    ssh_error: str | None = None

    @property
    def is_mac(self) -> bool:
        return bool(self.model) and bool(re.match(r"^(Mac|iMac|MacBook|Macmini|MacPro)", self.model))

    @property
    def ssh_target(self) -> str:
        """What to put in an inventory's ``ssh``: the .local name, else an IP."""
        if self.hostname and re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*$", self.hostname):
            return self.hostname
        ipv4 = [a for a in self.addresses if ":" not in a]
        return (ipv4 or list(self.addresses) or [self.name])[0]


def merge_records(records: Iterable[ServiceRecord]) -> list[DiscoveredHost]:
    """Join _ssh and _device-info records of one machine (same instance name
    or same server), sorted by name. Pure."""
    by_key: dict[str, dict] = {}
    for rec in records:
        key = (rec.server or rec.instance).lower().rstrip(".")
        alt = rec.instance.lower()
        entry = by_key.get(key) or by_key.get(alt)
        if entry is None:
            entry = {"name": rec.instance, "hostname": None, "addresses": [], "ssh_port": None, "model": None}
            by_key[key] = entry
        by_key.setdefault(alt, entry)
        if rec.server:
            entry["hostname"] = rec.server.rstrip(".")
        for addr in rec.addresses:
            if addr not in entry["addresses"]:
                entry["addresses"].append(addr)
        if rec.service == SSH_SERVICE:
            entry["ssh_port"] = rec.port
            entry["name"] = rec.instance
        elif rec.service == DEVICE_INFO_SERVICE and rec.properties.get("model"):
            entry["model"] = rec.properties["model"]
    unique = {id(e): e for e in by_key.values()}.values()
    hosts = [
        DiscoveredHost(e["name"], e["hostname"], tuple(_sorted_addresses(e["addresses"])),
                       e["ssh_port"], e["model"])
        for e in unique
    ]
    return sorted(hosts, key=lambda h: h.name.lower())


def _sorted_addresses(addresses: list[str]) -> list[str]:
    # IPv4 first (what ssh and MLX's ring use), then IPv6; stable otherwise.
    return sorted(addresses, key=lambda a: (":" in a, a))


def browse(timeout: float = 3.0, interfaces: list[str] | None = None,
           zeroconf_factory: Callable | None = None) -> list[DiscoveredHost]:
    """Listen for Macs for ``timeout`` seconds and return what answered.

    ``interfaces``: IP addresses of the local interfaces to use (default: all).
    """
    from zeroconf import InterfaceChoice, ServiceBrowser, Zeroconf

    factory = zeroconf_factory or Zeroconf
    zc = factory(interfaces=interfaces or InterfaceChoice.All)
    seen: set[tuple[str, str]] = set()
    lock = threading.Lock()

    class _Listener:
        def add_service(self, _zc, service_type, name):
            with lock:
                seen.add((service_type, name))

        update_service = add_service

        def remove_service(self, _zc, service_type, name):
            pass

    try:
        browser = ServiceBrowser(zc, list(SERVICES), _Listener())
        time.sleep(timeout)
        browser.cancel()
        with lock:
            found = sorted(seen)
        records = []
        for service_type, name in found:
            info = zc.get_service_info(service_type, name, timeout=int(min(timeout, 3.0) * 1000))
            if info is None:
                continue
            records.append(ServiceRecord(
                service=service_type,
                instance=name[: -len(service_type) - 1] if name.endswith(service_type) else name,
                server=info.server,
                addresses=tuple(info.parsed_addresses()),
                port=info.port,
                properties={_text(k): _text(v) for k, v in (info.properties or {}).items() if k},
            ))
    finally:
        zc.close()
    return merge_records(records)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def probe_ssh(hosts: list[DiscoveredHost], timeout: float = 3.0) -> list[DiscoveredHost]:
    """Read each host's SSH banner in parallel (a TCP connect, no login)."""

    def one(host: DiscoveredHost) -> DiscoveredHost:
        if host.ssh_port is None:
            return replace(host, ssh_error="no _ssh._tcp (Remote Login off?)")
        target = next((a for a in host.addresses if ":" not in a), host.ssh_target)
        try:
            with socket.create_connection((target, host.ssh_port), timeout=timeout) as sock:
                sock.settimeout(timeout)
                banner = sock.recv(256).decode("ascii", "replace").strip()
            return replace(host, ssh_banner=banner.splitlines()[0] if banner else "")
        except OSError as exc:
            return replace(host, ssh_error=exc.strerror or type(exc).__name__)

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def inventory_name(instance: str) -> str:
    """A valid inventory host name from a Bonjour instance name ("Studio 1" -> "Studio-1")."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", instance).strip("-.") or "host"
    return name[:63]


def inventory_entries(hosts: list[DiscoveredHost], prefer_ip: bool = False
                      ) -> list[tuple[DiscoveredHost, dict]]:
    """Each host that offers SSH with its inventory entry (unique, safe name).
    ``prefer_ip``: ssh to the address that answered rather than the .local name. Pure."""
    entries = []
    used: set[str] = set()
    for host in hosts:
        if host.ssh_port is None:
            continue
        name = inventory_name(host.name)
        base, i = name, 2
        while name in used:
            name, i = f"{base}-{i}", i + 1
        used.add(name)
        ips = [a for a in host.addresses if _is_ip(a) and ":" not in a]
        entry: dict = {"name": name, "ssh": ips[0] if prefer_ip and ips else host.ssh_target}
        if ips:
            entry["ips"] = ips
        if host.ssh_port not in (None, 22):
            entry["port"] = host.ssh_port
        entries.append((host, entry))
    return entries


def render_inventory(hosts: list[DiscoveredHost], *, cluster: str, python: str,
                     user: str | None = None, ssh_config: str | None = None,
                     prefer_ip: bool = False) -> str:
    """Inventory YAML for the discovered hosts (those with SSH only). Pure."""
    doc: dict = {"cluster": cluster}
    if user:
        doc["user"] = user
    doc["python"] = python
    if ssh_config:
        doc["ssh_config"] = ssh_config
    doc["hosts"] = [entry for _, entry in inventory_entries(hosts, prefer_ip)]
    header = "# Written by 'mlxcluster discover'. Check python and ips, then: mlxcluster doctor -i THIS_FILE\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
