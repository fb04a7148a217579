"""Doctor topology checks on capture dirs assembled from real captures."""

from __future__ import annotations

import mlxcluster.doctor.checks.topology  # noqa: F401  (registers the checks)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.hostfile.hostfile_generate import generate_mlx_hostfile
from mlxcluster.inventory.inventory import parse_inventory
from tests.topology_helpers import MACCLUSTER, OMLX, OSAURUS, make_capture_dir, slow_osaurus

IDS = ["thunderbolt-links", "ring-or-mesh", "tb4-for-jaccl", "rdma-devices",
       "thunderbolt-bridge", "link-speeds-differ", "hostfile-matches-topology"]


def run(captures, backend=None, **options):
    ctx = CheckContext(captures=captures, backend=backend, options=options,
                       inventory=options.pop("inventory", None))
    return {r.id: r for r in run_checks(ctx, [REGISTRY[i] for i in IDS])}


def caps(fixtures, tmp_path, *layouts, edit=None):
    layout = {k: v for lay in layouts for k, v in lay.items()}
    return load_capture_dir(make_capture_dir(fixtures, tmp_path / "cap", layout, edit))


def test_all_ids_registered():
    assert all(i in REGISTRY for i in IDS)


def test_healthy_tb5_pair(macos_fixtures, tmp_path):
    r = run(caps(macos_fixtures, tmp_path, OMLX), backend="jaccl")
    assert {i: r[i].status for i in IDS} == {
        "thunderbolt-links": Status.PASS, "ring-or-mesh": Status.PASS,
        "tb4-for-jaccl": Status.PASS, "rdma-devices": Status.PASS,
        "thunderbolt-bridge": Status.SKIP, "link-speeds-differ": Status.PASS,
        "hostfile-matches-topology": Status.SKIP}
    assert r["thunderbolt-links"].hosts == {"mbp": "en1 -> studio 80 Gb/s", "studio": "en3 -> mbp 80 Gb/s"}
    assert r["ring-or-mesh"].hosts == {"ring": "mbp -> studio -> mbp", "full mesh": "yes"}
    assert r["rdma-devices"].hosts["studio"] == "rdma_en2, rdma_en3, rdma_en4"


def test_unmatched_macs_and_bridge(macos_fixtures, tmp_path):
    c = caps(macos_fixtures, tmp_path, MACCLUSTER)
    ring = run(c, backend="ring")
    assert ring["thunderbolt-links"].status == Status.WARN
    assert ring["thunderbolt-links"].hosts["mbp"] == (
        "en2 -> Mac mini (Mac16,11) not matched; en3 -> Mac mini (Mac16,11) not matched")
    assert ring["ring-or-mesh"].status == Status.WARN
    assert ring["ring-or-mesh"].hosts["mbp -> mini"] == "no cable"
    bridge = ring["thunderbolt-bridge"]
    assert bridge.status == Status.WARN
    assert bridge.hosts == {"mbp": "bridge0 holds en1, en2, en3",
                            "mini": "bridge0 holds no Thunderbolt port"}
    assert ("on mbp: sudo ifconfig bridge0 deletem en1; sudo ifconfig bridge0 deletem en2; "
            "sudo ifconfig bridge0 deletem en3; sudo ifconfig bridge0 down; "
            "sudo networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off") in bridge.hint
    jaccl = run(c, backend="jaccl")
    assert jaccl["thunderbolt-bridge"].status == Status.FAIL and "errno 22" in jaccl["thunderbolt-bridge"].hint
    assert jaccl["thunderbolt-links"].status == Status.FAIL
    assert jaccl["ring-or-mesh"].status == Status.FAIL


def test_rdma_disabled_on_one_host(macos_fixtures, tmp_path):
    r = run(caps(macos_fixtures, tmp_path, OSAURUS), backend="jaccl-ring")
    assert r["rdma-devices"].status == Status.FAIL
    assert r["rdma-devices"].hosts == {"local": "ibv_devices lists no device: RDMA is disabled",
                                       "peer": "rdma_en1, rdma_en2, rdma_en6"}
    assert "rdma_ctl enable" in r["rdma-devices"].hint
    assert run(caps(macos_fixtures, tmp_path / "b", OSAURUS))["rdma-devices"].status == Status.SKIP


