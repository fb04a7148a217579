"""``doctor --model DIR`` over the real 3-host lab, and its wired-limit fix
over real SSH to a stand-in sysctl.

The check: doctor probes the three Linux hosts live (their MemAvailable) and
judges tiny model folders written by mlx-lm with the installed mlx-lm: one
with 2 KV heads is refused over 3 hosts naming the heads (exit 1); one with 3
KV heads passes, replayed from the same collected captures.

The fix: the lab's hosts are Linux, so the Mac the fix is for is stood in
for as tests/lab/test_fix_macos_lab.py does: the check judges a capture made
of what the host's stand-in ``sysctl hw.memsize iogpu.wired_limit_mb``
answers (the probe's own command, read over SSH), with mlx's working set
that of a Mac short of GPU memory; ``apply_plan`` runs ``sudo -n sysctl
iogpu.wired_limit_mb=N`` through paramiko on the real sshd host, where the
stand-in sudo and sysctl record it and keep the value on the host's own
disk; the re-check reads it back (a Mac's mlx then reports the override as
its working set: measured, tests/fixtures/macos/SOURCES.md), and the undo
sets the value before. What a Mac's kernel does with the value is not shown.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts.capture import HostCapture
from mlxcluster.fit.split import MIB
from mlxcluster.ssh.remote import ParamikoRunner
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder
from tests.lab.macos_standin_support import NAMES, calls, host_state, lab_inventory, macos_standins
from tests.memory_support import WORKING_SET_32GB, mac_capture

pytestmark = pytest.mark.lab

# Heads that 3 ranks divide: 6 attention heads of 16, 3 KV heads.
THREE_KV = {**LLAMA3_CONFIG, "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3}
MINI_MEMSIZE = "34359738368"  # the captured M2 Pro Mac mini's hw.memsize (32 GiB)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"two_kv": make_llama_folder(root / "two-kv", LLAMA3_CONFIG),
            "three_kv": make_llama_folder(root / "three-kv", THREE_KV)}


def test_two_kv_heads_are_refused_over_three_hosts_and_three_pass(lab3, lab_inventory, models, tmp_path):
    started = time.monotonic()
    runner = CliRunner()
    collect = tmp_path / "captures"
    live = runner.invoke(main, ["doctor", "-i", str(lab_inventory), "--no-data-path", "--model",
                                str(models["two_kv"]), "--collect", str(collect)])
    live_s = time.monotonic() - started
    assert live.exit_code == 1, live.output
    assert "[✗] The model splits over the hosts and fits their memory (--model)  [model-split]" in live.output
    assert "3 ranks do not divide the 4 attention heads and 2 KV heads" in live.output
    assert "fix: 1 or 2 rank(s): the counts that divide 4 and 2" in live.output
    for host in lab3.hosts:  # every host judged on what the live probe read there
        assert f"    {host.name}: rank " in live.output and "(MemAvailable): fits" in live.output

    replay = runner.invoke(main, ["doctor", "--from", str(collect), "-i", str(lab_inventory), "--model",
                                  str(models["three_kv"]), "--json"])
    [check] = [c for c in json.loads(replay.output)["checks"] if c["id"] == "model-split"]
    assert check["status"] == "pass", check
    assert check["hosts"]["three-kv"].endswith("three-kv over 3 rank(s), tensor: 385.9 KiB of weights per rank: fits")
    assert [check["hosts"][h.name].split(": ", 1)[0] for h in lab3.hosts] == ["rank 0", "rank 1", "rank 2"]
    assert all(check["hosts"][h.name].endswith("(MemAvailable): fits") for h in lab3.hosts)
    print(f"\ndoctor --model over the lab: live {live_s:.1f} s, replay {time.monotonic() - started - live_s:.1f} s")


def read_sysctl(runner, lab, i: int, tools) -> str:
    """The probe's memory command on a lab host, answered by its stand-in sysctl."""
    command = f"{shlex.quote(str(tools / 'sysctl'))} hw.memsize iogpu.wired_limit_mb"
    result = runner.run(lab.hosts[i].ip, command, user="root", timeout=30)
    assert result.exit_status == 0, result.stderr
    return result.stdout


def mac_captures(runner, lab, tools, short: dict[str, int]) -> dict[str, HostCapture]:
    """Each host as a Mac: its stand-in sysctl's answer, and mlx's working set: ``short[name]`` bytes
    where given, else the wired limit the host's sysctl says (what mlx reports once it is set)."""
    captures = {}
    for i, name in enumerate(NAMES):
        sysctl = read_sysctl(runner, lab, i, tools)
        limit = int(sysctl.split("iogpu.wired_limit_mb: ")[1].split()[0])
        working_set = short.get(name) or limit * MIB or WORKING_SET_32GB
        captures[name] = mac_capture(name, sysctl, working_set, python=lab.python)
    return captures


def judge(captures, inventory, model):
    [result] = run_checks(CheckContext(captures, inventory=inventory, options={"model": str(model)}),
                          [REGISTRY["model-split"]])
    return result


def test_the_wired_limit_raised_over_real_ssh_and_undone(lab3, models, tmp_path):
    started = time.monotonic()
    lab = lab3
    with macos_standins(lab) as tools:
        for i in range(len(NAMES)):
            (host_state(lab, i) / "sysctl.json").write_text(
                json.dumps({"hw.memsize": MINI_MEMSIZE, "iogpu.wired_limit_mb": "0"}))
        inventory = lab_inventory(lab)
        with ParamikoRunner(str(lab.ssh_config)) as runner:
            before = judge(mac_captures(runner, lab, tools, {"studio": 200 * 1024}), inventory, models["three_kv"])
            assert before.status is Status.FAIL and before.hosts["studio"].startswith("✗ rank 1:")
            assert before.fix_data == {"studio": {"wired_limit_mb": 1024, "before_mb": 0, "model": "three-kv"}}
            plan = build_plan([before], [REGISTRY["model-split"]], inventory)
            assert [(a.hosts, a.commands) for a in plan.actions] == [
                (("studio",), ["sudo -n sysctl iogpu.wired_limit_mb=1024"])]
            journal = Journal.create(tmp_path / "fixes", None)
            [entry] = apply_plan(plan, journal, ApplyContext(runner, timeout=30))
            assert entry["status"] == "applied", entry["output"]
            assert "iogpu.wired_limit_mb: 0 -> 1024" in entry["output"]  # what macOS prints when setting
            assert [c["argv"] for c in calls(lab, 1) if c["tool"] == "sudo"] == [
                ["-n", "true"], ["-n", "sysctl", "iogpu.wired_limit_mb=1024"]]
            assert all(c["root"] for c in calls(lab, 1) if c["tool"] == "sysctl" and "=" in " ".join(c["argv"]))
            assert not [c for i in (0, 2) for c in calls(lab, i) if c["tool"] == "sudo"]  # only studio changed

            after = judge(mac_captures(runner, lab, tools, {}), inventory, models["three_kv"])
            assert after.status is Status.PASS, after.hosts
            assert "iogpu.wired_limit_mb=1024" in after.hosts["studio"]

            undone = undo_journal(read_journal(journal.path), lambda: runner)
            assert [s for _, s, _ in undone] == ["restored"]
            assert "iogpu.wired_limit_mb: 1024 -> 0" in undone[0][2]
            assert json.loads((host_state(lab, 1) / "sysctl.json").read_text())["iogpu.wired_limit_mb"] == "0"
    print(f"\nwired-limit fix through stand-ins on the lab: {time.monotonic() - started:.1f} s")
