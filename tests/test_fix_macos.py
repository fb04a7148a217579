"""The macOS fixes' commands, built from real captured macOS outputs
(tests/fixtures/macos) and applied through a recording runner: sudo -n only,
and where sudo wants a password nothing runs and the commands are given to
the user. Never run on a Mac here."""

from __future__ import annotations

import mlxcluster.doctor.checks.topology  # noqa: F401  (registers the checks)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.macos import firewall_unblock_commands, firewall_undo_commands
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.inventory.inventory import parse_inventory
from tests.fakes import SUDO_WANTS_PASSWORD, FakeSsh
from tests.inventory_support import inventory_text
from tests.topology_helpers import MACCLUSTER, make_capture_dir

BRIDGE_OFF = "sudo -n networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off"
BRIDGE_ON = "sudo -n networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' on"


def bridge_plan(macos_fixtures, tmp_path):
    """The MacBook Pro whose bridge0 holds en1-en3 (glpi capture) and a Mac
    mini whose bridge is inactive (maccluster capture)."""
    captures = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "cap", MACCLUSTER))
    inventory = parse_inventory(inventory_text(["mbp", "mini"]))
    [result] = run_checks(CheckContext(captures=captures, inventory=inventory, backend="ring"),
                          [REGISTRY["thunderbolt-bridge"]])
    return result, build_plan([result], [REGISTRY["thunderbolt-bridge"]], inventory), inventory


def test_the_bridge_fix_is_planned_for_the_mac_whose_bridge_holds_the_ports(macos_fixtures, tmp_path):
    result, plan, _ = bridge_plan(macos_fixtures, tmp_path)
    assert result.fix_data == {"mbp": {"members": ["en1", "en2", "en3"]}}
    [action] = plan.actions
    assert action.hosts == ("mbp",) and action.sudo and action.kind == "remote"
    assert action.commands == [BRIDGE_OFF]
    assert action.params["ssh"] == "10.9.0.1" and action.params["undo"] == [BRIDGE_ON]
    assert "bridge0 holds en1, en2, en3" in action.what


def test_sudo_that_wants_a_password_changes_nothing_and_says_what_to_run(macos_fixtures, tmp_path):
    _, plan, inventory = bridge_plan(macos_fixtures, tmp_path)
    runner = FakeSsh({"sudo -n true": SUDO_WANTS_PASSWORD})
    [entry] = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(runner))
    assert runner.calls == [("10.9.0.1", "sudo -n true")]  # nothing else ran
    assert entry["status"] == "failed" and entry["undo"] is None
    assert "sudo needs a password on mbp" in entry["output"] and "nothing was changed" in entry["output"]
    assert "  sudo networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off" in entry["output"]


def test_with_passwordless_sudo_it_runs_in_order_and_undoes(macos_fixtures, tmp_path):
    _, plan, _ = bridge_plan(macos_fixtures, tmp_path)
    runner = FakeSsh()
    journal = Journal.create(fixes_dir(), None)
    [entry] = apply_plan(plan, journal, ApplyContext(runner))
    assert entry["status"] == "applied"
    assert runner.calls == [("10.9.0.1", "sudo -n true"), ("10.9.0.1", BRIDGE_OFF)]
    undo = FakeSsh()
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), lambda: undo)] == ["restored"]
    assert undo.calls == [("10.9.0.1", BRIDGE_ON)]


def test_firewall_commands_quote_the_python():
    python = "/Users/me/my venv/bin/python3"
    assert firewall_unblock_commands(python) == [
        "sudo -n /usr/libexec/ApplicationFirewall/socketfilterfw --add '/Users/me/my venv/bin/python3' "
        "--unblockapp '/Users/me/my venv/bin/python3'"]
    assert firewall_undo_commands("/opt/venv/bin/python") == [
        "sudo -n /usr/libexec/ApplicationFirewall/socketfilterfw --remove /opt/venv/bin/python"]
