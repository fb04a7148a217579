"""`mlxcluster smoke --backend jaccl -i INVENTORY`: the JACCL plan from the
hosts' topology (real macOS captures), and "unavailable" with a reason per host."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import mlxcluster.smoke.run as smoke_run
from mlxcluster.cli import main
from mlxcluster.facts.capture import PROBE, HostCapture, load_capture_dir
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.jobs.hosts import hosts_from_inventory
from mlxcluster.smoke.jaccl import JacclUnavailable, plan_from_captures, run_jaccl
from mlxcluster.smoke.launch import WorkerOptions
from tests.fakes import FakeSsh
from tests.inventory_support import inventory_text
from tests.topology_helpers import (
    OMLX,
    OSAURUS,
    RecordingCollect,
    make_capture_dir,
    slow_osaurus,
    tb5_pair,
)


@pytest.fixture
def launched(monkeypatch):
    """The launch plans smoke would run (nothing is started)."""
    plans = []

    def fake_run_plan(plan, timeout_s=60.0, **kwargs):
        plans.append(plan)
        return smoke_run.SmokeReport(plan.backend, "passed", run_id=plan.run_id)

    monkeypatch.setattr(smoke_run, "run_plan", fake_run_plan)
    return plans


def test_the_tb5_pair_launches_what_hostfile_generate_writes(macos_fixtures, tmp_path, launched):
    """The two-Mac Thunderbolt 5 pair: smoke's hostfile is byte for byte the
    one `hostfile generate --backend jaccl --from DIR` writes from the same captures."""
    inv_path, captures_dir = tb5_pair(macos_fixtures, tmp_path)
    written = CliRunner().invoke(main, ["hostfile", "generate", "-i", str(inv_path), "--backend",
                                        "jaccl", "--from", str(captures_dir), "-o", "-"])
    assert written.exit_code == 0, written.output

    inventory = parse_inventory(inv_path.read_text(), str(inv_path))
    collect = RecordingCollect(load_capture_dir(captures_dir))
    report = run_jaccl(inventory, hosts_from_inventory(inventory), WorkerOptions(), collect=collect)
    assert collect.probed == [["mbp", "studio"]] and report.status == "passed"
    [plan] = launched
    assert plan.backend == "jaccl" and "--backend" in plan.argv
    assert plan.argv[plan.argv.index("--backend") + 1] == "jaccl"
    hostfile_path = plan.argv[plan.argv.index("--hostfile") + 1]
    assert plan.files[hostfile_path] == written.output
    rows = [h["rdma"] for h in json.loads(written.output)["hosts"]]
    assert rows == [[None, "rdma_en1"], ["rdma_en3", None]]


def test_rdma_off_on_one_host_is_unavailable_naming_it(macos_fixtures, tmp_path):
    captures = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "cap", OSAURUS))
    inventory = parse_inventory(inventory_text(["local", "peer"]))
    with pytest.raises(JacclUnavailable) as err:
        plan_from_captures(inventory, captures, hosts_from_inventory(inventory))
    assert err.value.reasons == {
        "local": "no rdma_* devices (ibv_devices lists none: RDMA is disabled)"}
    assert err.value.exit_code == 3 and "rdma_ctl enable" in err.value.hint


def test_tb4_cable_and_missing_pairs_are_named_per_host(macos_fixtures, tmp_path):
    slow = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "slow", OSAURUS,
                                             slow_osaurus))
    inventory = parse_inventory(inventory_text(["local", "peer"]))
    with pytest.raises(JacclUnavailable) as err:
        plan_from_captures(inventory, slow, hosts_from_inventory(inventory))
    assert err.value.reasons["peer"] == "no Thunderbolt link faster than 40 Gb/s (en6 -> local 40 Gb/s)"
    assert err.value.reasons["local"] == ("no rdma_* devices (ibv_devices lists none: RDMA is "
                                          "disabled); no Thunderbolt link faster than 40 Gb/s "
                                          "(en6 -> peer 40 Gb/s)")
    four = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "four",
                                             {**OMLX, **OSAURUS}))
    inventory = parse_inventory(inventory_text(["mbp", "studio", "local", "peer"]))
    with pytest.raises(JacclUnavailable) as err:
        plan_from_captures(inventory, four, hosts_from_inventory(inventory))
    assert err.value.reasons["mbp"] == ("no Thunderbolt cable to local, peer (JACCL needs one "
                                        "between every pair of hosts)")
    assert sorted(err.value.reasons) == ["local", "mbp", "peer", "studio"]


def linux_capture(name: str) -> HostCapture:
    """What the probe brings back from a Linux host (the lab's): no ibv_devices, no Thunderbolt."""
    probe = {"os": {"system": "Linux", "name": "Debian GNU/Linux"},
             "commands": {"ibv_devices": "absent"}}
    return HostCapture(name, {PROBE: json.dumps(probe)})


LINUX_REASON = ("runs Linux, not macOS (JACCL needs macOS 26.2 or later); no rdma_* devices "
                "(ibv_devices not found); no Thunderbolt link faster than 40 Gb/s (no "
                "Thunderbolt cable to another host)")


def test_linux_and_unreachable_hosts_each_get_their_reasons():
    names = ["labhost1", "labhost2", "labhost3"]
    inventory = parse_inventory(inventory_text(names))
    captures = {n: linux_capture(n) for n in names}
    captures["labhost3"] = HostCapture("labhost3", error="connect to 10.9.0.3:22 timed out")
    with pytest.raises(JacclUnavailable) as err:
        plan_from_captures(inventory, captures, hosts_from_inventory(inventory))
    assert err.value.reasons == {"labhost1": LINUX_REASON, "labhost2": LINUX_REASON,
                                 "labhost3": "not probed: connect to 10.9.0.3:22 timed out"}


def test_cli_without_rdma_exits_3_with_a_reason_per_host(macos_fixtures, tmp_path, hosts_run_by,
                                                          launched):
    """No --hostfile needed; nothing launched; text and --json both carry every host's reason
    (each host answering doctor's probe with real Macs' outputs: the one fake host)."""
    captures = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "cap", OSAURUS,
                                                 slow_osaurus))
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(inventory_text(["local", "peer"]))
    hosts_run_by(FakeSsh.probed(parse_inventory(inv_path.read_text()), captures))
    result = CliRunner().invoke(main, ["smoke", "--backend", "jaccl", "-i", str(inv_path)])
    assert result.exit_code == 3, result.output
    assert "2 of 2 host(s) cannot take part" in result.output
    assert "  peer: no Thunderbolt link faster than 40 Gb/s (en6 -> local 40 Gb/s)" in result.output
    assert "  local: no rdma_* devices (ibv_devices lists none: RDMA is disabled)" in result.output
    assert "fix: JACCL needs macOS 26.2+" in result.output
    assert "backend unavailable" in result.output and "Traceback" not in result.output
    as_json = CliRunner().invoke(main, ["smoke", "--backend", "jaccl", "-i", str(inv_path), "--json"])
    assert as_json.exit_code == 3
    report = json.loads(as_json.output)["backends"][0]
    assert report["status"] == "unavailable" and sorted(report["host_reasons"]) == ["local", "peer"]
    assert launched == []
