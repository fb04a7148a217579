"""Pure parts of discovery: joining DNS-SD records, inventory rendering."""

from __future__ import annotations

from mlxcluster.discovery import (
    DEVICE_INFO_SERVICE,
    SSH_SERVICE,
    ServiceRecord,
    inventory_name,
    merge_records,
    render_inventory,
)
from mlxcluster.inventory import parse_inventory


def records():
    return [
        ServiceRecord(SSH_SERVICE, "Studio 1", "studio-1.local.", ("fe80::1", "192.168.1.21"), 22),
        ServiceRecord(DEVICE_INFO_SERVICE, "Studio 1", "studio-1.local.", ("192.168.1.21",), 0,
                      {"model": "Mac15,14"}),
        ServiceRecord(DEVICE_INFO_SERVICE, "Air", "air.local.", ("192.168.1.40",), 0,
                      {"model": "Mac14,2"}),
        ServiceRecord(SSH_SERVICE, "mini", "mini.local.", ("192.168.1.30",), 2222),
    ]


def test_records_of_one_machine_are_joined():
    hosts = merge_records(records())
    assert [h.name for h in hosts] == ["Air", "mini", "Studio 1"]
    studio = hosts[2]
    assert studio.model == "Mac15,14" and studio.ssh_port == 22 and studio.is_mac
    assert studio.addresses == ("192.168.1.21", "fe80::1")  # IPv4 first
    assert studio.ssh_target == "studio-1.local"
    air = hosts[0]
    assert air.ssh_port is None and air.is_mac
    assert hosts[1].model is None and not hosts[1].is_mac


def test_rendered_inventory_loads_and_skips_hosts_without_ssh():
    text = render_inventory(merge_records(records()), cluster="home", python="/opt/v/bin/python",
                            user="me")
    inv = parse_inventory(text)
    assert inv.names == ["mini", "Studio-1"]
    assert inv.host("mini").port == 2222 and inv.host("mini").ips == ("192.168.1.30",)
    assert inv.host("Studio-1").ips == ("192.168.1.21",)


def test_inventory_names_are_safe_and_unique():
    assert inventory_name("Rick's M4 Max Studio") == "Rick-s-M4-Max-Studio"
    assert inventory_name("$(reboot)") == "reboot"
    twins = merge_records([
        ServiceRecord(SSH_SERVICE, "a b", "x.local.", ("10.0.0.1",), 22),
        ServiceRecord(SSH_SERVICE, "a-b", "y.local.", ("10.0.0.2",), 22),
    ])
    inv = parse_inventory(render_inventory(twins, cluster="c", python="/p"))
    assert sorted(inv.names) == ["a-b", "a-b-2"]
