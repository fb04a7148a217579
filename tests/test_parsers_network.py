"""networksetup, ifconfig and ibverbs parsers on every real capture."""

from __future__ import annotations

from mlxcluster.facts.parsers.hardware_ports import (
    bridge_interface,
    parse_hardware_ports,
    thunderbolt_interfaces,
)
from mlxcluster.facts.parsers.ibv import parse_ibv_devices, parse_ibv_devinfo
from mlxcluster.facts.parsers.ifconfig import ipv4_addresses, parse_ifconfig


def read(fixtures, name):
    return (fixtures / name).read_text(encoding="utf-8")


NETWORKSETUP = {
    "networksetup_listallhardwareports_glpi_imac27_intel_2019_macos10.14.6.txt": {1: "en2", 2: "en3"},
    "networksetup_listallhardwareports_glpi_mbp16_apple_silicon_2021_macos14.4.txt": {1: "en1", 2: "en2", 3: "en3"},
    "networksetup_listallhardwareports_glpi_mbp16_intel_2019_catalina_4tb_trailing_space.txt": {1: "en1", 2: "en2", 3: "en3", 4: "en4"},
    "networksetup_listallhardwareports_glpi_mbp_m1pro_2021_macos14.5_lenovo_dock.txt": {1: "en1", 2: "en2", 3: "en3"},
    "networksetup_listallhardwareports_m4max_studio_macos26.6.2_tb_ethernet_slot.txt": {1: "en2", 2: "en3", 3: "en4", 4: "en5"},
    "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt": {1: "en1", 2: "en6", 3: "en2"},
}


def test_networksetup_thunderbolt_map_on_every_capture(macos_fixtures):
    for name, expected in NETWORKSETUP.items():
        ports = parse_hardware_ports(read(macos_fixtures, name))
        assert thunderbolt_interfaces(ports) == expected, name
        assert bridge_interface(ports) == "bridge0", name


def test_networksetup_details(macos_fixtures):
    studio = parse_hardware_ports(read(macos_fixtures, "networksetup_listallhardwareports_m4max_studio_macos26.6.2_tb_ethernet_slot.txt"))
    # "Thunderbolt Ethernet Slot 1" is a PCIe NIC, not receptacle 1.
    slot = next(p for p in studio if p.name == "Thunderbolt Ethernet Slot 1")
    assert slot.device == "en10" and slot.mac == "64:4b:f0:60:6b:96"
    intel = parse_hardware_ports(read(macos_fixtures, "networksetup_listallhardwareports_glpi_mbp16_intel_2019_catalina_4tb_trailing_space.txt"))
    tb4 = next(p for p in intel if p.name == "Thunderbolt 4")
    assert tb4.mac == "82:00:1c:a5:00:01"  # trailing space stripped
    assert [p.device for p in intel if p.name in ("iPhone USB", "USB 10/100/1000 LAN")] == ["en35", "en37"]
    dock = parse_hardware_ports(read(macos_fixtures, "networksetup_listallhardwareports_glpi_mbp_m1pro_2021_macos14.5_lenovo_dock.txt"))
    assert next(p.device for p in dock if p.name == "ThinkPad Lan") == "en8"
    osaurus = parse_hardware_ports(read(macos_fixtures, "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt"))
    assert len(osaurus) == 6 and osaurus[0].name == "Ethernet Adapter (en3)"


def test_ifconfig_bridge_members_and_addresses(macos_fixtures):
    ifs = parse_ifconfig(read(macos_fixtures, "ifconfig_a_glpi_mbp16_apple_silicon_2021_macos14.4_bridge0_en1_en2_en3.txt"))
    assert ifs["bridge0"].members == ("en1", "en2", "en3")
    assert ifs["en0"].inet == ("192.168.2.46/24",) and ifs["en0"].status == "active"
    assert ipv4_addresses(ifs["en0"]) == ("192.168.2.46",)
    assert "PROMISC" in ifs["en1"].flags and ifs["en1"].inet == ()
    assert ifs["lo0"].inet == ("127.0.0.1/8",) and ifs["lo0"].mtu == 16384
    assert ifs["stf0"].flags == () and ifs["utun2"].mtu == 2000
    assert len(ifs) == 19


