"""data-ip-routes on real routing tables (macOS netstat, Linux ip route), replayed."""

from __future__ import annotations

import mlxcluster.doctor.checks.routes  # noqa: F401  (registers the check)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.checks.common import BAD
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import HostCapture
from tests.inventory_support import inventory_with_ips

CLASHX = "netstat_rn_macos_clashx_tun_tailscale_utun3_tb_en7_linklocal.txt"
STUDIO = "netstat_rn_mac_studio_tailscale_utun4_vm_bridges_bridge0_en2_en7_INET_EXCERPT.txt"
LINUX = "ip_route_linux_dev_box_debian_eth0_bridge.txt"


def run(captures, inv=None, backend=None):
    ctx = CheckContext(captures=captures, inventory=inv, backend=backend)
    return run_checks(ctx, [REGISTRY["data-ip-routes"]])[0]


def routes(fixtures, name):
    return {C.ROUTES: (fixtures / name).read_text(encoding="utf-8")}


def test_linklocal_claimed_by_wifi_and_thunderbolt_fails_with_both_routes(macos_fixtures):
    # The ClashX Mac: 169.254/16 on en1 (Wi-Fi, unscoped) and on en7 (scoped).
    # Its own 169.254.92.128 and the peer's 169.254.89.170 are both ambiguous.
    caps = {"mac": HostCapture("mac", routes(macos_fixtures, CLASHX)), "peer": HostCapture("peer")}
    r = run(caps, inventory_with_ips(mac=["169.254.92.128"], peer=["169.254.89.170"]))
    assert r.status == Status.FAIL
    assert r.hosts["mac"] == BAD + (
        "169.254.92.128: claimed by 2 interfaces: 169.254.0.0/16 on en1 and 169.254.0.0/16 on en7 (scoped); "
        "169.254.89.170 (peer): claimed by 2 interfaces: 169.254.0.0/16 on en1 and 169.254.0.0/16 on en7 (scoped)")
    assert r.hosts["peer"] == "routes not captured"
    assert "Disconnect the VPN" in r.hint and r.hint.startswith("on mac:")


def test_vpn_that_takes_all_of_ipv4_captures_a_peer(macos_fixtures):
    # ClashX's utun10 holds 1/8 ... 128/1 (all of IPv4 but 0/8): a peer at
    # 10.0.0.2 with no direct route goes into the tunnel.
    caps = {"mac": HostCapture("mac", routes(macos_fixtures, CLASHX))}
    r = run(caps, inventory_with_ips(mac=["192.168.31.166"], peer=["10.0.0.2"]), backend="ring")
    assert r.status == Status.FAIL
    assert r.hosts["mac"] == BAD + "10.0.0.2 (peer): goes into the VPN/overlay route 8.0.0.0/5 gw 198.18.0.1 on utun10"


def test_tailscale_range_and_direct_lan(macos_fixtures):
    caps = {"studio": HostCapture("studio", routes(macos_fixtures, STUDIO))}
    bad = run(caps, inventory_with_ips(studio=["192.168.68.52"], tsnode=["100.101.5.9"]), backend="mpi")
    assert bad.status == Status.FAIL
    assert bad.hosts["studio"] == BAD + "100.101.5.9 (tsnode): goes into the VPN/overlay route 100.64.0.0/10 on utun4"
    good = run(caps, inventory_with_ips(studio=["192.168.68.52"], peer=["192.168.68.60"]))
    assert good.status == Status.PASS
    assert good.hosts["studio"] == "2 data IPs (the inventory's ips) routed directly"


def test_linux_routes_pass_and_a_stray_wide_route_fails(macos_fixtures):
    text = (macos_fixtures / LINUX).read_text()
    caps = {"box": HostCapture("box", {C.ROUTES: text})}
    inv = inventory_with_ips(box=["192.0.2.2"], other=["192.0.2.7"])
    assert run(caps, inv).status == Status.PASS
    stray = {"box": HostCapture("box", {C.ROUTES: text + "192.0.0.0/8 dev dummy0 scope link \n"})}
    r = run(stray, inv)
    assert r.status == Status.FAIL
    assert "192.0.2.7 (other): claimed by 2 interfaces: 192.0.2.0/24 on eth0 and 192.0.0.0/8 on dummy0" in r.hosts["box"]


