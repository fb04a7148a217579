"""``doctor --model DIR``: the model-split check on captured hosts (real macOS
sysctl captures), its wired-limit fix planned, applied through a recording
runner (sudo -n only) and undone, and the CLI's input errors. Never run on a
Mac here; tests/lab/test_model_split_lab.py runs the check and the fix over
the lab's real SSH."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import mlxcluster.doctor.checks.model_split  # noqa: F401  (registers the check)
from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.inventory.inventory import parse_inventory
from tests.fakes import FakeSsh
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder
from tests.inventory_support import inventory_text
from tests.memory_support import mac_capture, mini_sysctl

SPLIT = REGISTRY["model-split"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("m") / "tiny-llama", LLAMA3_CONFIG)


@pytest.fixture
def minis(macos_fixtures):
    """The captured 32 GB Mac mini's sysctl, on three hosts; mlx reports a working set of 200 KiB on
    mini2 (a stand-in: the tiny model then does not fit there, as a big one would not on a real Mac)."""
    text = mini_sysctl(macos_fixtures)
    return {"mini1": mac_capture("mini1", text), "mini2": mac_capture("mini2", text, 200 * 1024),
            "mini3": mac_capture("mini3", text)}


def judge(captures, names, model, pipeline=False):
    inventory = parse_inventory(inventory_text(names))
    ctx = CheckContext({n: captures[n] for n in names}, inventory=inventory,
                       options={"model": str(model), "pipeline": pipeline})
    [result] = run_checks(ctx, [SPLIT])
    return result, inventory


def test_without_model_the_check_is_skipped(minis):
    [result] = run_checks(CheckContext(minis, options={}), [SPLIT])
    assert result.status is Status.SKIP and "doctor --model DIR" in result.hint


def test_three_hosts_and_two_kv_heads_fail_naming_the_heads(minis, model):
    result, _ = judge(minis, ["mini1", "mini3", "mini2"], model)
    assert result.status is Status.FAIL
    assert "3 ranks do not divide the 4 attention heads and 2 KV heads" in result.hosts["tiny-llama"]
    assert result.hosts["tiny-llama"].startswith("✗ ")
    assert result.hint.startswith("1 or 2 rank(s): the counts that divide 4 and 2")


def test_a_mac_short_of_gpu_memory_is_blamed_and_its_limit_is_the_fix(minis, model):
    result, inventory = judge(minis, ["mini1", "mini2"], model)
    assert result.status is Status.FAIL and result.hosts["mini2"].startswith("✗ rank 1:")
    assert result.hosts["mini1"].endswith(": fits")
    assert result.fix_data == {"mini2": {"wired_limit_mb": 1024, "before_mb": 0, "model": "tiny-llama"}}
    plan = build_plan([result], [SPLIT], inventory)
    [action] = plan.actions
    assert action.hosts == ("mini2",) and action.sudo and action.kind == "remote"
    assert action.commands == ["sudo -n sysctl iogpu.wired_limit_mb=1024"]
    assert action.params["undo"] == ["sudo -n sysctl iogpu.wired_limit_mb=0"]
    assert "does not survive a reboot" in action.what

    runner = FakeSsh()
    journal = Journal.create(fixes_dir(), None)
    [entry] = apply_plan(plan, journal, ApplyContext(runner))
    assert entry["status"] == "applied"
    assert runner.calls == [("10.9.0.2", "sudo -n true"), ("10.9.0.2", "sudo -n sysctl iogpu.wired_limit_mb=1024")]
    undo = FakeSsh()
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), lambda: undo)] == ["restored"]
    assert undo.calls == [("10.9.0.2", "sudo -n sysctl iogpu.wired_limit_mb=0")]


def test_two_hosts_that_fit_pass(minis, model):
    result, _ = judge(minis, ["mini1", "mini3"], model)
    assert result.status is Status.PASS and not result.fix_data


def test_doctor_model_refuses_what_is_no_model_before_any_host_is_probed(tmp_path):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(inventory_text(["a"]))
    run = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--model", str(tmp_path / "none")])
    assert run.exit_code == 2 and "model folder" in run.output and "does not exist" in run.output
    run = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--pipeline"])
    assert run.exit_code == 2 and "--pipeline goes with --model" in run.output
    run = CliRunner().invoke(main, ["doctor", "--local", "--model", str(tmp_path)])
    assert run.exit_code == 2 and "--local has none" in run.output


def test_doctor_model_on_a_replayed_capture(minis, model, tmp_path):
    from mlxcluster.facts.capture import save_capture_dir

    folder = save_capture_dir({n: minis[n] for n in ("mini1", "mini3", "mini2")}, tmp_path / "cap")
    run = CliRunner().invoke(main, ["doctor", "--from", str(folder), "--model", str(model), "--json"])
    doc = json.loads(run.output)
    [check] = [c for c in doc["checks"] if c["id"] == "model-split"]
    assert check["status"] == "fail" and "2 KV heads" in check["hosts"]["tiny-llama"]
    assert doc["hosts"]["mini1"]["gpu_wired_limit_mb"] == 0
