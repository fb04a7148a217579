"""rdma_ctl status and the IPv4 routing tables, parsed from real captures."""

from __future__ import annotations

import ipaddress

from mlxcluster.facts.parsers.rdma_ctl import DISABLED, ENABLED, UNKNOWN, parse_rdma_ctl_status
from mlxcluster.facts.parsers.routes import bsd_destination, parse_ip_route, parse_routes


def read(fixtures, name):
    return (fixtures / name).read_text(encoding="utf-8")


def test_rdma_ctl_status_words(macos_fixtures):
    on = parse_rdma_ctl_status(read(macos_fixtures, "rdma_ctl_status_omlx_plus_enabled.txt"))
    assert (on.state, on.enabled, on.said) == (ENABLED, True, "enabled")
    off = parse_rdma_ctl_status(read(macos_fixtures, "rdma_ctl_status_omlx_plus_disabled.txt"))
    assert (off.state, off.enabled) == (DISABLED, False)


def test_rdma_ctl_message_is_not_an_answer(macos_fixtures):
    # Exit 0 and a message: neither on nor off, and what it said is kept for the report.
    msg = parse_rdma_ctl_status(read(macos_fixtures, "rdma_ctl_status_omlx_plus_outside_recovery_os_message.txt"))
    assert msg.state == UNKNOWN and not msg.enabled
    assert msg.said == "rdma_ctl: This tool needs to be executed from Recovery OS."
    assert parse_rdma_ctl_status("").state == UNKNOWN
    assert parse_rdma_ctl_status(None).said == ""
    # "enabled" inside a sentence is not the answer.
    assert parse_rdma_ctl_status("RDMA enabled, Thunderbolt 5 interface active").state == UNKNOWN


def net(text):
    return ipaddress.IPv4Network(text)


def test_bsd_abbreviated_destinations():
    assert bsd_destination("127", host=False) == net("127.0.0.0/8")
    assert bsd_destination("169.254", host=False) == net("169.254.0.0/16")
    assert bsd_destination("192.168.31", host=False) == net("192.168.31.0/24")
    assert bsd_destination("10.37.129/24", host=False) == net("10.37.129.0/24")
    assert bsd_destination("2/7", host=False) == net("2.0.0.0/7")
    assert bsd_destination("100.64/10", host=False) == net("100.64.0.0/10")
    assert bsd_destination("default", host=False) == net("0.0.0.0/0")
    assert bsd_destination("100.124.11.45", host=True) == net("100.124.11.45/32")
    assert bsd_destination("fe80::%lo0/64", host=False) is None
    assert bsd_destination("10/33", host=False) is None


def test_macos_table_with_a_tun_vpn_tailscale_and_two_linklocal_claims(macos_fixtures):
    routes = parse_routes(read(macos_fixtures, "netstat_rn_macos_clashx_tun_tailscale_utun3_tb_en7_linklocal.txt"))
    assert len(routes) == 46  # every row of the Internet part
    by = {(str(r.network), r.interface): r for r in routes}
    assert by[("100.64.0.0/10", "utun3")].gateway == "link#28"
    assert by[("128.0.0.0/1", "utun10")].gateway == "198.18.0.1"
    linklocal = [r for r in routes if r.network == net("169.254.0.0/16")]
    assert [(r.interface, r.scoped) for r in linklocal] == [("en1", False), ("en7", True)]
    neighbours = [r for r in routes if r.neighbour]
    assert by[("169.254.89.170/32", "en7")].neighbour and len(neighbours) == 17
    assert sum(r.default for r in routes) == 2


def test_macos_inet_part_with_trailing_spaces(macos_fixtures):
    routes = parse_routes(read(
        macos_fixtures, "netstat_rn_mac_studio_tailscale_utun4_vm_bridges_bridge0_en2_en7_INET_EXCERPT.txt"))
    by = {(str(r.network), r.interface) for r in routes}
    assert ("192.168.68.0/22", "en1") in by and ("10.211.55.0/24", "bridge100") in by
    assert ("100.64.0.0/10", "utun4") in by
    # The Internet6 part of a full `netstat -rn` is not read as IPv4.
    assert parse_routes(read(macos_fixtures, "netstat_rn_mac_studio_tailscale_utun4_vm_bridges_bridge0_en2_en7_INET_EXCERPT.txt")
                        + "\nInternet6:\nDestination Gateway Flags Netif Expire\ndefault fe80::%utun0 UGcIg utun0\n") == routes


def test_linux_ip_route(macos_fixtures):
    routes = parse_routes(read(macos_fixtures, "ip_route_linux_dev_box_debian_eth0_bridge.txt"))
    assert [(str(r.network), r.gateway, r.interface) for r in routes] == [
        ("0.0.0.0/0", "192.0.2.1", "eth0"), ("10.77.215.0/24", None, "mlxc0c46br"),
        ("192.0.2.0/24", None, "eth0")]
    # Types without a device to send on are not routes a data IP can take.
    assert parse_ip_route("blackhole 10.0.0.0/8\nunreachable 10.1.0.0/16\nlocal 10.2.0.1 dev lo scope host\n") == (
        parse_ip_route("local 10.2.0.1 dev lo scope host"))
