"""JACCL readiness checks (rdma-enabled, rdma-ports-active, thunderbolt-ipv4)
on capture folders assembled from real captures, replayed as `doctor --from`."""

from __future__ import annotations

import copy

import mlxcluster.doctor.checks.jaccl  # noqa: F401  (registers the checks)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.checks.common import BAD
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import load_capture_dir
from tests.topology_helpers import OMLX, OSAURUS, make_capture_dir

IDS = ["rdma-enabled", "rdma-ports-active", "thunderbolt-ipv4"]
TN3205_DEVINFO = "ibv_devinfo_apple_tn3205_m4pro_mini_cluster_elided.txt"
OSAURUS_DEVINFO = "ibv_devinfo_osaurus_m5max_mbp_peer_macos27_port_down.txt"
ENABLED = "rdma_ctl_status_omlx_plus_enabled.txt"
DISABLED = "rdma_ctl_status_omlx_plus_disabled.txt"
RECOVERY_MSG = "rdma_ctl_status_omlx_plus_outside_recovery_os_message.txt"
GLPI_IFCONFIG = "ifconfig_a_glpi_mbp16_apple_silicon_2021_macos14.4_bridge0_en1_en2_en3.txt"
TN3205_IFCONFIG = "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt"


def run(captures, backend="jaccl"):
    ctx = CheckContext(captures=captures, backend=backend)
    return {r.id: r for r in run_checks(ctx, [REGISTRY[i] for i in IDS])}


def with_files(layout, **per_host):
    """A copy of ``layout`` with more capture files per host: host={file: fixture}."""
    out = copy.deepcopy(layout)
    for host, files in per_host.items():
        out[host].update(files)
    return out


def caps(fixtures, tmp_path, layout, edit=None):
    return load_capture_dir(make_capture_dir(fixtures, tmp_path / "cap", layout, edit))


def test_all_ids_registered():
    assert all(i in REGISTRY for i in IDS)


def test_rdma_off_on_one_mac_names_it_with_the_recovery_steps(macos_fixtures, tmp_path):
    layout = with_files(OSAURUS, local={C.RDMA_CTL: DISABLED},
                        peer={C.RDMA_CTL: ENABLED, C.IBV_DEVINFO: OSAURUS_DEVINFO})
    r = run(caps(macos_fixtures, tmp_path, layout))["rdma-enabled"]
    assert r.status == Status.FAIL
    assert r.hosts == {"local": BAD + "rdma_ctl status: disabled", "peer": "rdma_ctl status: enabled"}
    assert r.hint.startswith("RDMA is not confirmed on local; on each of them: shut it down")
    assert "run 'rdma_ctl enable', reboot" in r.hint


def test_rdma_ctl_message_falls_back_to_ibv_devices(macos_fixtures, tmp_path):
    # Exit 0 and "needs Recovery OS": not an answer. ibv_devices decides.
    layout = with_files(OSAURUS, local={C.RDMA_CTL: RECOVERY_MSG}, peer={C.RDMA_CTL: RECOVERY_MSG})
    r = run(caps(macos_fixtures, tmp_path, layout), "jaccl-ring")["rdma-enabled"]
    assert r.status == Status.FAIL
    assert r.hosts["local"] == BAD + ("rdma_ctl status said 'rdma_ctl: This tool needs to be executed from "
                                      "Recovery OS.', not 'enabled'")
    assert r.hosts["peer"].startswith("ibv_devices lists rdma_en1, rdma_en6, rdma_en2 (rdma_ctl said")


def test_rdma_enabled_everywhere_passes_and_other_backends_skip(macos_fixtures, tmp_path):
    layout = with_files(OMLX, mbp={C.RDMA_CTL: ENABLED}, studio={C.RDMA_CTL: ENABLED})
    c = caps(macos_fixtures, tmp_path, layout)
    assert run(c)["rdma-enabled"].status == Status.PASS
    ring = run(c, "ring")["rdma-enabled"]
    assert ring.status == Status.SKIP and ring.hosts["mbp"] == "rdma_ctl status: enabled"
    # Without rdma_ctl captures, ibv_devices still answers (older capture folders).
    old = run(caps(macos_fixtures, tmp_path / "old", OMLX))["rdma-enabled"]
    assert old.status == Status.PASS
    assert old.hosts["studio"] == "ibv_devices lists rdma_en2, rdma_en3, rdma_en4 (rdma_ctl status not captured)"


