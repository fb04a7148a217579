"""Parse ``ibv_devices`` and ``ibv_devinfo`` (RDMA over Thunderbolt, macOS 26.2+).

``ibv_devices`` prints a header and one ``rdma_enX  GUID`` row per device; a
Mac with RDMA disabled prints the header only. ``rdma_enX`` names the
Thunderbolt interface enX it runs over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STATE = re.compile(r"state:\s*(PORT_\w+)")
_TRANSPORT = re.compile(r"transport:\s*([^\n(]+?)\s*(\(\d+\))?\s*(node_guid:|\n|$)")


@dataclass(frozen=True)
class IbvDevice:
    name: str  # "rdma_en2"
    guid: str | None = None

    @property
    def interface(self) -> str | None:
        """The network interface the device runs over ("en2"), if named so."""
        return self.name[5:] if self.name.startswith("rdma_") else None


@dataclass(frozen=True)
class IbvDeviceInfo:
    name: str
    transport: str | None
    port_states: tuple[str, ...]  # "PORT_ACTIVE", "PORT_DOWN"... one per port shown

    @property
    def active(self) -> bool:
        return "PORT_ACTIVE" in self.port_states


def parse_ibv_devices(text: str | None) -> tuple[IbvDevice, ...]:
    """Device rows of ``ibv_devices``; header lines and junk are skipped."""
    devices = []
    for line in (text or "").splitlines():
        words = line.split()
        if not words or words[0] in ("device", "------") or set(words[0]) == {"-"}:
            continue
        # Device names are identifiers; anything else is noise from a damaged capture.
        if re.fullmatch(r"[A-Za-z][\w.-]*", words[0]):
            guid = words[1] if len(words) > 1 and re.fullmatch(r"[0-9a-fA-F:]+", words[1]) else None
            devices.append(IbvDevice(words[0], guid))
    return tuple(devices)


def parse_ibv_devinfo(text: str | None) -> tuple[IbvDeviceInfo, ...]:
    """One entry per ``hca_id:`` block (also when the doc wrapped the lines)."""
    result = []
    chunks = re.split(r"hca_id:", text or "")
    for chunk in chunks[1:]:
        words = chunk.split()
        if not words:
            continue
        m = _TRANSPORT.search(chunk)
        result.append(
            IbvDeviceInfo(
                name=words[0],
                transport=m.group(1).strip() if m else None,
                port_states=tuple(_STATE.findall(chunk)),
            )
        )
    return tuple(result)
