"""The thunderbolt-ipv4 fix: the IP plan of `hostfile generate --plan-ips`
set with `sudo -n` on both ends of a cable with an end without IPv4, built
from real captured macOS outputs (tests/fixtures/macos: system_profiler,
networksetup -listallhardwareports, ifconfig) and applied through a recording
runner; where sudo wants a password nothing runs on that host and the
commands are given to run by hand. Never run on a Mac here."""

from __future__ import annotations

import copy

import mlxcluster.doctor.checks.jaccl  # noqa: F401  (registers the checks)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.hostfile.ipplan import plan_ips
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.topology.topology import build_topology
from tests.fakes import SUDO_WANTS_PASSWORD, FakeSsh
from tests.fix_support import (
    GLPI_IFCONFIG,
    MBP,
    MBP_COMMANDS,
    MBP_UNDO,
    STUDIO,
    STUDIO_COMMANDS,
    STUDIO_UNDO,
    TN3205_IFCONFIG,
)
from tests.inventory_support import inventory_text
from tests.topology_helpers import OMLX, make_capture_dir


def captures(macos_fixtures, tmp_path, studio_ifconfig=TN3205_IFCONFIG):
    layout = copy.deepcopy(OMLX)
    layout["mbp"][C.IFCONFIG] = GLPI_IFCONFIG
    layout["studio"][C.IFCONFIG] = studio_ifconfig

    def on_en3(host, file_name, text):
        return text.replace("en2", "en3") if host == "studio" and file_name == C.IFCONFIG else text
    return load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "cap", layout, on_en3))


def planned(caps):
    inventory = parse_inventory(inventory_text(["mbp", "studio"]))
    spec = REGISTRY["thunderbolt-ipv4"]
    [result] = run_checks(CheckContext(captures=caps, inventory=inventory, backend="jaccl"), [spec])
    return result, build_plan([result], [spec], inventory)


def test_both_ends_of_the_bare_cable_get_the_plan_with_sudo_n(macos_fixtures, tmp_path):
    caps = captures(macos_fixtures, tmp_path)
    result, plan = planned(caps)
    assert result.status is Status.FAIL and result.hosts["mbp"].startswith("✗ en1 (cable to studio) has no IPv4")
    mbp, studio = plan.actions
    assert (mbp.hosts, studio.hosts) == (("mbp",), ("studio",)) and plan.left == []
    assert mbp.commands == MBP_COMMANDS and studio.commands == STUDIO_COMMANDS
    # The same commands `hostfile generate --plan-ips --apply` runs on mbp (it has a bridge0).
    assert mbp.commands == plan_ips(build_topology(caps)).commands("mbp", sudo="sudo -n")
    assert all(a.sudo and a.kind == "remote" for a in plan.actions)
    assert all(c.startswith("sudo -n ") for a in plan.actions for c in a.commands + a.params["undo"])
    assert mbp.params["undo"] == MBP_UNDO and studio.params["undo"] == STUDIO_UNDO
    assert (mbp.params["ssh"], studio.params["ssh"]) == (MBP, STUDIO)
    assert mbp.what == "the IP plan of hostfile --plan-ips on mbp: en1 192.168.0.1/30 (to 192.168.0.2); bridge0 down"


def test_applied_host_by_host_in_order_then_undone_last_first(macos_fixtures, tmp_path):
    _, plan = planned(captures(macos_fixtures, tmp_path))
    runner = FakeSsh()
    journal = Journal.create(fixes_dir(), None)
    entries = apply_plan(plan, journal, ApplyContext(runner))
    assert [e["status"] for e in entries] == ["applied", "applied"]
    assert runner.calls == ([(MBP, "sudo -n true")] + [(MBP, c) for c in MBP_COMMANDS]
                            + [(STUDIO, "sudo -n true")] + [(STUDIO, c) for c in STUDIO_COMMANDS])
    undo = FakeSsh()
    done = undo_journal(read_journal(journal.path), lambda: undo)
    assert [s for _, s, _ in done] == ["restored", "restored"]
    assert undo.calls == [(STUDIO, c) for c in STUDIO_UNDO] + [(MBP, c) for c in MBP_UNDO]


def test_where_sudo_wants_a_password_nothing_changes_there_and_the_commands_are_given(macos_fixtures, tmp_path):
    _, plan = planned(captures(macos_fixtures, tmp_path))
    runner = FakeSsh({(STUDIO, "sudo -n true"): SUDO_WANTS_PASSWORD})
    mbp, studio = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(runner))
    assert mbp["status"] == "applied" and studio["status"] == "failed" and studio["undo"] is None
    assert [c for a, c in runner.calls if a == STUDIO] == ["sudo -n true"]  # nothing else ran there
    assert "sudo needs a password on studio" in studio["output"] and "nothing was changed" in studio["output"]
    for command in STUDIO_COMMANDS:
        assert "\n  " + command.replace("sudo -n ", "sudo ", 1) in studio["output"]


def test_nothing_is_planned_where_every_port_has_ipv4_or_ifconfig_is_missing(macos_fixtures, tmp_path):
    result, plan = planned(captures(macos_fixtures, tmp_path / "a", studio_ifconfig=GLPI_IFCONFIG))
    assert result.status is Status.FAIL and [a.hosts for a in plan.actions] == [("mbp",), ("studio",)]
    # The studio's ifconfig not captured: its end's before is unknown, so the cable is left for you.
    caps = captures(macos_fixtures, tmp_path / "b")
    del caps["studio"].files[C.IFCONFIG]
    result, plan = planned(caps)
    assert result.status is Status.FAIL and plan.actions == [] and [r.id for r in plan.left] == ["thunderbolt-ipv4"]