def test_port_down_device_on_the_cable_fails_naming_mac_and_port(macos_fixtures, tmp_path):
    # The osaurus peer: all three devices PORT_DOWN (its partner had RDMA off);
    # its cable to "local" is on Thunderbolt 2 = en6.
    layout = with_files(OSAURUS, peer={C.IBV_DEVINFO: OSAURUS_DEVINFO})
    r = run(caps(macos_fixtures, tmp_path, layout))["rdma-ports-active"]
    assert r.status == Status.FAIL
    assert r.hosts == {"local": "ibv_devinfo not captured",
                       "peer": BAD + "rdma_en6 (cable to local) PORT_DOWN"}
    assert "Couldn't allocate protection domain" in r.hint
    assert "on peer reseat the cable of en6 (to local)" in r.hint and "ibv_devinfo -d rdma_en6" in r.hint


def test_active_ports_pass_and_a_down_one_is_blamed(macos_fixtures, tmp_path):
    # Studio: TN3205's devices, all PORT_ACTIVE, cable on en3. MacBook Pro: the
    # osaurus devinfo, its cable on en1 which is PORT_DOWN there.
    layout = with_files(OMLX, studio={C.IBV_DEVINFO: TN3205_DEVINFO}, mbp={C.IBV_DEVINFO: OSAURUS_DEVINFO})
    r = run(caps(macos_fixtures, tmp_path, layout))["rdma-ports-active"]
    assert r.status == Status.FAIL
    assert r.hosts == {"mbp": BAD + "rdma_en1 (cable to studio) PORT_DOWN",
                       "studio": "rdma_en3 (cable to mbp) PORT_ACTIVE"}

    def plugged(host, file_name, text):  # the mbp's en1 cable seated: its port up, as TN3205 shows
        if host == "mbp" and file_name == C.IBV_DEVINFO:
            return text.replace("PORT_DOWN (1)", "PORT_ACTIVE (4)", 1)
        return text
    ok = run(caps(macos_fixtures, tmp_path / "ok", layout, plugged))["rdma-ports-active"]
    assert ok.status == Status.PASS
    assert ok.hosts["mbp"] == "rdma_en1 (cable to studio) PORT_ACTIVE"
    assert run(caps(macos_fixtures, tmp_path / "r", layout), "ring")["rdma-ports-active"].status == Status.SKIP


def test_no_ibv_devinfo_anywhere_skips(macos_fixtures, tmp_path):
    r = run(caps(macos_fixtures, tmp_path, OMLX))["rdma-ports-active"]
    assert r.status == Status.SKIP


def test_thunderbolt_port_without_ipv4_fails_with_the_plan_per_host(macos_fixtures, tmp_path):
    # mbp: the glpi MacBook Pro's ifconfig, en1 a bridge member with no inet.
    # studio: TN3205's self-assigned port, as en3 (where the studio's cable is).
    layout = with_files(OMLX, mbp={C.IFCONFIG: GLPI_IFCONFIG}, studio={C.IFCONFIG: TN3205_IFCONFIG})

    def on_en3(host, file_name, text):
        return text.replace("en2", "en3") if host == "studio" and file_name == C.IFCONFIG else text
    r = run(caps(macos_fixtures, tmp_path, layout, on_en3))["thunderbolt-ipv4"]
    assert r.status == Status.FAIL
    assert r.hosts == {"mbp": BAD + "en1 (cable to studio) has no IPv4 address",
                       "studio": "en3 (cable to mbp) 169.254.205.255"}
    assert "errno 22" in r.hint and "#3467" in r.hint
    assert ("on mbp: sudo ifconfig bridge0 down; sudo ifconfig en1 inet 192.168.0.1 netmask 255.255.255.252; "
            "sudo route change 192.168.0.2 -interface en1") in r.hint
    assert "on studio" not in r.hint


def test_thunderbolt_ipv4_passes_skips_and_warns(macos_fixtures, tmp_path):
    def linklocal(host, file_name, text):
        if file_name != C.IFCONFIG:
            return text
        return text.replace("en2", "en1" if host == "mbp" else "en3")
    both = with_files(OMLX, mbp={C.IFCONFIG: TN3205_IFCONFIG}, studio={C.IFCONFIG: TN3205_IFCONFIG})
    assert run(caps(macos_fixtures, tmp_path / "a", both, linklocal))["thunderbolt-ipv4"].status == Status.PASS
    assert run(caps(macos_fixtures, tmp_path / "b", OMLX))["thunderbolt-ipv4"].status == Status.SKIP
    half = with_files(OMLX, studio={C.IFCONFIG: TN3205_IFCONFIG})
    w = run(caps(macos_fixtures, tmp_path / "c", half, linklocal))["thunderbolt-ipv4"]
    assert w.status == Status.WARN and w.hosts["mbp"] == "en1 (cable to studio): ifconfig not captured"


