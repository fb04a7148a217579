"""doctor --fix's plan, its application, the journal and --undo, without hosts
(a fake runner stands for the SSH connections)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlxcluster.doctor.checks.base import CheckResult, CheckSpec, Status
from mlxcluster.doctor.fixes.apply import (
    ApplyContext,
    apply_plan,
    check_inventory_writable,
    remove_lines,
    undo_journal,
)
from mlxcluster.doctor.fixes.env import FIND_OPENBLAS, LIBMPI_ENV, OPENBLAS_PRELOAD
from mlxcluster.doctor.fixes.host_keys import SAVE_HOST_KEYS
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import Action, Fix, Plan, build_plan
from mlxcluster.errors import InputError
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.ssh.results import CommandResult
from tests.fakes import FakeSsh

# The inventory fixture's text (tests/conftest.py): its comments must survive an edit.
INVENTORY = """\
# three hosts
cluster: lab   # the name
python: /opt/venv/bin/python
hosts:
  - name: a
    ssh: 10.0.0.1   # first
  - name: b
    ssh: 10.0.0.2
  - name: c
    ssh: 10.0.0.3
    env:
      LD_PRELOAD: /usr/lib/libjemalloc.so.2
"""
LIB = "/opt/venv/lib/libmpi.so.40"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def result(check_id, status, hosts, fix_data=None):
    return CheckResult(check_id, check_id, status, hosts, "do it by hand", fix_data or {})


def specs(**fixes):
    return [CheckSpec(cid.replace("_", "-"), cid, lambda ctx: None, False, fix) for cid, fix in fixes.items()]


SPECS = specs(libmpi_by_hand=LIBMPI_ENV, reference_blas=OPENBLAS_PRELOAD, host_keys=SAVE_HOST_KEYS,
              backends=None)


def libmpi_result(hosts=("a", "b", "c")):
    return result("libmpi-by-hand", Status.WARN, {h: f"! no {LIB}" for h in hosts},
                  {h: {"MLX_MPI_LIBNAME": LIB} for h in hosts})


def host_key_result(known_hosts: Path):
    return result("host-keys", Status.FAIL, {"a": "known", "b": "✗ host key of 10.0.0.2 is unknown"},
                  {"b": {"host_id": "10.0.0.2", "key_type": "ssh-ed25519", "fingerprint": "SHA256:abc",
                         "key_base64": "AAAAC3NzaC1lZDI1NTE5AAAAIKEY", "known_hosts": str(known_hosts)}})


# ---- the plan ------------------------------------------------------------------------------

def test_the_same_value_for_every_host_goes_to_the_cluster_env(inventory):
    plan = build_plan([libmpi_result()], SPECS, inventory)
    assert [(a.hosts, a.params["host"], a.params["key"], a.params["value"]) for a in plan.actions] == [
        (("a", "b", "c"), None, "MLX_MPI_LIBNAME", LIB)]
    assert plan.actions[0].where == "here" and plan.left == []


def test_a_fix_is_planned_only_for_the_hosts_its_check_blamed(inventory):
    plan = build_plan([libmpi_result(("b",))], SPECS, inventory)
    assert [(a.hosts, a.params["host"]) for a in plan.actions] == [(("b",), "b")]
    # A fix that proposes a host its check did not blame is not planned there.
    greedy = Fix("x", lambda fx: [Action("libmpi-by-hand", ("a",), "inventory-env", "w", [], params={})])
    plan = build_plan([libmpi_result(("b",))], specs(libmpi_by_hand=greedy), inventory)
    assert plan.actions == [] and [r.id for r in plan.left] == ["libmpi-by-hand"]


def test_checks_without_a_fix_or_passing_are_left_or_ignored_and_a_broken_fix_is_said(inventory):
    def broken(fx):
        raise KeyError("boom")

    results = [result("backends", Status.FAIL, {"a": "✗ no mpi"}),
               result("reference-blas", Status.PASS, {"a": "openblas"}, {}),
               libmpi_result()]
    plan = build_plan(results, specs(backends=None, reference_blas=OPENBLAS_PRELOAD,
                                     libmpi_by_hand=Fix("x", broken)), inventory)
    assert plan.actions == []
    assert [r.id for r in plan.left] == ["backends", "libmpi-by-hand"]
    assert plan.problems == [("libmpi-by-hand", "KeyError: 'boom'")]


def test_openblas_is_looked_up_on_each_host_and_kept_before_an_existing_preload(inventory):
    asked = []

    def lookup(host, command):
        asked.append((host, command))
        return CommandResult(OPENBLAS + "\n" if host != "b" else "", "", 0, 0.1)

    slow = result("reference-blas", Status.WARN, {h: "! reference BLAS" for h in "abc"},
                  {h: {"blas": "libblas.so.3"} for h in "abc"})
    plan = build_plan([slow], SPECS, inventory, lookup)
    assert asked == [("a", FIND_OPENBLAS), ("b", FIND_OPENBLAS), ("c", FIND_OPENBLAS)]
    assert [(a.params["host"], a.params["value"]) for a in plan.actions] == [
        ("a", OPENBLAS), ("c", f"{OPENBLAS}:/usr/lib/libjemalloc.so.2")]
    assert [r.id for r in plan.left] == ["reference-blas"]  # b has no OpenBLAS: install it first


def test_host_keys_come_first_and_show_the_fingerprint(inventory, tmp_path):
    plan = build_plan([libmpi_result(), host_key_result(tmp_path / "kh")], SPECS, inventory)
    assert [a.kind for a in plan.actions] == ["known-host", "inventory-env"]
    key = plan.actions[0]
    assert "SHA256:abc" in key.what and key.hosts == ("b",)
    assert key.commands == [f"append to {tmp_path / 'kh'}: 10.0.0.2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY"]


# ---- applying, the journal and undo --------------------------------------------------------

def new_journal(inventory) -> Journal:
    return Journal.create(fixes_dir(), inventory.path)


def test_the_journal_lives_under_xdg_config_home_or_home(tmp_path):
    assert fixes_dir({"XDG_CONFIG_HOME": "/x"}) == Path("/x/mlxcluster/fixes")
    assert fixes_dir({"HOME": "/h"}) == Path("/h/.config/mlxcluster/fixes")
    assert fixes_dir() == Path(os.environ["XDG_CONFIG_HOME"]) / "mlxcluster" / "fixes"  # tests' own tmp
    j1 = Journal.create(tmp_path, None, clock=lambda: 0)
    j2 = Journal.create(tmp_path, None, clock=lambda: 0)
    assert (j1.path.name, j2.path.name) == ("19700101T000000Z.json", "19700101T000000Z-2.json")


def test_inventory_fix_applied_journalled_twice_is_once_and_undone_byte_for_byte(inventory):
    path = Path(inventory.path)
    original = path.read_bytes()
    plan = build_plan([libmpi_result(("a",)), libmpi_result(("b",))], SPECS, inventory)
    journal = new_journal(inventory)
    entries = apply_plan(plan, journal, ApplyContext())
    assert [e["status"] for e in entries] == ["applied", "applied"]
    assert Path(str(path) + ".bak").read_bytes() == original  # the file before this run, once
    edited = path.read_text()
    assert "# three hosts\ncluster: lab   # the name\n" in edited and "ssh: 10.0.0.1   # first\n" in edited
    assert {h.name: h.env.get("MLX_MPI_LIBNAME") for h in load_inventory(path).hosts} == {
        "a": LIB, "b": LIB, "c": None}
    doc = json.loads(journal.path.read_text())
    assert [e["status"] for e in doc["entries"]] == ["applied", "applied"]
    assert doc["entries"][0]["undo"]["kind"] == "restore-file"
    # Run again: nothing changes, nothing to undo for it.
    again = apply_plan(plan, new_journal(inventory), ApplyContext())
    assert [e["status"] for e in again] == ["unchanged", "unchanged"] and path.read_text() == edited
    done = undo_journal(read_journal(journal.path), runner_for=None)
    assert [s for _, s, _ in done] == ["restored", "unchanged"]
    assert path.read_bytes() == original
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), None)] == ["unchanged", "unchanged"]


def test_undo_leaves_an_inventory_edited_since(inventory):
    path = Path(inventory.path)
    journal = new_journal(inventory)
    apply_plan(build_plan([libmpi_result()], SPECS, inventory), journal, ApplyContext())
    path.write_text(path.read_text() + "# mine\n")
    mine = path.read_bytes()
    [(_, status, message)] = undo_journal(read_journal(journal.path), None)
    assert status == "failed" and "changed after the fix" in message and path.read_bytes() == mine


def test_a_host_key_is_appended_once_and_its_line_removed_by_undo(inventory, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_bytes(b"10.0.0.1 ssh-ed25519 AAAAother")  # a hand edit: no last newline
    before = known.read_bytes()
    plan = build_plan([host_key_result(known)], SPECS, inventory)
    journal = new_journal(inventory)
    assert [e["status"] for e in apply_plan(plan, journal, ApplyContext())] == ["applied"]
    assert known.read_text().splitlines() == ["10.0.0.1 ssh-ed25519 AAAAother",
                                              "10.0.0.2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY"]
    assert [e["status"] for e in apply_plan(plan, new_journal(inventory), ApplyContext())] == ["unchanged"]
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), None)] == ["restored"]
    assert known.read_bytes() == before + b"\n"  # the newline it needed stays; the key line is gone


def test_remove_lines_removes_one_occurrence_each():
    assert remove_lines(b"x\ny\nx\n", ["x"]) == b"y\nx\n"
    assert remove_lines(b"x\r\ny\n", ["x", "z"]) == b"y\n"


def remote(host, commands, undo=None):
    return Action("x", (host,), "remote", f"on {host}", commands,
                  params={"ssh": f"{host}.local", "user": None, "port": None, "undo": undo})


def test_remote_fixes_run_host_by_host_with_the_timeout_and_stop_at_a_failure(inventory):
    ran = CommandResult("out", "", 0, 0.01)
    runner = FakeSsh({"false": CommandResult("out", "", 1, 0.01)}, default=ran)
    plan = Plan([remote("a", ["true", "false", "never"]), remote("a", ["later"]),
                 remote("b", ["echo b"], undo=["rm b"])], [])
    journal = new_journal(inventory)
    entries = apply_plan(plan, journal, ApplyContext(runner, timeout=7))
    assert [e["status"] for e in entries] == ["failed", "skipped", "applied"]
    assert runner.calls == [("a.local", "true"), ("a.local", "false"), ("b.local", "echo b")]
    assert runner.timeouts == [7, 7, 7]
    assert "(exit 1)" in entries[0]["output"]
    undo_runner = FakeSsh(default=ran)
    done = undo_journal(read_journal(journal.path), lambda: undo_runner)
    assert [s for _, s, _ in done] == ["restored"] and undo_runner.calls[0] == ("b.local", "rm b")


def test_an_unwritable_inventory_stops_before_anything_changes(inventory, monkeypatch):
    from mlxcluster.doctor.fixes import apply

    plan = build_plan([libmpi_result()], SPECS, inventory)
    monkeypatch.setattr(apply, "_writable", lambda p: p.is_dir())
    with pytest.raises(InputError, match="is not writable"):
        check_inventory_writable(plan)
    monkeypatch.setattr(apply, "_writable", lambda p: not p.is_dir())
    with pytest.raises(InputError, match="cannot write cluster.yaml.bak"):
        check_inventory_writable(plan)


def test_read_journal_refuses_what_is_not_a_journal(tmp_path):
    (tmp_path / "j.json").write_text('{"entries": []}')
    with pytest.raises(InputError, match="not a doctor --fix journal"):
        read_journal(tmp_path / "j.json")
    with pytest.raises(InputError, match="no journal at"):
        read_journal(tmp_path / "none.json")
