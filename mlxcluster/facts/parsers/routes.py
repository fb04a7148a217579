"""Parse IPv4 routing tables: macOS ``netstat -rn -f inet`` and Linux ``ip route``.

macOS abbreviates destinations: trailing zero octets are dropped and the
prefix length is left out when it is the classful one ("127" is 127.0.0.0/8,
"169.254" is 169.254.0.0/16, "192.168.31" is 192.168.31.0/24, "10.37.129/24"
has its length); a row with the H flag is one host (/32). Rows whose gateway
is a MAC address (flag L, "UHLWI") are the neighbour cache, not routes anyone
configured; they are kept but marked ``neighbour``. The Internet6 part and
anything unreadable are skipped.

``ip route`` rows are ``[type] DEST [via GW] dev IFACE ...``; "default" is 0/0.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_MAC = re.compile(r"^[0-9a-fA-F]{1,2}(:[0-9a-fA-F]{1,2}){5}$")


@dataclass(frozen=True)
class Route:
    network: ipaddress.IPv4Network
    gateway: str | None  # "192.168.1.1", "link#13", None
    interface: str | None
    flags: str = ""
    neighbour: bool = False  # an ARP/neighbour cache entry, not a configured route

    @property
    def scoped(self) -> bool:
        """macOS flag I: used only by traffic bound to that interface (not for lookups)."""
        return "I" in self.flags

    @property
    def default(self) -> bool:
        return self.network.prefixlen == 0

    def shown(self) -> str:
        """The route as one line: "100.64.0.0/10 via utun3"."""
        via = f" gw {self.gateway}" if self.gateway and not self.gateway.startswith("link#") else ""
        return f"{self.network}{via} on {self.interface or '?'}"


def _classful(first_octet: int) -> int:
    return 8 if first_octet < 128 else 16 if first_octet < 192 else 24 if first_octet < 224 else 4


def bsd_destination(text: str, host: bool) -> ipaddress.IPv4Network | None:
    """One netstat destination as a network; None when it is not IPv4."""
    if text == "default":
        return ipaddress.IPv4Network("0.0.0.0/0")
    addr, _, length = text.partition("/")
    octets = addr.split(".")
    if not 1 <= len(octets) <= 4 or not all(o.isdigit() and int(o) < 256 for o in octets):
        return None
    full = ".".join(octets + ["0"] * (4 - len(octets)))
    if length:
        if not length.isdigit() or int(length) > 32:
            return None
        prefix = int(length)
    elif host or len(octets) == 4:
        prefix = 32
    else:
        prefix = _classful(int(octets[0]))
    try:
        return ipaddress.IPv4Network(f"{full}/{prefix}", strict=False)
    except ValueError:
        return None


def parse_netstat_routes(text: str | None) -> tuple[Route, ...]:
    """The Internet (IPv4) rows of macOS ``netstat -rn [-f inet]``."""
    routes = []
    section = None
    for line in (text or "").splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] in ("Internet:", "Internet6:"):
            section = words[0]
            continue
        if words[0] in ("Destination", "Routing"):
            continue
        if section == "Internet6:" or len(words) < 4:
            continue
        dest, gateway, flags, iface = words[:4]
        network = bsd_destination(dest, "H" in flags)
        if network is None:
            continue
        routes.append(Route(network, gateway, iface, flags, neighbour=bool(_MAC.match(gateway))))
    return tuple(routes)


_IP_ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit",
                   "blackhole", "nat", "anycast"}


def parse_ip_route(text: str | None) -> tuple[Route, ...]:
    """Rows of Linux ``ip route`` (``ip -4 route``) that name a device."""
    routes = []
    for line in (text or "").splitlines():
        words = line.split()
        if words and words[0] in _IP_ROUTE_TYPES:
            kind, words = words[0], words[1:]
        else:
            kind = "unicast"
        if not words or kind not in ("unicast", "local"):
            continue
        dest = "0.0.0.0/0" if words[0] == "default" else words[0]
        try:
            network = ipaddress.IPv4Network(dest, strict=False)
        except ValueError:
            continue
        values: dict[str, str] = {}
        # "dev X" / "via Y" may sit anywhere after the destination.
        for i, w in enumerate(words[:-1]):
            if w in ("dev", "via"):
                values[w] = words[i + 1]
        if "dev" not in values:
            continue
        routes.append(Route(network, values.get("via"), values["dev"], kind))
    return tuple(routes)


def parse_routes(text: str | None) -> tuple[Route, ...]:
    """Either form, told apart by macOS's "Destination ... Gateway" header."""
    if text and re.search(r"^(Internet:|Destination\s+Gateway)", text, re.M):
        return parse_netstat_routes(text)
    return parse_ip_route(text)