def test_doctor_from_names_the_mac_port_and_fix(macos_fixtures, tmp_path):
    from click.testing import CliRunner

    from mlxcluster.cli import main

    layout = with_files(OSAURUS, local={C.RDMA_CTL: DISABLED},
                        peer={C.RDMA_CTL: ENABLED, C.IBV_DEVINFO: OSAURUS_DEVINFO})
    folder = make_capture_dir(macos_fixtures, tmp_path / "cap", layout)
    out = CliRunner().invoke(main, ["doctor", "--backend", "jaccl", "--from", str(folder)])
    assert out.exit_code == 1, out.output
    assert "local: ✗ rdma_ctl status: disabled" in out.output
    assert "peer: ✗ rdma_en6 (cable to local) PORT_DOWN" in out.output
    import json
    report = json.loads(CliRunner().invoke(main, ["doctor", "--backend", "jaccl", "--from", str(folder),
                                                  "--json"]).output)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["rdma-enabled"]["status"] == "fail" and by_id["rdma-ports-active"]["status"] == "fail"


def qp(captures, backend="jaccl", **options):
    ctx = CheckContext(captures=captures, backend=backend, options=options)
    return run_checks(ctx, [REGISTRY["jaccl-queue-pairs"]])[0]


def test_queue_pairs_of_the_real_tb5_pair(macos_fixtures, tmp_path):
    c = caps(macos_fixtures, tmp_path, OMLX)
    mesh = qp(c)
    assert mesh.status == Status.PASS
    assert mesh.hosts == {"mbp": "queue pairs per device: rdma_en1 1", "studio": "queue pairs per device: rdma_en3 1"}
    # jaccl-ring with two hosts: the left and the right neighbour are the same Mac,
    # so its one device carries a queue pair for each direction.
    assert qp(c, "jaccl-ring").hosts["mbp"] == "queue pairs per device: rdma_en1 2"
    assert qp(c, "ring").status == Status.SKIP


def test_queue_pair_arithmetic_from_mlx_jaccl():
    from mlxcluster.doctor.checks.jaccl import queue_pairs

    hosts = ["a", "b", "c", "d"]
    # A 4-host mesh, one cable per pair: one queue pair per device per run.
    rows = {h: {p: (f"rdma_to_{p}",) for p in hosts if p != h} for h in hosts}
    assert queue_pairs(rows, hosts, "jaccl")["a"] == {"rdma_to_b": 1, "rdma_to_c": 1, "rdma_to_d": 1}
    # The ring uses the neighbours only; two cables to a neighbour are two devices.
    rows["a"]["b"] = ("rdma_en1", "rdma_en2")
    assert queue_pairs(rows, hosts, "jaccl-ring")["a"] == {"rdma_en1": 1, "rdma_en2": 1, "rdma_to_d": 1}
    # One device named for every peer (a hostfile written by hand) carries them all.
    shared = {"a": {p: ("rdma_en2",) for p in hosts if p != "a"}}
    assert queue_pairs(shared, hosts, "jaccl")["a"] == {"rdma_en2": 3}


def test_a_hostfile_over_the_limit_warns(tmp_path):
    import json

    from mlxcluster.facts.capture import HostCapture

    n = 12
    hosts = []
    for i in range(n):
        row = [None if j == i else ("rdma_en2" if i == 0 else f"rdma_en{j + 3}") for j in range(n)]
        hosts.append({"ssh": f"m{i}", "ips": [f"10.0.0.{i + 1}"], "rdma": row})
    path = tmp_path / "hostfile.json"
    path.write_text(json.dumps({"backend": "jaccl", "hosts": hosts}))
    r = qp({f"m{i}": HostCapture(f"m{i}") for i in range(n)}, hostfile=str(path))
    assert r.status == Status.WARN
    assert r.hosts["m0"] == BAD.replace("✗", "!") + "queue pairs per device: rdma_en2 11"
    assert r.hosts["mesh"].endswith("12 hosts; MLX's JACCL mesh takes at most 8")
    assert "on m0 the plan (hostfile" in r.hint and "errno 16" in r.hint and "jaccl-ring" in r.hint