def test_tb4_cable_slow_ring_and_missing_pairs(macos_fixtures, tmp_path):
    c = caps(macos_fixtures, tmp_path, OMLX, OSAURUS, edit=slow_osaurus)
    r = run(c, backend="jaccl-ring")
    assert r["tb4-for-jaccl"].status == Status.FAIL
    assert r["tb4-for-jaccl"].hosts == {"local en6 <-> peer en6": "40 Gb/s",
                                        "mbp en1 <-> studio en3": "80 Gb/s"}
    assert r["link-speeds-differ"].status == Status.WARN
    assert "slowest cable (40 Gb/s): local en6 <-> peer en6" in r["link-speeds-differ"].hint
    assert r["ring-or-mesh"].status == Status.FAIL
    assert r["ring-or-mesh"].hosts["local -> mbp"] == "no cable"
    assert r["ring-or-mesh"].hosts["ring"] == "none"
    # Not fatal for ring: TB4 is fine there.
    assert run(c, backend="ring")["tb4-for-jaccl"].status == Status.PASS


INVENTORY = """cluster: t
python: /usr/bin/python3
hosts:
  - {name: mbp, ssh: mbp.local, ips: [10.0.0.1]}
  - {name: studio, ssh: studio.local, ips: [10.0.0.2]}
"""


def renumber_studio(host, file_name, text):
    """After a reboot the studio's receptacle 2 came back as en7."""
    if host == "studio" and file_name == C.HARDWARE_PORTS:
        return text.replace("Hardware Port: Thunderbolt 2\nDevice: en3", "Hardware Port: Thunderbolt 2\nDevice: en7")
    return text


def test_hostfile_matches_then_renumbered(macos_fixtures, tmp_path):
    inv = parse_inventory(INVENTORY, "inv.yaml")
    from mlxcluster.topology.topology import build_topology
    before = caps(macos_fixtures, tmp_path / "before", OMLX)
    hf = generate_mlx_hostfile(inv, "jaccl", build_topology(before))
    path = tmp_path / "hostfile.json"
    path.write_text(hf.dumps())
    ok = run(before, backend="jaccl", hostfile=str(path), inventory=inv)["hostfile-matches-topology"]
    assert ok.status == Status.PASS
    after = caps(macos_fixtures, tmp_path / "after", OMLX, edit=renumber_studio)
    bad = run(after, backend="jaccl", hostfile=str(path), inventory=inv)["hostfile-matches-topology"]
    assert bad.status == Status.FAIL
    assert bad.hosts == {"studio.local -> mbp.local": "hostfile says rdma_en3, the cable is now on rdma_en7"}
    assert f"--backend jaccl --from DIR -o {path} --force" in bad.hint  # it replaces the stale file
    path.write_text("{broken")
    broken = run(after, hostfile=str(path))["hostfile-matches-topology"]
    assert broken.status == Status.FAIL and "not valid JSON" in broken.hosts["hostfile"]


def test_no_thunderbolt_data_skips(tmp_path):
    from mlxcluster.facts.capture import HostCapture
    r = run({"a": HostCapture("a"), "b": HostCapture("b")})
    assert r["thunderbolt-links"].status == Status.SKIP
    assert r["thunderbolt-links"].hosts == {"a": "thunderbolt: missing", "b": "thunderbolt: missing"}
    assert r["ring-or-mesh"].status == Status.SKIP
    assert not any(x.status == Status.CRASH for x in r.values())


def test_doctor_cli_compares_the_saved_hostfile(macos_fixtures, tmp_path):
    """`doctor --from DIR --hostfile F` runs the renumbering check end to end."""
    import json

    from click.testing import CliRunner

    from mlxcluster.cli import main
    from mlxcluster.topology.topology import build_topology

    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(INVENTORY)
    inv = parse_inventory(INVENTORY, str(inv_path))
    hf = generate_mlx_hostfile(inv, "jaccl", build_topology(caps(macos_fixtures, tmp_path / "b", OMLX)))
    path = tmp_path / "hostfile.json"
    path.write_text(hf.dumps())
    after = make_capture_dir(macos_fixtures, tmp_path / "after", OMLX, renumber_studio)
    result = CliRunner().invoke(main, ["doctor", "--from", str(after), "-i", str(inv_path),
                                       "--backend", "jaccl", "--hostfile", str(path), "--json"])
    checks = {c["id"]: c for c in json.loads(result.output)["checks"]}
    assert checks["hostfile-matches-topology"]["status"] == "fail"
    assert "rdma_en7" in checks["hostfile-matches-topology"]["hosts"]["studio.local -> mbp.local"]
    assert result.exit_code == 1
