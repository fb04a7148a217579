"""The macOS application firewall: socketfilterfw's texts parsed from real
captures (tests/fixtures/macos, SOURCES.md), the ``macos-firewall`` check,
and its fix applied through a recording runner (sudo -n only; where sudo
wants a password nothing runs). Never run on a Mac here."""

from __future__ import annotations

import json

import pytest

import mlxcluster.doctor.checks.firewall  # noqa: F401  (registers the check)
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts import macos_firewall as fw
from mlxcluster.facts.capture import PROBE, HostCapture
from mlxcluster.inventory.inventory import parse_inventory
from tests.fakes import SUDO_WANTS_PASSWORD, FakeSsh
from tests.inventory_support import inventory_text
from tests.probe_support import load_probe_module

SFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
PY = "/opt/homebrew/Cellar/python@3.12/3.12.8/Frameworks/Python.framework/Versions/3.12/Resources/Python.app/Contents/MacOS/Python"
VENV = "/opt/venv/bin/python"
# The --listapps form other projects quote for older macOS ("ALF:", two
# spaces, a tab, spaces inside the parentheses); Microsoft's
# AttackSurfaceAnalyzer shows it as "Example Output" (index file id 17279719252).
OLD_LIST = ("ALF: total number of apps = 2 \n\n1 :  /Applications/AppName.app \n \t ( Allow incoming connections ) \n\n"
            "2 :  {path} \n \t ( Block incoming connections ) \n")


def text(macos_fixtures, name: str) -> str:
    return (macos_fixtures / name).read_text(encoding="utf-8")


@pytest.fixture
def real(macos_fixtures) -> dict[str, str]:
    return {
        "state": text(macos_fixtures, "socketfilterfw_getglobalstate_enabled_stealth_on_homebrew_mosh_mac_2026-10-02.txt"),
        "blockall": text(macos_fixtures, "socketfilterfw_getblockall_disabled_homebrew_mosh_mac_2026-10-02.txt"),
        "appblocked": text(macos_fixtures, "socketfilterfw_getappblocked_permitted_homebrew_mosh_server_2026-10-02.txt"),
        "listapps": text(macos_fixtures, "socketfilterfw_listapps_darwin27_first_of_3_entries_EXCERPT.txt"),
    }


def test_the_captured_texts_parse(real):
    assert fw.parse_global_state(real["state"]) == fw.ON  # "Firewall stealth mode is on" says nothing of it
    assert fw.parse_global_state("Firewall is disabled. (State = 0)") == fw.OFF
    assert fw.parse_global_state("Firewall is enabled. (State = 2)") == fw.BLOCK_ALL
    assert fw.parse_global_state("zsh: no such file or directory") is None
    assert fw.parse_block_all(real["blockall"]) is False
    for on in ("Firewall has block all state set to enabled.", "Firewall is blocking all non-essential incoming "
               "connections.", "Firewall is set to block all non-essential incoming connections"):
        assert fw.parse_block_all(on) is True
    assert fw.parse_block_all("Block all DISABLED! ") is False
    assert fw.parse_listapps(real["listapps"]) == [("/Applications/Zoom.app", True)]
    # "permitted" is also said of paths the firewall never listed: not believed.
    mosh = "/opt/homebrew/Cellar/mosh/1.4.0_43/bin/mosh-server"
    assert fw.parse_app_blocked(real["appblocked"], mosh) is None
    assert fw.parse_app_blocked(f"Incoming connection to {mosh} is blocked.\n", mosh) is True
    # A word in the path says nothing.
    assert fw.parse_app_blocked("Incoming connection to /x/is blocked/py is permitted.", "/x/is blocked/py") is None


def test_the_older_list_form_and_bundles():
    entries = fw.parse_listapps(OLD_LIST.format(path="/Users/me/my venv/bin/python3"))
    assert entries == [("/Applications/AppName.app", True), ("/Users/me/my venv/bin/python3", False)]
    assert fw.app_rule(entries, ["/Users/me/my venv/bin/python3"]) is False
    assert fw.app_rule(entries, ["/Applications/AppName.app/Contents/MacOS/AppName"]) is True  # inside the bundle
    assert fw.app_rule(entries, ["/Applications/AppName.apps/x"]) is None
    assert fw.parse_listapps("Total number of apps = 0 \n") == []
    assert fw.parse_listapps("socketfilterfw: unknown option") is None


def mac(name: str, state: str, listapps: str | None, blockall: str, appblocked: str = "") -> HostCapture:
    """A Mac's probe.json as the probe writes it, socketfilterfw's answers filled in."""
    probe = {"hostname": name, "platform": "darwin", "python": {"executable": VENV},
             "firewall": state.splitlines()[0],
             "firewall_app": {"path": PY, "executable": VENV, "blockall": blockall, "listapps": listapps,
                              "appblocked": appblocked or f"Incoming connection to {PY} is permitted.\n"}}
    return HostCapture(name, {PROBE: json.dumps(probe)})


def judged(captures: dict[str, HostCapture]):
    inventory = parse_inventory(inventory_text(list(captures)))
    [result] = run_checks(CheckContext(captures=captures, inventory=inventory, backend="ring"),
                          [REGISTRY["macos-firewall"]])
    return result, build_plan([result], [REGISTRY["macos-firewall"]], inventory)


def four_macs(real) -> dict[str, HostCapture]:
    """mbp: listed and allowed; mini: python listed as blocked; studio: not in the
    list (the captured Darwin 27 list); air: block all on."""
    allowed = real["listapps"].replace("/Applications/Zoom.app", PY)
    return {
        "mbp": mac("mbp", real["state"], allowed, real["blockall"]),
        "mini": mac("mini", real["state"], OLD_LIST.format(path=PY), real["blockall"]),
        "studio": mac("studio", real["state"], real["listapps"], real["blockall"]),
        "air": mac("air", real["state"], real["listapps"], "Firewall has block all state set to enabled.\n"),
    }


