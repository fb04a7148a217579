"""``mlxcluster doctor --fix / --dry-run / --yes / --undo`` through click's
runner; the live doctor runs are replaced by reports given in turn (the
fixes, the journal and the inventory edit are the real ones)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import doctor_fix, main
from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.doctor import DoctorReport
from mlxcluster.doctor.fixes import session as session_module
from tests.fakes import FakeSsh, run_hosts_by

# The inventory_file fixture's text (tests/conftest.py); the comment must survive the edit.
INVENTORY = "cluster: lab  # kept\npython: /opt/venv/bin/python\nhosts:\n" \
            "  - name: a\n    ssh: 10.0.0.1\n  - name: b\n    ssh: 10.0.0.2\n"
LIB = "/opt/venv/lib/libmpi.so.40"


def report(*results: CheckResult) -> DoctorReport:
    return DoctorReport("x", list(results), {}, {}, True, 0.1, "lab")


def libmpi(status: Status, hosts=("a", "b")) -> CheckResult:
    if status is Status.PASS:
        return CheckResult("libmpi-by-hand", "MLX finds libmpi", Status.PASS, {h: "ok" for h in "ab"})
    return CheckResult("libmpi-by-hand", "MLX finds libmpi", status, {h: f"! {LIB}" for h in hosts},
                       "set MLX_MPI_LIBNAME", {h: {"MLX_MPI_LIBNAME": LIB} for h in hosts})


class Session:
    """The reports run_doctor gives, in turn, and how often it was called."""

    def __init__(self, monkeypatch, *reports):
        self.reports = list(reports)
        self.calls = 0
        self.inventories = []
        monkeypatch.setattr(session_module, "run_doctor", self.run_doctor)
        run_hosts_by(monkeypatch, FakeSsh(default=None))

    def run_doctor(self, inventory, **kwargs):
        self.calls += 1
        self.inventories.append(inventory)
        return self.reports.pop(0)


def journals() -> list[Path]:
    folder = Path(os.environ["XDG_CONFIG_HOME"]) / "mlxcluster" / "fixes"
    return sorted(folder.glob("*.json")) if folder.exists() else []


def invoke(*args, input=None):
    return CliRunner().invoke(main, ["doctor", *args], input=input)


def test_fix_yes_applies_checks_again_and_exits_0(monkeypatch, inventory_file):
    session = Session(monkeypatch, report(libmpi(Status.WARN)), report(libmpi(Status.PASS)))
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 0, result.output
    assert "fix plan: 1 change(s) for 2 host(s)" in result.output
    assert f"on this machine: edit {inventory_file}: env.MLX_MPI_LIBNAME: '{LIB}'" in result.output
    assert "  applied   [libmpi-by-hand] a, b:" in result.output
    assert "[!] -> [✓] MLX finds libmpi  [libmpi-by-hand]" in result.output
    assert session.calls == 2 and session.inventories[1].env == {"MLX_MPI_LIBNAME": LIB}  # re-read
    assert inventory_file.read_text().startswith("cluster: lab  # kept\n")
    [journal] = journals()
    assert f"undo: mlxcluster doctor --undo {journal}" in result.output
    # --undo puts the inventory back byte for byte.
    undone = invoke("--undo", str(journal))
    assert undone.exit_code == 0, undone.output
    assert "restored" in undone.output and inventory_file.read_text() == INVENTORY


def test_a_fix_that_did_not_fix_exits_1_and_names_what_is_left(monkeypatch, inventory_file):
    Session(monkeypatch, report(libmpi(Status.WARN)), report(libmpi(Status.WARN)))
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 1
    assert "[!] -> [!] MLX finds libmpi" in result.output
    assert "left for you:\n  [libmpi-by-hand] MLX finds libmpi: set MLX_MPI_LIBNAME" in result.output


def test_dry_run_prints_the_plan_and_changes_nothing(monkeypatch, inventory_file):
    session = Session(monkeypatch, report(libmpi(Status.WARN)))
    result = invoke("-i", str(inventory_file), "--fix", "--dry-run")
    assert result.exit_code == 1
    assert "fix plan: 1 change(s)" in result.output and "dry run: nothing was changed" in result.output
    assert inventory_file.read_text() == INVENTORY and journals() == [] and session.calls == 1


def test_nothing_to_fix_exits_as_doctor_does(monkeypatch, inventory_file):
    Session(monkeypatch, report(libmpi(Status.PASS)))
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 0 and "nothing here can be fixed" in result.output and journals() == []


def test_the_question_no_changes_nothing_and_yes_applies(monkeypatch, inventory_file):
    monkeypatch.setattr(doctor_fix, "can_ask", lambda: True)
    Session(monkeypatch, report(libmpi(Status.WARN)))
    result = invoke("-i", str(inventory_file), "--fix", input="n\n")
    assert result.exit_code == 1
    assert "Apply these 1 change(s)? [y/N]: n\nnothing was changed" in result.output
    assert inventory_file.read_text() == INVENTORY and journals() == []
    Session(monkeypatch, report(libmpi(Status.WARN)), report(libmpi(Status.PASS)))
    result = invoke("-i", str(inventory_file), "--fix", input="y\n")
    assert result.exit_code == 0 and LIB in inventory_file.read_text()


def test_a_host_judged_only_after_its_key_was_saved_gets_a_second_plan(monkeypatch, inventory_file, tmp_path):
    known = tmp_path / "known_hosts"
    key = CheckResult("host-keys", "Host keys known", Status.FAIL,
                      {"a": "known", "b": "✗ host key of 10.0.0.2 is unknown"}, "verify it",
                      {"b": {"host_id": "10.0.0.2", "key_type": "ssh-ed25519", "fingerprint": "SHA256:x",
                             "key_base64": "AAAAkey", "known_hosts": str(known)}})
    passed = CheckResult("host-keys", "Host keys known", Status.PASS, {"a": "known", "b": "known"})
    session = Session(monkeypatch, report(key, libmpi(Status.WARN, ("a",))),
                      report(passed, libmpi(Status.WARN, ("b",))),  # b is probed now
                      report(passed, libmpi(Status.PASS)))
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 0, result.output
    assert "the re-check judged hosts it could not reach before; more to fix:" in result.output
    assert known.read_text() == "10.0.0.2 ssh-ed25519 AAAAkey\n"
    assert session.calls == 3
    assert "[✗] -> [✓] Host keys known  [host-keys]" in result.output
    [journal] = journals()
    assert [e["status"] for e in json.loads(journal.read_text())["entries"]] == ["applied"] * 3
    assert invoke("--undo", str(journal)).exit_code == 0
    assert inventory_file.read_text() == INVENTORY and known.read_text() == ""


@pytest.mark.parametrize("args, message", [
    (["--dry-run"], "--dry-run goes with --fix"),
    (["--yes"], "--yes goes with --fix"),
    (["--fix", "--dry-run", "--yes"], "--dry-run and --yes exclude each other"),
    (["--fix", "--json"], "--fix excludes --json"),
    (["--fix", "--local"], "--fix excludes --local"),
    (["--fix"], "there is no terminal to ask on"),
    (["--undo", "j.json", "--fix"], "--undo JOURNAL excludes --fix"),
])
def test_bad_flag_combinations_exit_2_before_any_host(monkeypatch, inventory_file, args, message):
    session = Session(monkeypatch)
    result = invoke("-i", str(inventory_file), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and session.calls == 0


def test_an_unwritable_journal_folder_exits_2_before_any_host(monkeypatch, inventory_file, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    session = Session(monkeypatch)
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 2 and "cannot create the fix journal folder" in result.output
    assert session.calls == 0


def test_an_unwritable_inventory_exits_2_with_nothing_changed(monkeypatch, inventory_file):
    from mlxcluster.doctor.fixes import apply

    monkeypatch.setattr(apply, "_writable", lambda p: p != inventory_file)
    Session(monkeypatch, report(libmpi(Status.WARN)))
    result = invoke("-i", str(inventory_file), "--fix", "--yes")
    assert result.exit_code == 2 and "is not writable" in result.output
    assert inventory_file.read_text() == INVENTORY and journals() == []


def test_undo_of_what_is_not_a_journal_exits_2(tmp_path):
    (tmp_path / "x.json").write_text("[]")
    result = invoke("--undo", str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "not a doctor --fix journal" in result.output
