"""Parse macOS ``ifconfig`` / ``ifconfig -a`` output.

Handles tabs or pasted spaces, header lines wrapped by a paste ("mtu 1500"
alone on the next line), Apple's "..." elisions, bridge ``member:`` lines
(the Thunderbolt Bridge holding enX) and obfuscated addresses (skipped).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_HEADER = re.compile(r"^([A-Za-z][\w.]*\d*): flags=([0-9a-fA-F]+)<([^>]*)>(.*)$")
_MTU = re.compile(r"\bmtu (\d+)")


@dataclass(frozen=True)
class Interface:
    name: str
    flags: tuple[str, ...] = ()
    mtu: int | None = None
    mac: str | None = None
    inet: tuple[str, ...] = ()  # "a.b.c.d/prefix"
    inet6: tuple[str, ...] = ()
    status: str | None = None  # "active" / "inactive"
    members: tuple[str, ...] = ()  # bridge members

    @property
    def up(self) -> bool:
        return "UP" in self.flags


def _prefix_from_netmask(mask: str) -> int | None:
    try:
        value = int(mask, 16) if mask.startswith("0x") else int(ipaddress.IPv4Address(mask))
    except ValueError:
        return None
    return bin(value).count("1")


def _inet(words: list[str]) -> str | None:
    try:
        addr = ipaddress.IPv4Address(words[1])
    except (IndexError, ValueError):
        return None  # obfuscated ("BB.CC.DD.AA") or cut off
    prefix = None
    if "netmask" in words:
        i = words.index("netmask")
        prefix = _prefix_from_netmask(words[i + 1]) if i + 1 < len(words) else None
    return f"{addr}/{prefix if prefix is not None else 32}"


def parse_ifconfig(text: str | None) -> dict[str, Interface]:
    """Interfaces by name, in the printed order."""
    result: dict[str, dict] = {}
    current: dict | None = None
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip() == "...":
            continue
        m = _HEADER.match(line)
        if m:
            name = m.group(1)
            mtu = _MTU.search(m.group(4))
            current = result.setdefault(name, {
                "name": name, "flags": tuple(f for f in m.group(3).split(",") if f),
                "mtu": int(mtu.group(1)) if mtu else None, "mac": None, "inet": [],
                "inet6": [], "status": None, "members": [],
            })
            continue
        if current is None:
            continue
        words = line.split()
        if not line[0].isspace():
            # A wrapped header continuation, e.g. "mtu 1500" pasted on its own line.
            mtu = _MTU.search(line)
            if mtu and current["mtu"] is None:
                current["mtu"] = int(mtu.group(1))
            continue
        key = words[0]
        if key == "ether" and len(words) > 1:
            current["mac"] = words[1].lower()
        elif key == "inet":
            addr = _inet(words)
            if addr:
                current["inet"].append(addr)
        elif key == "inet6" and len(words) > 1:
            current["inet6"].append(words[1])
        elif key == "status:" and len(words) > 1:
            current["status"] = words[1]
        elif key == "member:" and len(words) > 1:
            current["members"].append(words[1])
    return {
        name: Interface(
            name=v["name"], flags=v["flags"], mtu=v["mtu"], mac=v["mac"],
            inet=tuple(v["inet"]), inet6=tuple(v["inet6"]), status=v["status"],
            members=tuple(v["members"]),
        )
        for name, v in result.items()
    }


def ipv4_addresses(iface: Interface) -> tuple[str, ...]:
    """The interface's IPv4 addresses without the prefix length."""
    return tuple(a.split("/")[0] for a in iface.inet)