def test_the_check_fails_only_where_the_python_would_be_blocked(real):
    result, plan = judged(four_macs(real))
    assert result.status is Status.FAIL
    assert result.hosts["mbp"] == f"firewall on; {PY} allowed (in its list)"
    assert result.hosts["mini"].startswith("✗ ") and "set to block incoming connections" in result.hosts["mini"]
    assert result.hosts["studio"].startswith("! ") and "not in its list" in result.hosts["studio"]
    assert result.hosts["air"].startswith("✗ ") and "Block all incoming connections" in result.hosts["air"]
    assert result.fix_data == {"mini": {"path": PY, "listed": True}, "studio": {"path": PY, "listed": False}}
    assert "--setblockall off" in result.hint and "on air:" in result.hint
    # Block all is the user's to turn off: no change planned, left for them.
    assert [a.hosts for a in plan.actions] == [("mini",), ("studio",)]
    assert [r.id for r in plan.left] == ["macos-firewall"]
    q = f"'{PY}'" if " " in PY else PY
    mini, studio = plan.actions
    assert mini.sudo and mini.commands == [f"sudo -n {SFW} --unblockapp {q}"]
    assert mini.params["undo"] == [f"sudo -n {SFW} --blockapp {q}"]  # it was listed: not removed
    assert studio.commands == [f"sudo -n {SFW} --add {q} --unblockapp {q}"]
    assert studio.params["undo"] == [f"sudo -n {SFW} --remove {q}"]  # added by the fix: removed


def test_firewall_off_or_unread_blames_nobody(real):
    result, plan = judged({
        "off": mac("off", "Firewall is disabled. (State = 0)\n", None, ""),
        "old": mac("old", real["state"], "socketfilterfw: unknown option --listapps", real["blockall"]),
    })
    assert result.status is Status.PASS and plan.empty
    assert result.hosts == {"off": "firewall off",
                            "old": "firewall on; the python's rule was not read (socketfilterfw --listapps)"}


def test_a_blocked_answer_counts_even_when_the_list_does_not_name_the_path(real):
    blocked = f"Incoming connection to {PY} is blocked.\n"
    result, _ = judged({"m": mac("m", real["state"], real["listapps"], real["blockall"], appblocked=blocked)})
    assert result.status is Status.FAIL and result.fix_data == {"m": {"path": PY, "listed": False}}


def test_the_fix_runs_with_sudo_n_in_order_and_undoes_only_what_it_did(real):
    _, plan = judged(four_macs(real))
    runner = FakeSsh()
    journal = Journal.create(fixes_dir(), None)
    entries = apply_plan(plan, journal, ApplyContext(runner))
    assert [e["status"] for e in entries] == ["applied", "applied"]
    assert [c for _, c in runner.calls] == [
        "sudo -n true", f"sudo -n {SFW} --unblockapp {PY}",
        "sudo -n true", f"sudo -n {SFW} --add {PY} --unblockapp {PY}"]
    undo = FakeSsh()
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), lambda: undo)] == ["restored", "restored"]
    assert [c for _, c in undo.calls] == [f"sudo -n {SFW} --remove {PY}", f"sudo -n {SFW} --blockapp {PY}"]


def test_without_passwordless_sudo_nothing_runs_and_the_commands_are_given(real):
    _, plan = judged(four_macs(real))
    runner = FakeSsh({"sudo -n true": SUDO_WANTS_PASSWORD})
    entries = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(runner))
    assert [c for _, c in runner.calls] == ["sudo -n true", "sudo -n true"]
    assert all(e["status"] == "failed" and e["undo"] is None for e in entries)
    assert f"  sudo {SFW} --add {PY} --unblockapp {PY}" in entries[1]["output"]


def test_the_probe_asks_the_firewall_about_the_file_it_runs(real, tmp_path):
    """probe_firewall's questions to a fake socketfilterfw answering with the
    captured texts, read back through HostFacts by the check (Linux here: the
    path is sys.executable resolved; on a Mac, proc_pidpath's)."""
    probe = load_probe_module()
    fake = tmp_path / "socketfilterfw"
    answers = {"--getblockall": real["blockall"], "--listapps": real["listapps"]}
    fake.write_text("#!/bin/sh\necho \"$@\" >> " + str(tmp_path / "asked") + "\ncase \"$1\" in\n" + "".join(
        f"  {flag}) printf '%s' '{answer}' ;;\n" for flag, answer in answers.items())
        + "  --getappblocked) echo \"Incoming connection to $2 is permitted.\" ;;\nesac\n")
    fake.chmod(0o755)
    commands: dict[str, str] = {}
    app = probe.probe_firewall(commands, tool=str(fake))
    assert app["path"] == probe.executable_path() and app["listapps"] == real["listapps"]
    assert (tmp_path / "asked").read_text().splitlines() == [
        "--getblockall", "--listapps", f"--getappblocked {app['path']}"]
    assert set(commands.values()) == {"ok"}
    result, plan = judged({"m": HostCapture("m", {PROBE: json.dumps(
        {"hostname": "m", "platform": "darwin", "firewall": "Firewall is enabled. (State = 1)",
         "firewall_app": app})})})
    assert result.status is Status.WARN and result.fix_data == {"m": {"path": app["path"], "listed": False}}
    assert plan.actions[0].commands == [f"sudo -n {SFW} --add {app['path']} --unblockapp {app['path']}"]
