"""Parse ``networksetup -listallhardwareports``.

The only reliable map from a Thunderbolt receptacle to its network interface:
receptacle N is the hardware port named exactly "Thunderbolt N" (its enX is
numbered at boot and differs between Macs). "Thunderbolt Bridge" (bridge0)
and "Thunderbolt Ethernet Slot 1" (a PCIe NIC in a TB chassis) are not
receptacles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TB_PORT = re.compile(r"^Thunderbolt (\d+)$")


@dataclass(frozen=True)
class HardwarePort:
    name: str  # "Thunderbolt 1", "Wi-Fi", "Ethernet Adapter (en4)"...
    device: str | None  # "en1", "bridge0"
    mac: str | None


def parse_hardware_ports(text: str | None) -> tuple[HardwarePort, ...]:
    """Every ``Hardware Port:`` block, in the printed order."""
    ports: list[HardwarePort] = []
    name = device = mac = None

    def flush() -> None:
        if name is not None:
            ports.append(HardwarePort(name, device, mac))

    for raw in (text or "").splitlines():
        key, sep, value = raw.strip().partition(":")
        if not sep:
            continue
        value = value.strip() or None
        if key == "Hardware Port":
            flush()
            name, device, mac = value or "unknown", None, None
        elif key == "Device" and name is not None:
            device = value
        elif key == "Ethernet Address" and name is not None:
            mac = value.lower() if value else None
    flush()
    return tuple(ports)


def thunderbolt_interfaces(ports: tuple[HardwarePort, ...]) -> dict[int, str]:
    """Receptacle number -> interface, from ports named exactly "Thunderbolt N"."""
    found: dict[int, str] = {}
    for port in ports:
        m = _TB_PORT.match(port.name)
        if m and port.device:
            found[int(m.group(1))] = port.device
    return found


def bridge_interface(ports: tuple[HardwarePort, ...]) -> str | None:
    """The device of the "Thunderbolt Bridge" service (normally bridge0)."""
    return next((p.device for p in ports if p.name == "Thunderbolt Bridge"), None)
