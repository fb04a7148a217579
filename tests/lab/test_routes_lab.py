"""data-ip-routes on the real Linux lab: the probe collects `ip route` on each
host, and a stray on-link route that claims the data IPs fails naming the host
and both routes; a healthy lab passes, live and replayed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.checks.common import BAD
from mlxcluster.doctor.doctor import run_doctor
from mlxcluster.inventory.inventory import load_inventory

pytestmark = pytest.mark.lab


def routes_check(report):
    return next(r for r in report.results if r.id == "data-ip-routes")


def test_a_stray_route_that_claims_the_data_ips_fails_on_its_host(make_lab, tmp_path):
    lab = make_lab(2)
    inv_path = tmp_path / "lab.yaml"
    lab.write_inventory(inv_path)
    inventory = load_inventory(inv_path)
    healthy = routes_check(run_doctor(inventory, connect_timeout=2.0, command_timeout=30))
    assert healthy.status == Status.PASS, healthy.hosts
    assert healthy.hosts["labhost1"] == "2 data IPs (the inventory's ips) routed directly"
    # A second interface on labhost1 with an on-link 10.0.0.0/8: the lab's
    # 10.77.K.0/24 data IPs are now claimed by eth0 and by stray0.
    for cmd in (["ip", "link", "add", "stray0", "type", "bridge"], ["ip", "link", "set", "stray0", "up"],
                ["ip", "route", "add", "10.0.0.0/8", "dev", "stray0"]):
        lab.netns_exec("labhost1", cmd)
    r = routes_check(run_doctor(inventory, connect_timeout=2.0, command_timeout=30))
    assert r.status == Status.FAIL
    assert r.hosts["labhost1"].startswith(BAD)
    subnet = lab.hosts[1].ip.rsplit(".", 1)[0] + ".0/24"
    assert (f"{lab.hosts[1].ip} (labhost2): claimed by 2 interfaces: {subnet} on eth0 and "
            "10.0.0.0/8 on stray0") in r.hosts["labhost1"]
    assert not r.hosts["labhost2"].startswith(BAD)
    # The same verdict from the collected routes.txt, replayed.
    collect = tmp_path / "cap"
    CliRunner().invoke(main, ["doctor", "-i", str(inv_path), "--collect", str(collect)])
    assert "10.0.0.0/8 dev stray0" in (collect / "labhost1" / "routes.txt").read_text()
    replay = CliRunner().invoke(main, ["doctor", "--from", str(collect), "-i", str(inv_path)])
    assert "claimed by 2 interfaces" in replay.output and replay.exit_code == 1


def test_a_data_ip_not_on_the_hosts_fastest_interface_warns(make_lab, tmp_path):
    lab = make_lab(2)
    # labhost1's data IP sits on a second interface (a bridge: no link speed)
    # while eth0, its 10 Gb/s veth, carries the lab address.
    for cmd in (["ip", "link", "add", "stray0", "type", "bridge"],
                ["ip", "addr", "add", "10.98.0.1/24", "dev", "stray0"], ["ip", "link", "set", "stray0", "up"]):
        lab.netns_exec("labhost1", cmd)
    inv_path = tmp_path / "lab.yaml"
    lab.write_inventory(inv_path)
    text = inv_path.read_text().replace(f"ips: [{lab.hosts[0].ip}]", "ips: [10.98.0.1]")
    assert "10.98.0.1" in text
    inv_path.write_text(text)
    report = run_doctor(load_inventory(inv_path), connect_timeout=2.0, command_timeout=30, data_path=False)
    r = next(x for x in report.results if x.id == "data-ip-kinds")
    assert r.status == Status.WARN
    assert r.hosts["labhost1"] == (f"! 10.98.0.1 on stray0 (LAN, speed unknown); eth0 (LAN, 10 Gb/s) has "
                                   f"{lab.hosts[0].ip} and is faster")
    assert r.hosts["labhost2"] == f"{lab.hosts[1].ip} on eth0 (LAN, 10 Gb/s)"
    assert "not on their host's fastest interface" in r.hint
