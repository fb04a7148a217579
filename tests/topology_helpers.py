"""Assemble capture directories (DIR/<host>/<capture file>) from the shared
real macOS captures, as ``doctor --collect`` would have written them, and the
edits that make other cabling of them (a slower cable, peers not recognised)."""

from __future__ import annotations

import json
from pathlib import Path

from mlxcluster.facts import capture as C
from tests.inventory_support import inventory_text

OMLX = {
    "mbp": {
        C.THUNDERBOLT: "sp_thunderbolt_omlx_m5max_macbookpro_tb5_to_studio.json",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt",
        C.IBV_DEVICES: "ibv_devices_osaurus_m5max_mbp_peer_macos27.txt",
        C.SW_VERS: "sw_vers_macos26.6.2_25G83.txt",
    },
    "studio": {
        C.THUNDERBOLT: "sp_thunderbolt_omlx_m3ultra_studio_tb5_to_macbookpro_plus_owc_drive.json",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_m4max_studio_macos26.6.2_tb_ethernet_slot.txt",
        C.IBV_DEVICES: "ibv_devices_apple_tn3205_m4pro_mini_3ports.txt",
        C.SW_VERS: "sw_vers_macos26.6.2_25G83.txt",
    },
}

OSAURUS = {
    "local": {
        C.THUNDERBOLT: "sp_thunderbolt_osaurus_m5max_mbp_local_macos27_rdma_off.json",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt",
        C.IBV_DEVICES: "ibv_devices_osaurus_rdma_disabled_header_only.txt",
    },
    "peer": {
        C.THUNDERBOLT: "sp_thunderbolt_osaurus_m5max_mbp_peer_macos27_rdma_on.json",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt",
        C.IBV_DEVICES: "ibv_devices_osaurus_m5max_mbp_peer_macos27.txt",
    },
}

# A Mac mini cabled at 40 Gb/s to a MacBook Pro, and a MacBook Pro cabled to
# two Mac minis: no domain UUIDs match between these captures.
MACCLUSTER = {
    "mbp": {
        C.THUNDERBOLT: "sp_thunderbolt_text_maccluster_mbp_to_two_m4pro_minis_macos27_abridged.txt",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_glpi_mbp16_apple_silicon_2021_macos14.4.txt",
        C.IFCONFIG: "ifconfig_a_glpi_mbp16_apple_silicon_2021_macos14.4_bridge0_en1_en2_en3.txt",
    },
    "mini": {
        C.THUNDERBOLT: "sp_thunderbolt_maccluster_m4pro_mini_macos27_mbp_and_studio_display.json",
        C.HARDWARE_PORTS: "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt",
        C.IFCONFIG: "ifconfig_bridge0_maccluster_inactive_sanitized.txt",
    },
}


def make_capture_dir(fixtures: Path, root: Path, layout: dict, edit=None) -> Path:
    """Write DIR/<host>/<file> from fixture names; ``edit(host, file, text)``
    may rewrite a capture (e.g. drop UUIDs) before it is written."""
    root.mkdir(parents=True, exist_ok=True)
    for host, files in layout.items():
        (root / host).mkdir(exist_ok=True)
        for file_name, fixture in files.items():
            text = (fixtures / fixture).read_text(encoding="utf-8")
            if edit is not None:
                text = edit(host, file_name, text)
            (root / host / file_name).write_text(text, encoding="utf-8")
    return root


def slow_osaurus(host: str, file_name: str, text: str) -> str:
    """The osaurus cable at TB4 speed (both ends report 40 Gb/s)."""
    if host in ("local", "peer") and file_name == C.THUNDERBOLT:
        return text.replace('"current_speed_key": "80 Gb/s",\n    "link_status_key": "0x2"',
                            '"current_speed_key": "40 Gb/s",\n    "link_status_key": "0x2"')
    return text


def drop_peer_uuids(host: str, file_name: str, text: str) -> str:
    """Remove the peer Macs' domain UUIDs (as if the far bus re-enumerated)."""
    if file_name != C.THUNDERBOLT:
        return text
    data = json.loads(text)
    for bus in data["SPThunderboltDataType"]:
        for item in bus.get("_items", []):
            item.pop("domain_uuid_key", None)
    return json.dumps(data)


def tb5_pair(fixtures: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The two-Mac Thunderbolt 5 pair (omlx captures): its inventory and capture directory."""
    captures_dir = make_capture_dir(fixtures, tmp_path / "cap", OMLX)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(inventory_text(["mbp", "studio"]))
    return inv_path, captures_dir


class RecordingCollect:
    """A stand-in for doctor_collect.collect_captures returning fixed captures
    and recording which hosts each call probed."""

    def __init__(self, captures: dict):
        self.captures = captures
        self.probed: list[list[str]] = []

    def __call__(self, inventory) -> dict:
        self.probed.append([h.name for h in inventory.hosts])
        return self.captures