def test_topology_ties_each_thunderbolt_port_to_its_ipv4_and_port_state(macos_fixtures, tmp_path):
    from mlxcluster.topology.topology import build_topology

    layout = with_files(OSAURUS, peer={C.IFCONFIG: TN3205_IFCONFIG, C.IBV_DEVINFO: OSAURUS_DEVINFO})
    t = build_topology(caps(macos_fixtures, tmp_path, layout))
    ports = {p["interface"]: p for p in t.to_json()["hosts"]["peer"]["ports"]}
    # osaurus' Thunderbolt 3 is en2, where TN3205's capture has its self-assigned address.
    assert ports["en2"]["ipv4"] == ["169.254.205.255"] and ports["en2"]["rdma_active"] is False
    assert ports["en6"]["ipv4"] == [] and ports["en6"]["rdma_active"] is False
    local = t.to_json()["hosts"]["local"]["ports"]
    assert all(p["ipv4"] is None and p["rdma_active"] is None for p in local)


def test_garbled_captures_never_crash_a_check(macos_fixtures, tmp_path):
    """Every new capture of a real layout cut short or sprinkled with junk: the
    JACCL and route checks report, they never crash."""
    import random

    import mlxcluster.doctor.checks.routes  # noqa: F401
    from mlxcluster.facts.capture import HostCapture

    layout = with_files(OMLX, mbp={C.RDMA_CTL: RECOVERY_MSG, C.IBV_DEVINFO: OSAURUS_DEVINFO, C.IFCONFIG: GLPI_IFCONFIG,
                                   C.ROUTES: "netstat_rn_macos_clashx_tun_tailscale_utun3_tb_en7_linklocal.txt"},
                        studio={C.RDMA_CTL: ENABLED, C.IBV_DEVINFO: TN3205_DEVINFO, C.IFCONFIG: TN3205_IFCONFIG,
                                C.ROUTES: "netstat_rn_mac_studio_tailscale_utun4_vm_bridges_bridge0_en2_en7_INET_EXCERPT.txt"})
    base = caps(macos_fixtures, tmp_path, layout)
    ids = IDS + ["jaccl-queue-pairs", "data-ip-routes", "data-ip-kinds"]
    rng = random.Random(11)
    checked = 0
    for name in (C.RDMA_CTL, C.IBV_DEVINFO, C.IFCONFIG, C.ROUTES):
        text = base["mbp"].files[name]
        variants = [text[:cut] for cut in range(0, len(text), max(1, len(text) // 8))]
        for _ in range(6):
            chars = list(text)
            for _ in range(max(1, len(chars) // 25)):
                chars[rng.randrange(len(chars))] = rng.choice(' \t\n:/.#0123456789abcdefPORT_ACTIVEhca_id')
            variants.append("".join(chars))
        for variant in variants:
            captures = dict(base)
            captures["mbp"] = HostCapture("mbp", {**base["mbp"].files, name: variant})
            for backend in ("jaccl", "jaccl-ring", "ring"):
                ctx = CheckContext(captures=captures, backend=backend)
                results = run_checks(ctx, [REGISTRY[i] for i in ids])
                assert not [r for r in results if r.status == Status.CRASH], (name, variant[:80])
                checked += 1
    assert checked > 100


def test_with_a_hostfile_its_matrix_is_the_plan(macos_fixtures, tmp_path):
    import json

    layout = with_files(OSAURUS, peer={C.IBV_DEVINFO: OSAURUS_DEVINFO})
    c = caps(macos_fixtures, tmp_path, layout)
    path = tmp_path / "hostfile.json"
    path.write_text(json.dumps({"backend": "jaccl", "hosts": [
        {"ssh": "local", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en6"]},
        {"ssh": "peer", "ips": [], "rdma": ["rdma_en2", None]}]}))
    ctx = CheckContext(captures=c, backend="jaccl", options={"hostfile": str(path)})
    r = run_checks(ctx, [REGISTRY["rdma-ports-active"]])[0]
    assert r.status == Status.FAIL
    assert r.hosts["peer"] == BAD + "rdma_en2 (cable to local) PORT_DOWN"


def test_topology_text_shows_port_ipv4_and_state(macos_fixtures, tmp_path):
    from click.testing import CliRunner

    from mlxcluster.cli import main

    layout = with_files(OSAURUS, peer={C.IFCONFIG: TN3205_IFCONFIG, C.IBV_DEVINFO: OSAURUS_DEVINFO})
    folder = make_capture_dir(macos_fixtures, tmp_path / "cap", layout)
    out = CliRunner().invoke(main, ["topology", "--from", str(folder)]).output
    # peer's cable to local is on Thunderbolt 2 = en6: no address there, device down.
    assert "receptacle 2  en6    connected 80 Gb/s   -> MacBook Pro (Mac17,6)  ipv4: none  rdma_en6: PORT_DOWN" in out
