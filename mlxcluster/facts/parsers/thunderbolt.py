"""Parse ``system_profiler SPThunderboltDataType -json`` (and its plain-text form).

Each top-level item is one Thunderbolt/USB4 bus of this Mac: one receptacle
(``receptacle_1_tag.receptacle_id_key``; the receptacle number N is the port
networksetup calls "Thunderbolt N"). Devices cabled to the receptacle hang
below it in ``_items``, nested when daisy-chained behind a dock. A device
with a ``domain_uuid_key`` is another Mac (its domain is the far end's bus).

Traps handled (see ../shared/fixtures/macos/SOURCES.md): buses listed out of
order and with gaps; keys that come and go; ``Up to 120 Gb/s`` is an idle
receptacle's capability while ``80 Gb/s`` is a live link; a VM prints
``no_hardware``; non-ASCII service keys; older macOS prints ``... x1``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mlxcluster.facts.parsers.indented import Node, parse_outline

_SPEED = re.compile(r"^\s*(up to\s+)?([\d.]+)\s*gb/s", re.IGNORECASE)
_MAC_MODEL = re.compile(r"^(Mac|MacBook(Pro|Air)?|iMac(Pro)?|Macmini|MacPro)\d+,\d+$")
_BUS = re.compile(r"bus[_ ](\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class TbDevice:
    """Something cabled to a receptacle: a Mac (``uuid`` set), a dock, a drive."""

    name: str
    model: str | None  # device_name_key: "Mac17,6" for a Mac, product name otherwise
    vendor: str | None
    uuid: str | None  # the far Mac's domain UUID; None for non-Mac devices
    speed_gbps: float | None  # link speed of its upstream port, when shown
    children: tuple[TbDevice, ...] = ()

    @property
    def is_mac(self) -> bool:
        """A Mac has a domain UUID; without one, its model id ("Mac17,6") tells."""
        return self.uuid is not None or bool(self.model and _MAC_MODEL.match(self.model))


@dataclass(frozen=True)
class TbBus:
    """One Thunderbolt bus of this Mac, i.e. one receptacle."""

    bus: int | None
    host_name: str | None  # this Mac's marketing name ("Mac Studio")
    uuid: str | None  # this bus's domain UUID (what peers report)
    receptacle: int | None
    connected: bool
    speed_gbps: float | None  # live link speed; None when idle or unknown
    max_speed_gbps: float | None  # "Up to N Gb/s" capability of an idle port
    devices: tuple[TbDevice, ...] = ()


@dataclass(frozen=True)
class ThunderboltReport:
    """``state`` is "ok", "no_hardware" (a VM, an Intel Mac without TB) or "unknown"."""

    state: str
    buses: tuple[TbBus, ...] = ()


def parse_speed(text: object) -> tuple[float | None, float | None]:
    """Split a speed string into (link speed, capability) in Gb/s.

    ``"80 Gb/s"`` -> (80.0, None); ``"Up to 120 Gb/s"`` -> (None, 120.0);
    ``"Up to 40 Gb/s x1"`` -> (None, 40.0); anything else -> (None, None).
    """
    if not isinstance(text, str):
        return None, None
    m = _SPEED.match(text)
    if not m:
        return None, None
    value = float(m.group(2))
    return (None, value) if m.group(1) else (value, None)


def _str(value: object) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _int(value: object) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _dicts(value: object) -> list[dict]:
    """The objects of a JSON list (``_items``); anything else (a number, a string, an
    object where a list belongs) holds none."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _bus_number(name: object) -> int | None:
    m = _BUS.search(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


# ---- JSON form -----------------------------------------------------------


def _receptacle_tag(item: dict) -> dict:
    """The bus's own receptacle tag; the key is usually receptacle_1_tag."""
    tag = item.get("receptacle_1_tag")
    if isinstance(tag, dict):
        return tag
    for key, value in sorted(item.items()):
        if re.fullmatch(r"receptacle_\d+_tag", key) and isinstance(value, dict):
            return value
    return {}


def _json_device(item: dict) -> TbDevice:
    upstream = item.get("receptacle_upstream_ambiguous_tag")
    speed = parse_speed(upstream.get("current_speed_key"))[0] if isinstance(upstream, dict) else None
    children = tuple(_json_device(c) for c in _dicts(item.get("_items")))
    name = _str(item.get("_name")) or _str(item.get("device_name_key")) or "unknown"
    return TbDevice(
        name=name,
        model=_str(item.get("device_name_key")),
        vendor=_str(item.get("vendor_name_key")),
        uuid=_str(item.get("domain_uuid_key")),
        speed_gbps=speed,
        children=children,
    )


def _json_bus(item: dict) -> TbBus:
    tag = _receptacle_tag(item)
    speed, cap = parse_speed(tag.get("current_speed_key"))
    status = tag.get("receptacle_status_key")
    devices = tuple(_json_device(c) for c in _dicts(item.get("_items")))
    connected = status == "receptacle_connected" or (status is None and bool(devices))
    return TbBus(
        bus=_bus_number(item.get("_name")),
        host_name=_str(item.get("device_name_key")),
        uuid=_str(item.get("domain_uuid_key")),
        receptacle=_int(tag.get("receptacle_id_key")),
        connected=connected,
        speed_gbps=speed if connected else None,
        max_speed_gbps=cap,
        devices=devices,
    )


def parse_thunderbolt_json(text: str | None) -> ThunderboltReport:
    """Parse ``system_profiler SPThunderboltDataType -json`` output."""
    try:
        data = json.loads(text or "")
    except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
        return ThunderboltReport("unknown")
    items = data.get("SPThunderboltDataType") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return ThunderboltReport("unknown")
    if any(isinstance(i, dict) and "no_hardware" in i.values() for i in items):
        return ThunderboltReport("no_hardware")
    buses = []
    for item in items:
        # A bus entry has its own domain UUID or receptacle; skip anything else.
        if isinstance(item, dict) and ("domain_uuid_key" in item or _receptacle_tag(item)):
            buses.append(_json_bus(item))
    return ThunderboltReport("ok", tuple(buses))


# ---- plain-text form -----------------------------------------------------

# Section names that are structure, not devices.
_STRUCTURE = re.compile(r"^(port( \(upstream\))?|services|internet protocol|service)$", re.I)


def _is_device(node: Node) -> bool:
    return (
        not node.value
        and not _STRUCTURE.match(node.key)
        and (node.get("Vendor Name") is not None or node.get("Device Name") is not None)
    )


def _text_devices(node: Node) -> tuple[TbDevice, ...]:
    """Devices directly below ``node`` (looking through Port sections)."""
    found = []
    for child in node.children:
        if _is_device(child):
            found.append(_text_device(child))
        elif not child.value and child.key.lower().startswith("port"):
            found.extend(_text_devices(child))
    return tuple(found)


def _text_device(node: Node) -> TbDevice:
    upstream = node.find("Port (Upstream)")
    speed = parse_speed(upstream.get("Speed"))[0] if upstream else None
    return TbDevice(
        name=node.key or "unknown",
        model=_str(node.get("Device Name")),
        vendor=_str(node.get("Vendor Name")),
        uuid=_str(node.get("Domain UUID")),
        speed_gbps=speed,
        children=_text_devices(node),
    )


def _text_bus(node: Node) -> TbBus:
    port = node.find("Port") or Node("Port")
    speed, cap = parse_speed(port.get("Speed"))
    status = (port.get("Status") or "").lower()
    devices = _text_devices(node)
    connected = status == "device connected" or (not status and bool(devices))
    return TbBus(
        bus=_bus_number(node.key),
        host_name=_str(node.get("Device Name")),
        uuid=_str(node.get("Domain UUID")),
        receptacle=_int(port.get("Receptacle")),
        connected=connected,
        speed_gbps=speed if connected else None,
        max_speed_gbps=cap,
        devices=devices,
    )


def parse_thunderbolt_text(text: str | None) -> ThunderboltReport:
    """Parse plain ``system_profiler SPThunderboltDataType`` output (header optional)."""
    root = parse_outline(text or "")
    buses = [
        _text_bus(n)
        for n in root.walk()
        if not n.value and re.match(r"^thunderbolt(/usb4)? bus \d+$", n.key, re.I)
    ]
    if not buses:
        if "no_hardware" in (text or "") or "No Thunderbolt" in (text or ""):
            return ThunderboltReport("no_hardware")
        return ThunderboltReport("unknown")
    return ThunderboltReport("ok", tuple(buses))


def parse_thunderbolt(text: str | None) -> ThunderboltReport:
    """Parse either form: JSON when the text starts with ``{``, else plain text."""
    if (text or "").lstrip().startswith("{"):
        return parse_thunderbolt_json(text)
    return parse_thunderbolt_text(text)