def test_no_routes_or_no_ips_skip(macos_fixtures):
    assert run({"a": HostCapture("a")}, inventory_with_ips(a=["10.0.0.1"])).status == Status.SKIP
    assert run({"a": HostCapture("a", routes(macos_fixtures, STUDIO))}).status == Status.SKIP


def test_garbled_routes_never_crash(macos_fixtures):
    import random

    text = (macos_fixtures / CLASHX).read_text()
    rng = random.Random(7)
    inv = inventory_with_ips(mac=["169.254.92.128"], peer=["10.0.0.2"])
    for _ in range(60):
        chars = list(text)
        for _ in range(len(chars) // 30):
            chars[rng.randrange(len(chars))] = rng.choice(" /.\n:#0123456789abcdefUHGSLI")
        r = run({"mac": HostCapture("mac", {C.ROUTES: "".join(chars)})}, inv)
        assert r.status in (Status.PASS, Status.FAIL)


GLPI_IFCONFIG = "ifconfig_a_glpi_mbp16_apple_silicon_2021_macos14.4_bridge0_en1_en2_en3.txt"
GLPI_PORTS = "networksetup_listallhardwareports_glpi_mbp16_apple_silicon_2021_macos14.4.txt"
TN3205_IFCONFIG = "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt"
OSAURUS_PORTS = "networksetup_listallhardwareports_osaurus_m5max_mbp_macos27.txt"


def kinds(captures, inv, backend="ring"):
    ctx = CheckContext(captures=captures, inventory=inv, backend=backend)
    return run_checks(ctx, [REGISTRY["data-ip-kinds"]])[0]


def files(fixtures, **names):
    return {key: (fixtures / name).read_text(encoding="utf-8") for key, name in names.items()}


def test_wifi_and_thunderbolt_data_ips_mixed_warn_with_the_cost(macos_fixtures):
    # The glpi MacBook Pro's address is on en0 = "Wi-Fi"; the TN3205 Mac mini's
    # self-assigned one on en2 = "Thunderbolt 3" (osaurus' port list has en2 so).
    caps = {"mbp": HostCapture("mbp", files(macos_fixtures, **{C.IFCONFIG: GLPI_IFCONFIG, C.HARDWARE_PORTS: GLPI_PORTS})),
            "mini": HostCapture("mini", files(macos_fixtures, **{C.IFCONFIG: TN3205_IFCONFIG,
                                                                 C.HARDWARE_PORTS: OSAURUS_PORTS}))}
    inv = inventory_with_ips(mbp=["192.168.2.46"], mini=["169.254.205.255"])
    r = kinds(caps, inv)
    assert r.status == Status.WARN
    assert r.hosts == {"mbp": "! 192.168.2.46 on en0 (Wi-Fi, speed unknown); 192.168.2.46 is on Wi-Fi",
                       "mini": "169.254.205.255 on en2 (Thunderbolt, speed unknown)"}
    assert "the data IPs mix Thunderbolt (mini) and Wi-Fi (mbp)" in r.hint
    assert "data travels over Wi-Fi on mbp" in r.hint
    assert "25.4 tok/s" in r.hint and "274 s" in r.hint and "#2309" in r.hint
    assert kinds(caps, inv, "jaccl").status == Status.SKIP
    assert kinds(caps, inv, "mpi").status == Status.WARN


def test_all_thunderbolt_passes(macos_fixtures):
    one = files(macos_fixtures, **{C.IFCONFIG: TN3205_IFCONFIG, C.HARDWARE_PORTS: OSAURUS_PORTS})
    caps = {"a": HostCapture("a", one), "b": HostCapture("b", one)}
    r = kinds(caps, inventory_with_ips(a=["169.254.205.255"], b=["169.254.205.255"]))
    assert r.status == Status.PASS
    assert kinds({"a": HostCapture("a")}, inventory_with_ips(a=["10.0.0.1"])).status == Status.SKIP