def test_ifconfig_pasted_wrapped_lines(macos_fixtures):
    ifs = parse_ifconfig(read(macos_fixtures, "ifconfig_a_glpi_mbp_m1pro_2021_macos14.5_pasted_wrapped_lines_lenovo_dock.txt"))
    assert ifs["en1"].mtu == 1500  # "mtu 1500" wrapped onto its own line
    assert ifs["en1"].mac == "aa:aa:aa:aa:aa:bc"
    assert ifs["bridge0"].members == ("en1", "en2", "en3")
    assert ifs["en0"].inet == ()  # obfuscated "BB.CC.DD.AA" is not an address
    assert ifs["en8"].mac == "aa:aa:aa:aa:aa:da" and ifs["en8"].status == "inactive"


def test_ifconfig_single_interface_captures(macos_fixtures):
    tn = parse_ifconfig(read(macos_fixtures, "ifconfig_bridge0_apple_tn3205_members_en2_en3_en4_elided.txt"))
    assert tn["bridge0"].members == ("en2", "en3", "en4") and tn["bridge0"].status == "active"
    conf = parse_ifconfig(read(macos_fixtures, "ifconfig_bridge0_maccluster_configured_sanitized.txt"))
    assert conf["bridge0"].members == ("en1",) and conf["bridge0"].inet == ("10.42.0.1/24",)
    idle = parse_ifconfig(read(macos_fixtures, "ifconfig_bridge0_maccluster_inactive_sanitized.txt"))
    assert idle["bridge0"].members == () and not idle["bridge0"].up
    en2 = parse_ifconfig(read(macos_fixtures, "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt"))["en2"]
    assert en2.inet == ("169.254.205.255/16",) and en2.inet6 == ("fe80::1021:1bac:fe1:b5e3%en2",)


def test_ibv_devices(macos_fixtures):
    tn = parse_ibv_devices(read(macos_fixtures, "ibv_devices_apple_tn3205_m4pro_mini_3ports.txt"))
    assert [(d.name, d.guid, d.interface) for d in tn] == [
        ("rdma_en2", "e0c5797d9c8fac05", "en2"),
        ("rdma_en3", "e1c5797d9c8fac05", "en3"),
        ("rdma_en4", "e2c5797d9c8fac05", "en4"),
    ]
    peer = parse_ibv_devices(read(macos_fixtures, "ibv_devices_osaurus_m5max_mbp_peer_macos27.txt"))
    assert [d.name for d in peer] == ["rdma_en1", "rdma_en6", "rdma_en2"]  # tabs
    assert parse_ibv_devices(read(macos_fixtures, "ibv_devices_osaurus_rdma_disabled_header_only.txt")) == ()


def test_ibv_devinfo(macos_fixtures):
    down = parse_ibv_devinfo(read(macos_fixtures, "ibv_devinfo_osaurus_m5max_mbp_peer_macos27_port_down.txt"))
    assert [(d.name, d.transport, d.port_states, d.active) for d in down] == [
        ("rdma_en1", "Thunderbolt", ("PORT_DOWN",), False),
        ("rdma_en6", "Thunderbolt", ("PORT_DOWN",), False),
        ("rdma_en2", "Thunderbolt", ("PORT_DOWN",), False),
    ]
    tn = parse_ibv_devinfo(read(macos_fixtures, "ibv_devinfo_apple_tn3205_m4pro_mini_cluster_elided.txt"))
    assert [d.name for d in tn if d.active] == ["rdma_en2", "rdma_en3", "rdma_en4"]
    wrapped = parse_ibv_devinfo(read(macos_fixtures, "ibv_devinfo_v_apple_tn3205_rdma_en2_gid_table_elided.txt"))
    assert [(d.name, d.transport, d.active) for d in wrapped] == [("rdma_en2", "Thunderbolt", True)]
