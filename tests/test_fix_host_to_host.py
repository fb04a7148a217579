"""The host-to-host SSH fix's shell steps, run for real by ``sh`` on this
machine with one HOME per "host" (a runner that stands for the SSH
connections): a key made where there is none, lines added once, twice is
once, the undo puts every ~/.ssh back byte for byte, nothing from a host
reaches a shell unquoted."""

from __future__ import annotations

import shutil
import sys

import pytest

from mlxcluster.doctor.checks.base import CheckResult, CheckSpec, Status
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.host_to_host import HOST_TO_HOST_KEYS, known_name
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.ssh.results import CommandResult
from tests.fakes import FakeSsh

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")

SPECS = [CheckSpec("host-to-host-ssh", "h2h", lambda ctx: None, False, HOST_TO_HOST_KEYS)]
HOST_KEYS = {"a": ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIBkeyOfA"),
             "b": ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIBkeyOfB"),
             "c": ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIBkeyOfC")}


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(f"cluster: c\npython: {sys.executable}\nhosts:\n"
                    "  - name: a\n    ssh: a\n  - name: b\n    ssh: b\n  - name: c\n    ssh: c\n    port: 2222\n")
    inventory = load_inventory(path)
    return inventory, FakeSsh.local(tmp_path / "homes", inventory)


def failing(*targets):
    return CheckResult("host-to-host-ssh", "h2h", Status.WARN, {t: f"! a -> {t}: denied" for t in targets},
                       "copy keys", {t: {"source": "a"} for t in targets})


def plan_for(inventory, hosts, *targets):
    return build_plan([failing(*targets)], SPECS, inventory, hosts.lookup, lambda n: HOST_KEYS[n])


def test_a_new_key_trusted_once_each_way_and_undone_byte_for_byte(cluster):
    inventory, hosts = cluster
    b_ssh = hosts.homes["b"] / ".ssh"
    b_ssh.mkdir()
    (b_ssh / "authorized_keys").write_bytes(b"ssh-ed25519 AAAAmine laptop")  # no last newline
    before = hosts.snapshot()
    plan = plan_for(inventory, hosts, "b", "c")
    assert [a.hosts for a in plan.actions] == [("b",), ("c",)]
    assert "a new key made on a (ssh-keygen -t ed25519 -N '')" in plan.actions[0].what
    assert hosts.snapshot() == before  # planning changed nothing
    journal = Journal.create(fixes_dir(), inventory.path)
    entries = apply_plan(plan, journal, ApplyContext(hosts, timeout=30))
    assert [e["status"] for e in entries] == ["applied", "applied"], entries
    a_ssh = hosts.homes["a"] / ".ssh"
    pub = (a_ssh / "id_ed25519.pub").read_text().strip()
    assert (a_ssh / "id_ed25519").exists() and pub.startswith("ssh-ed25519 ")
    assert (b_ssh / "authorized_keys").read_text() == f"ssh-ed25519 AAAAmine laptop\n{pub}\n"
    assert (hosts.homes["c"] / ".ssh" / "authorized_keys").read_text() == pub + "\n"
    assert (a_ssh / "known_hosts").read_text() == (
        "b ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkeyOfB\n[c]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkeyOfC\n")
    # No private key left its host.
    assert not (hosts.homes["b"] / ".ssh" / "id_ed25519").exists()
    assert not (hosts.homes["c"] / ".ssh" / "id_ed25519").exists()
    # Twice is once: the plan now names a's key, and nothing changes.
    after = hosts.snapshot()
    again = plan_for(inventory, hosts, "b", "c")
    assert again.actions[0].what.startswith("a -> b: a's key")
    assert [e["status"] for e in apply_plan(again, Journal.create(fixes_dir(), inventory.path),
                                            ApplyContext(hosts))] == ["unchanged", "unchanged"]
    assert hosts.snapshot() == after
    done = undo_journal(read_journal(journal.path), lambda: hosts)
    assert [s for _, s, _ in done] == ["restored", "restored"], done
    assert hosts.snapshot() == before


def test_nothing_from_a_host_or_the_inventory_is_run_by_a_shell(cluster, tmp_path):
    inventory, hosts = cluster
    a_ssh = hosts.homes["a"] / ".ssh"
    a_ssh.mkdir()
    trap = tmp_path / "PWNED"
    nasty = f"ssh-ed25519 AAAAkeyA me@a;$(touch {trap});`touch {trap}`'\"\n"
    (a_ssh / "id_ed25519.pub").write_text(nasty)
    (a_ssh / "id_ed25519").write_text("private")
    plan = plan_for(inventory, hosts, "b")
    entries = apply_plan(plan, Journal.create(fixes_dir(), inventory.path), ApplyContext(hosts))
    assert [e["status"] for e in entries] == ["applied"]
    assert (hosts.homes["b"] / ".ssh" / "authorized_keys").read_text() == nasty
    assert not trap.exists()


def test_a_failing_step_keeps_the_undo_of_what_it_did(cluster):
    inventory, hosts = cluster
    before = hosts.snapshot()
    plan = plan_for(inventory, hosts, "b")
    real_run = hosts.run

    def known_hosts_fails(alias, command, **kw):
        if alias == "a" and "known_hosts" in command:
            return CommandResult("", "disk full", 1, 0.0)
        return real_run(alias, command, **kw)

    hosts.run = known_hosts_fails
    journal = Journal.create(fixes_dir(), inventory.path)
    [entry] = apply_plan(plan, journal, ApplyContext(hosts))
    assert entry["status"] == "failed" and "disk full" in entry["output"]
    hosts.run = real_run
    assert [s for _, s, _ in undo_journal(read_journal(journal.path), lambda: hosts)] == ["restored"]
    assert hosts.snapshot() == before


def test_known_hosts_names():
    assert known_name("10.0.0.2", None) == "10.0.0.2"
    assert known_name("mini-1", 22) == "mini-1"
    assert known_name("mini-1", 2222) == "[mini-1]:2222"


def every_pair_failing():
    """No keys between a, b, c: every host blamed, reached by neither other."""
    return CheckResult("host-to-host-ssh", "h2h", Status.WARN,
                       {t: f"! others -> {t}: denied" for t in "abc"}, "copy keys",
                       {t: {"sources": [s for s in "abc" if s != t]} for t in "abc"})


def test_every_pair_each_public_key_once_everywhere_only_public_keys_travel(cluster):
    """The issue's fix: each host's public key appended once to every other
    host's authorized_keys, every other host's key in each known_hosts, a key
    made where there is none, never a private key copied; twice is once, and
    the undo puts every ~/.ssh back byte for byte."""
    inventory, hosts = cluster
    before = hosts.snapshot()
    plan = build_plan([every_pair_failing()], SPECS, inventory, hosts.lookup, lambda n: HOST_KEYS[n])
    assert [a.what.split(":")[0] for a in plan.actions] == ["a -> b", "a -> c", "b -> a", "b -> c",
                                                            "c -> a", "c -> b"]
    assert "a new key made on a (ssh-keygen -t ed25519 -N '')" in plan.actions[0].what
    assert "the key made on a in c's" in plan.actions[1].what
    journal = Journal.create(fixes_dir(), inventory.path)
    entries = apply_plan(plan, journal, ApplyContext(hosts, timeout=30))
    assert [e["status"] for e in entries] == ["applied"] * 6, entries
    ssh = {n: hosts.homes[n] / ".ssh" for n in "abc"}
    pub = {n: (ssh[n] / "id_ed25519.pub").read_text() for n in "abc"}
    private = {n: (ssh[n] / "id_ed25519").read_bytes() for n in "abc"}
    assert len(set(private.values())) == 3  # each host made its own; none was copied
    for n in "abc":
        others = [o for o in "abc" if o != n]
        assert sorted(f.name for f in ssh[n].iterdir()) == ["authorized_keys", "id_ed25519", "id_ed25519.pub",
                                                            "known_hosts"]
        assert (ssh[n] / "authorized_keys").read_text() == "".join(pub[o] for o in others)
        names = {"a": "a", "b": "b", "c": "[c]:2222"}
        assert (ssh[n] / "known_hosts").read_text() == "".join(
            f"{names[o]} {' '.join(HOST_KEYS[o])}\n" for o in others)
    after = hosts.snapshot()
    again = build_plan([every_pair_failing()], SPECS, inventory, hosts.lookup, lambda n: HOST_KEYS[n])
    assert all(a.what.split(": ", 1)[1].startswith(f"{a.what[0]}'s key") for a in again.actions)
    assert [e["status"] for e in apply_plan(again, Journal.create(fixes_dir(), inventory.path),
                                            ApplyContext(hosts))] == ["unchanged"] * 6
    assert hosts.snapshot() == after
    done = undo_journal(read_journal(journal.path), lambda: hosts)
    assert [s for _, s, _ in done] == ["restored"] * 6, done
    assert hosts.snapshot() == before  # the keys, files and ~/.ssh folders made are gone


def test_the_check_judges_every_pair_and_hands_its_fix_the_broken_ones():
    from types import SimpleNamespace

    from mlxcluster.doctor.checks.base import CheckContext
    from mlxcluster.doctor.checks.ssh import host_to_host
    from mlxcluster.ssh.results import Outcome

    ok = CommandResult("", "", 0, 0.1)

    def denied(t):
        return CommandResult("", f"root@{t}: Permission denied (publickey).\r\n", 255, 0.1)

    # a reaches both; b reaches a only; c reaches neither.
    live = SimpleNamespace(host_to_host_source="a",
                           host_to_host={"a": {"b": Outcome("b", value=ok), "c": Outcome("c", value=ok)},
                                         "b": {"c": Outcome("c", value=denied("c")), "a": Outcome("a", value=ok)},
                                         "c": {"a": Outcome("a", value=denied("a")),
                                               "b": Outcome("b", value=denied("b"))}},
                           paramiko={n: Outcome(n, value=True) for n in "abc"})
    verdict = host_to_host(CheckContext(captures={}, live=True, backend="mpi", services={"live": live}))
    assert verdict.status is Status.WARN
    assert verdict.evidence == {"a": "! c -> a: ssh a: key authentication failed",
                                "b": "! c -> b: ssh b: key authentication failed",
                                "c": "! b -> c: ssh c: key authentication failed"}
    assert verdict.fix_data == {"a": {"sources": ["c"]}, "b": {"sources": ["c"]}, "c": {"sources": ["b"]}}
    assert "on b, c: " in verdict.hint
    healed = SimpleNamespace(**{**vars(live), "host_to_host": {
        "a": live.host_to_host["a"], "b": {"c": Outcome("c", value=ok), "a": Outcome("a", value=ok)},
        "c": {"a": Outcome("a", value=ok), "b": Outcome("b", value=ok)}}})
    passed = host_to_host(CheckContext(captures={}, live=True, backend="mpi", services={"live": healed}))
    assert passed.status is Status.PASS and passed.fix_data == {}
    assert passed.evidence == {"a": "b, c -> a: ok", "b": "a, c -> b: ok", "c": "a, b -> c: ok"}


def test_the_check_hands_its_fix_the_hosts_the_first_host_cannot_reach():
    from types import SimpleNamespace

    from mlxcluster.doctor.checks.base import CheckContext
    from mlxcluster.doctor.checks.ssh import host_to_host
    from mlxcluster.ssh.results import Outcome

    denied = CommandResult("", "root@b: Permission denied (publickey).\r\n", 255, 0.1)
    live = SimpleNamespace(host_to_host_source="a",
                           host_to_host={"a": {"b": Outcome("b", value=denied),
                                               "c": Outcome("c", value=CommandResult("", "", 0, 0.1))}},
                           paramiko={n: Outcome(n, value=True) for n in "abc"})
    verdict = host_to_host(CheckContext(captures={}, live=True, backend="mpi", services={"live": live}))
    assert verdict.status is Status.WARN and verdict.fix_data == {"b": {"sources": ["a"]}}
    ring = host_to_host(CheckContext(captures={}, live=True, backend="ring", services={"live": live}))
    assert ring.status is Status.SKIP and ring.fix_data == {}
