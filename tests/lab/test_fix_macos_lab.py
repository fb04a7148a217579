"""The macOS fixes (Thunderbolt Bridge off, the IP plan, the firewall) applied
over real SSH on the lab's Linux hosts, to macOS tools stood in for.

The lab's hosts are Linux: the probe decides macOS by the platform, so no
stand-in makes a host look like a Mac to doctor. What is real here: the plan
is built by the checks from real captured macOS outputs (tests/fixtures/macos,
as tests/test_fix_macos.py and tests/test_fix_ip_plan.py do; for the firewall,
from socketfilterfw's answers read on the host, below), and
``apply_plan`` / ``undo_journal`` run every command through paramiko on real
sshd hosts (zsh as login shell). What is stood in: ``sudo`` (first on each
host's PATH) and the macOS tools it runs (``networksetup``, ``ifconfig``,
``route``, ``socketfilterfw``, found by the command's base name in a folder of
stand-ins, so the absolute ``/usr/libexec/ApplicationFirewall/socketfilterfw``
reaches one too). They record every call with its argv to a log on the host's
own disk; the socketfilterfw stand-in keeps an app list there, which the
re-check reads through the probe's own ``probe_firewall`` run on the host.
One host ("mini") has no passwordless sudo: the stand-in answers ``sudo -n``
there as sudo does ("sudo: a password is required", exit 1).

Shown: ``sudo -n`` on every command that changes something, the order, the
firewall re-check after (fail -> pass where the fix ran, still fail on mini),
mini unchanged with its commands given to run by hand, and the undo in
reverse order. Not shown: what a Mac does with any of these commands (the
stand-ins' state changes are ours: ``--add`` lists a program as blocked,
``--unblockapp`` allows it; networksetup, ifconfig and route only record).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

import mlxcluster.doctor.checks.firewall  # noqa: F401  (registers the checks)
import mlxcluster.doctor.checks.jaccl  # noqa: F401
import mlxcluster.doctor.checks.topology  # noqa: F401
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import PROBE, HostCapture, load_capture_dir
from mlxcluster.ssh.remote import ParamikoRunner
from tests.fix_support import GLPI_IFCONFIG, MBP_COMMANDS, STUDIO_COMMANDS, TN3205_IFCONFIG
from tests.lab.macos_standin_support import (
    NAMES,
    TOOLS,
    calls,
    host_state,
    lab_inventory,
    macos_standins,
)
from tests.topology_helpers import MACCLUSTER, OMLX, make_capture_dir

pytestmark = pytest.mark.lab

PROBE_SCRIPT = Path(__file__).resolve().parents[2] / "mlxcluster" / "facts" / "probe_script.py"
SFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
# The probe's own socketfilterfw questions, run on the host with the stand-in as the tool.
READ_FIREWALL = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('probe', sys.argv[1])\n"
    "p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)\n"
    "state = p.first_line(p.run_command([sys.argv[2], '--getglobalstate'], {}))\n"
    "print(json.dumps({'firewall': state, 'firewall_app': p.probe_firewall({}, tool=sys.argv[2])}))\n"
)


def read_firewall(runner, lab, i: int, tools: Path) -> dict:
    """probe.json's firewall fields as the probe's code reads them on the host."""
    command = (f"{shlex.quote(lab.python)} -c {shlex.quote(READ_FIREWALL)} {shlex.quote(str(PROBE_SCRIPT))} "
               f"{shlex.quote(str(tools / 'socketfilterfw'))}")
    result = runner.run(lab.hosts[i].ip, command, user="root", timeout=30)
    assert result.exit_status == 0, result.stderr
    return json.loads(result.stdout)


def firewall_result(runner, lab, tools, inventory):
    captures = {}
    for i, name in enumerate(NAMES):
        probe = {"hostname": name, "platform": "darwin", "python": {"executable": lab.python},
                 **read_firewall(runner, lab, i, tools)}
        captures[name] = HostCapture(name, {PROBE: json.dumps(probe)})
    [result] = run_checks(CheckContext(captures=captures, inventory=inventory, backend="jaccl"),
                          [REGISTRY["macos-firewall"]])
    return result



def captured_results(macos_fixtures, tmp_path, inventory):
    """thunderbolt-bridge and thunderbolt-ipv4 judged on the captured macOS outputs."""
    bridge = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "bridge", MACCLUSTER))
    layout = {host: dict(files) for host, files in OMLX.items()}
    layout["mbp"][C.IFCONFIG], layout["studio"][C.IFCONFIG] = GLPI_IFCONFIG, TN3205_IFCONFIG
    en3 = make_capture_dir(macos_fixtures, tmp_path / "ipplan", layout,
                           lambda host, f, text: text.replace("en2", "en3") if host == "studio" and f == C.IFCONFIG
                           else text)
    [b] = run_checks(CheckContext(captures=bridge, inventory=inventory, backend="ring"),
                     [REGISTRY["thunderbolt-bridge"]])
    [ip] = run_checks(CheckContext(captures=load_capture_dir(en3), inventory=inventory, backend="jaccl"),
                      [REGISTRY["thunderbolt-ipv4"]])
    return [b, ip]


def test_macos_fixes_over_real_ssh_to_stand_ins(lab3, macos_fixtures, tmp_path):
    started = time.monotonic()
    lab = lab3
    with macos_standins(lab) as tools:
        (host_state(lab, 2) / "no-passwordless-sudo").touch()
        inventory = lab_inventory(lab)
        with ParamikoRunner(str(lab.ssh_config)) as runner:
            # The python the firewall judges, as the probe names it on the host.
            py = read_firewall(runner, lab, 0, tools)["firewall_app"]["path"]
            initial = {"mbp": {py: "block"}, "studio": {"/Applications/Zoom.app": "allow"}, "mini": {py: "block"}}
            for i, name in enumerate(NAMES):
                (host_state(lab, i) / "alf.json").write_text(json.dumps(initial[name]))
            before = firewall_result(runner, lab, tools, inventory)
            assert before.status is Status.FAIL
            assert before.fix_data == {"mbp": {"path": py, "listed": True}, "studio": {"path": py, "listed": False},
                                       "mini": {"path": py, "listed": True}}
            results = [before, *captured_results(macos_fixtures, tmp_path, inventory)]
            plan = build_plan(results, [REGISTRY[r.id] for r in results], inventory)
            assert [(a.check, a.hosts) for a in plan.actions] == [
                ("macos-firewall", ("mbp",)), ("macos-firewall", ("studio",)), ("macos-firewall", ("mini",)),
                ("thunderbolt-bridge", ("mbp",)), ("thunderbolt-ipv4", ("mbp",)), ("thunderbolt-ipv4", ("studio",))]
            for i in range(3):  # reading the firewall changed nothing and needed no sudo
                assert not [c for c in calls(lab, i) if c["tool"] == "sudo"]
                (host_state(lab, i) / "calls.jsonl").unlink()

            journal = Journal.create(tmp_path / "fixes", None)
            entries = apply_plan(plan, journal, ApplyContext(runner, timeout=30))
            assert [e["status"] for e in entries] == ["applied", "applied", "failed", "applied", "applied", "applied"]
            refused = entries[2]["output"]
            assert "sudo needs a password on mini (sudo -n true: sudo: a password is required)" in refused
            assert f"nothing was changed there; run these on it yourself:\n  sudo {SFW} --unblockapp {py}" in refused

            sudo = {name: [c["argv"] for c in calls(lab, i) if c["tool"] == "sudo"] for i, name in enumerate(NAMES)}
            assert sudo["mbp"] == [["-n", "true"], ["-n", SFW, "--unblockapp", py],
                                   ["-n", "true"], ["-n", "networksetup", "-setnetworkserviceenabled",
                                                    "Thunderbolt Bridge", "off"],
                                   ["-n", "true"], *[shlex.split(c)[1:] for c in MBP_COMMANDS]]
            assert sudo["studio"] == [["-n", "true"], ["-n", SFW, "--add", py, "--unblockapp", py],
                                      ["-n", "true"], *[shlex.split(c)[1:] for c in STUDIO_COMMANDS]]
            assert sudo["mini"] == [["-n", "true"]]  # refused: nothing else was asked
            for name, argvs in sudo.items():  # what each host's stand-in sudo was asked, in order
                print(f"{name}: " + "; ".join(shlex.join(['sudo', *a]) for a in argvs))
            print(refused)
            for i in range(3):  # every change ran under the stand-in sudo, none without it
                changes = [c for c in calls(lab, i) if c["tool"] in TOOLS]
                assert all(c["root"] for c in changes)
            assert json.loads((host_state(lab, 0) / "services.json").read_text()) == {"Thunderbolt Bridge": "off"}
            assert not (host_state(lab, 2) / "services.json").exists()
            assert json.loads((host_state(lab, 2) / "alf.json").read_text()) == initial["mini"]

            after = firewall_result(runner, lab, tools, inventory)
            assert after.status is Status.FAIL and set(after.fix_data) == {"mini"}
            assert after.hosts["mbp"] == after.hosts["studio"] == f"firewall on; {py} allowed (in its list)"

            for i in range(3):
                (host_state(lab, i) / "calls.jsonl").unlink(missing_ok=True)
            undone = undo_journal(read_journal(journal.path), lambda: runner)
            assert [s for _, s, _ in undone] == ["restored"] * 5
            assert [c["argv"][1:] for c in calls(lab, 1) if c["tool"] == "sudo"] == [
                ["ifconfig", "en3", "inet", "192.168.0.2", "-alias"],
                ["ifconfig", "en3", "inet", "169.254.205.255", "netmask", "255.255.0.0", "alias"],
                [SFW, "--remove", py]]
            assert [c["argv"][1:] for c in calls(lab, 0) if c["tool"] == "sudo"][-1] == [SFW, "--blockapp", py]
            for i, name in enumerate(NAMES):
                assert json.loads((host_state(lab, i) / "alf.json").read_text()) == initial[name]
    print(f"\nmacOS fixes through stand-ins on the lab: {time.monotonic() - started:.1f} s")
