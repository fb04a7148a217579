"""The mlx-version fix: X chosen (most hosts, a tie to this machine's, --mlx-version), the
pip download commands per platform built from captured probe facts (the
macOS outputs in tests/fixtures/macos), the install and its undo run for
real by ``sh`` on this machine with a HOME per "host" (pip stood in for by
a script that records what it was asked), the refusal of another Python,
and an unknown --mlx-version refused before any host is probed."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.doctor import DoctorReport, load_checks
from mlxcluster.doctor.fixes import mlx_version as fix
from mlxcluster.doctor.fixes import session as session_module
from mlxcluster.doctor.fixes import wheels as wheels_module
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts.capture import PROBE, SW_VERS, HostCapture
from tests.fakes import FakeSsh, run_hosts_by
from tests.inventory_support import fix_inventory_text, inventory_of

FIXTURES = Path(__file__).parent / "fixtures" / "macos"
HERE = sys.executable
HERE_MLX = metadata.version("mlx")  # this machine's: wins a tie it is part of
SPEC = next(s for s in load_checks() if s.id == "mlx-version")


def uname_machine(name: str) -> str:
    """The last word of a captured ``uname -a``: the CPU (arm64)."""
    return (FIXTURES / name).read_text().split()[-1]


def mac(name: str, mlx: str | None, *, sw_vers: str = "sw_vers_macos26.6.2_25G83.txt",
        python: str = "/opt/venv/bin/python", py: str = "3.12.4") -> HostCapture:
    """A Mac as the probe reports it: the OS version from a real sw_vers
    capture, the CPU from a real uname -a capture."""
    probe = {"probe_version": 1, "hostname": name, "platform": "darwin",
             "os": {"system": "Darwin", "machine": uname_machine("uname_a_macos26.4_m2_macbook_air.txt")},
             "python": {"executable": python, "version": py},
             "mlx": {"version": mlx, "import_ok": mlx is not None,
                     "import_error": None if mlx else "ModuleNotFoundError: No module named 'mlx'"}}
    return HostCapture(name, {PROBE: json.dumps(probe), SW_VERS: (FIXTURES / sw_vers).read_text()})


def linux(name: str, mlx: str, libc: str = "glibc 2.36", py: str = "3.11.7") -> HostCapture:
    probe = {"probe_version": 1, "hostname": name, "platform": "linux",
             "os": {"system": "Linux", "machine": "x86_64", "name": "Debian GNU/Linux", "libc": libc},
             "python": {"executable": "/opt/venv/bin/python", "version": py},
             "mlx": {"version": mlx, "import_ok": True}}
    return HostCapture(name, {PROBE: json.dumps(probe)})


def check(captures: dict[str, HostCapture], inventory=None):
    ctx = CheckContext(captures, inventory=inventory, live=True)
    return SPEC.fn(ctx)


def plan_for(captures, options=None, python="/opt/venv/bin/python"):
    result = check(captures)
    return result, build_plan([result], [SPEC], inventory_of(captures, python),
                              options=options)


# ---- choosing X ----

def test_x_is_the_version_most_hosts_have():
    assert fix.choose_version({"a": "0.32.4", "b": "0.32.3", "c": "0.32.4"}) == ("0.32.4", "on 2 of 3 hosts")


def test_a_tie_goes_to_this_machines_mlx_else_to_the_newest(monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: {"mlx": "0.32.3"}.get(dist))
    assert fix.choose_version({"a": "0.32.3", "b": "0.32.4"}) == \
        ("0.32.3", "this machine's version (a tie: 1 host each)")
    monkeypatch.setattr(fix, "version_here", lambda dist: {"mlx": "0.31.0"}.get(dist))
    assert fix.choose_version({"a": "0.32.3", "b": "0.32.4"}) == ("0.32.4", "the newest (a tie: 1 host each)")


def test_mlx_version_wins_over_the_majority_and_a_tie():
    assert fix.choose_version({"a": "0.32.3", "b": "0.32.4"}, "0.31.2") == ("0.31.2", "--mlx-version")
    assert fix.choose_version({"a": "0.32.4", "b": "0.32.4", "c": "0.32.3"}, "0.32.3")[0] == "0.32.3"


def test_a_broken_mlx_does_not_count_as_a_version():
    assert fix.choose_version({"a": None, "b": "0.32.4"})[0] == "0.32.4"
    # no host's mlx imports: this machine's
    assert fix.choose_version({"a": None, "b": None}) == (HERE_MLX, "this machine's version (no host has mlx)")


def test_two_macs_on_two_versions_the_plan_installs_this_machines_and_says_why(monkeypatch):
    older = "0.32.3" if HERE_MLX != "0.32.3" else "0.32.2"
    result, plan = plan_for({"a": mac("a", older), "b": mac("b", HERE_MLX)})
    assert result.status is Status.FAIL and result.hosts["b"] == f"mlx {HERE_MLX}"
    assert result.hosts["a"] == f"✗ mlx {older} (others: {HERE_MLX}) with /opt/venv/bin/python"
    assert result.hint == (f"on a: /opt/venv/bin/python -m pip install mlx=={HERE_MLX} (mlx {HERE_MLX}: this machine's "
                           "version (a tie: 1 host each); or doctor --fix: the wheels fetched here and sent over SSH; "
                           "doctor --fix --mlx-version V installs another)")
    [action] = plan.actions
    assert action.hosts == ("a",) and plan.left == []
    assert action.what == (f"mlx {older} -> mlx {HERE_MLX} in /opt/venv/bin/python (Darwin arm64, Python 3.12); "
                           f"mlx {HERE_MLX}: this machine's version (a tie: 1 host each)")
    # --mlx-version still wins: the other host changes instead
    _, chosen = plan_for({"a": mac("a", older), "b": mac("b", HERE_MLX)}, {"mlx_version": older})
    [action] = chosen.actions
    assert action.hosts == ("b",) and action.what.endswith(f"; mlx {older}: --mlx-version")
    # neither is this machine's: the newest of the two, for the check and the fix alike
    monkeypatch.setattr(fix, "version_here", lambda dist: None)
    result, plan = plan_for({"a": mac("a", "0.32.3"), "b": mac("b", "0.32.4")})
    assert "(mlx 0.32.4: the newest (a tie: 1 host each);" in result.hint
    assert [a.hosts for a in plan.actions] == [("a",)]


# ---- the pip download commands, per platform ----

def test_a_mac_on_macos_26_gets_the_macos_26_arm64_wheels_of_its_python():
    result, plan = plan_for({"a": mac("a", "0.32.4"), "b": mac("b", "0.32.4"),
                             "c": mac("c", "0.32.3", sw_vers="sw_vers_macos26.4_25E246_m2_macbook_air_double_tab.txt")})
    assert result.status is Status.FAIL
    [action] = plan.actions
    assert action.hosts == ("c",) and action.kind == "mlx-install"
    cache = fix.wheel_cache()
    common = ["--no-deps", "--only-binary=:all:", "--platform", "macosx_26_0_arm64", "--python-version", "3.12",
              "--implementation", "cp", "--abi", "cp312", "--disable-pip-version-check", "-d"]
    assert action.commands[:2] == [
        "here: " + " ".join([HERE, "-m", "pip", "download", "mlx==0.32.4", "mlx-metal==0.32.4", *common,
                             f"{cache}/mlx-0.32.4/macosx_26_0_arm64-cp312"]),
        "here: " + " ".join([HERE, "-m", "pip", "download", "mlx==0.32.3", "mlx-metal==0.32.3", *common,
                             f"{cache}/mlx-0.32.3/macosx_26_0_arm64-cp312"])]
    assert action.what == ("mlx 0.32.3 -> mlx 0.32.4 in /opt/venv/bin/python (Darwin arm64, Python 3.12); "
                           "mlx 0.32.4: on 2 of 3 hosts")


def test_an_older_macos_gets_its_own_major_version_tag():
    f = check({"a": mac("a", "0.32.3", sw_vers="sw_vers_macos12.6_21G115_m1pro_single_tab.txt"),
               "b": mac("b", "0.32.4"), "c": mac("c", "0.32.4")}).fix_data["a"]
    assert f["os_version"] == "12.6"
    assert fix.platform_tags(fix.target_of(f)) == ["macosx_12_0_arm64"]


def test_linux_lists_every_manylinux_its_glibc_runs_and_fetches_mlx_cpu():
    t = fix.Target("Linux", "x86_64", "3.11.7", libc="glibc 2.36")
    tags = fix.platform_tags(t)
    assert tags[0] == "manylinux_2_36_x86_64" and tags[-1] == "manylinux_2_17_x86_64" and len(tags) == 20
    argv = fix.download_argv("/usr/bin/python3", t, "0.32.4", "/tmp/w")
    assert argv[:6] == ["/usr/bin/python3", "-m", "pip", "download", "mlx==0.32.4", "mlx-cpu==0.32.4"]
    assert argv[6:8] == ["--no-deps", "--only-binary=:all:"]
    assert argv[8:48:2] == ["--platform"] * 20 and argv[9:48:2] == tags
    assert argv[48:] == ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                         "--disable-pip-version-check", "-d", "/tmp/w"]
    with pytest.raises(ValueError, match="not glibc"):
        fix.platform_tags(fix.Target("Linux", "x86_64", "3.11.7", libc="musl 1.2"))


def test_wheels_are_found_by_the_names_pip_download_saves(tmp_path):
    dest = tmp_path
    for name in ("mlx-0.32.4-cp312-cp312-macosx_14_0_arm64.whl", "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl",
                 "mlx-0.32.3-cp312-cp312-macosx_14_0_arm64.whl"):
        (dest / name).write_bytes(b"x")

    def wheels_in(version):  # what wheels.fetched looks for: each requirement's wheel, where there is one
        found = (wheels_module.wheel_of(dest, *r.split("==")) for r in fix.requirements("Darwin", version))
        return [w.name for w in found if w]

    assert wheels_in("0.32.4") == [
        "mlx-0.32.4-cp312-cp312-macosx_14_0_arm64.whl", "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl"]
    assert wheels_in("0.32.3") == ["mlx-0.32.3-cp312-cp312-macosx_14_0_arm64.whl"]


# ---- another Python: refused, with what to do ----

def test_a_host_on_another_python_is_not_changed_and_the_plan_says_what_to_do():
    result, plan = plan_for({"a": mac("a", "0.32.4"), "b": mac("b", "0.32.4"), "e": mac("e", "0.32.4"),
                             "c": mac("c", "0.32.3", py="3.11.9"), "d": mac("d", "0.32.3")})
    assert [a.hosts for a in plan.actions] == [("d",)]
    assert plan.left == [result]
    assert ("c runs Python 3.11, the others 3.12: --fix does not change a host's Python: install Python 3.12 "
            "there and the same venv at /opt/venv/bin/python, or point the inventory's python for c at a "
            "Python 3.12 that has mlx") in result.hint


# ---- install, send, undo: run by sh here, one HOME per host ----

@pytest.fixture
def stand_in_python(tmp_path):
    """A python whose pip records its arguments and says it installed what it
    was asked (as pip does); anything else is the real python."""
    folder = tmp_path / "venv" / "bin"
    folder.mkdir(parents=True)
    py = folder / "python"
    py.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; '
                  f'printf "%s|" "$@" >> "$HOME/pip.log"; echo >> "$HOME/pip.log"; '
                  f'echo "Successfully installed $(printf "%s\\n" "$@" | grep == | sed s/==/-/ | tr "\\n" " ")"; '
                  f'exit 0; fi\nexec {HERE} "$@"\n')
    py.chmod(0o755)
    return str(py)


def fake_fetch(calls):
    def fetch(argv, dest, timeout):
        calls.append(argv)
        version = argv[4].split("==")[1]
        (dest / f"mlx-{version}-cp312-cp312-macosx_26_0_arm64.whl").write_bytes(b"mlx " + version.encode() * 999)
        (dest / f"mlx_metal-{version}-py3-none-macosx_26_0_arm64.whl").write_bytes(b"metal " + version.encode())
    return fetch


def test_wheels_fetched_once_sent_installed_from_the_file_and_undone(tmp_path, monkeypatch, stand_in_python):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fetches = []
    monkeypatch.setattr(wheels_module, "fetch", fake_fetch(fetches))
    caps = {n: mac(n, v, python=stand_in_python) for n, v in (("a", "0.32.4"), ("b", "0.32.3"), ("c", "0.32.3"))}
    _, plan = plan_for(caps, {"mlx_version": "0.32.4"}, python=stand_in_python)  # not the most hosts' one
    assert [a.hosts for a in plan.actions] == [("b",), ("c",)]
    hosts = FakeSsh.local(tmp_path / "hosts", inventory_of(caps))
    journal = Journal.create(fixes_dir(), "/tmp/x/cluster.yaml")
    entries = apply_plan(plan, journal, ApplyContext(hosts))
    assert [e["status"] for e in entries] == ["applied", "applied"], entries
    assert len(fetches) == 2  # 0.32.4 and 0.32.3 once each, for both hosts (same platform and Python)
    wheels = fix.wheel_cache() / "mlx-0.32.4" / "macosx_26_0_arm64-cp312"
    for name in ("b", "c"):
        got = hosts.homes[name] / ".cache/mlxcluster/wheels"
        assert sorted(p.name for p in got.iterdir()) == sorted(
            f"{w}-{v}-{t}-macosx_26_0_arm64.whl" for v in ("0.32.3", "0.32.4")
            for w, t in (("mlx", "cp312-cp312"), ("mlx_metal", "py3-none")))
        assert (got / "mlx-0.32.4-cp312-cp312-macosx_26_0_arm64.whl").read_bytes() == \
            (wheels / "mlx-0.32.4-cp312-cp312-macosx_26_0_arm64.whl").read_bytes()
        assert (hosts.homes[name] / "pip.log").read_text().splitlines() == [
            f"install|--isolated|--disable-pip-version-check|--no-index|--find-links|{got}|mlx==0.32.4|mlx-metal==0.32.4|"]
    assert "a" not in {h for h, _ in hosts.calls}

    # Twice is once: the host's wheels are known by sha256, nothing is sent again.
    again = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(hosts))
    assert "sent 0 wheel(s) (the host had them)" in again[0]["output"]

    done = undo_journal(read_journal(journal.path), lambda: hosts)
    assert [s for _, s, _ in done] == ["restored", "restored"]
    for name in ("b", "c"):
        log = (hosts.homes[name] / "pip.log").read_text().splitlines()
        assert log[-1].endswith("|mlx==0.32.3|mlx-metal==0.32.3|")
    assert journal.path.exists()


def test_the_install_and_undo_commands_quote_the_python_and_read_no_index():
    assert fix.install_command("/Users/me/my venv/bin/python", "Darwin", "0.32.4") == (
        "'/Users/me/my venv/bin/python' -m pip install --isolated --disable-pip-version-check --no-index "
        '--find-links "$HOME/.cache/mlxcluster/wheels" mlx==0.32.4 mlx-metal==0.32.4')
    assert fix.install_command("/opt/venv/bin/python", "Linux", "0.32.3") == (
        "/opt/venv/bin/python -m pip install --isolated --disable-pip-version-check --no-index "
        '--find-links "$HOME/.cache/mlxcluster/wheels" mlx==0.32.3 mlx-cpu==0.32.3')


def test_a_wheel_cut_short_is_not_put_in_place(tmp_path, monkeypatch, stand_in_python):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(wheels_module, "fetch", fake_fetch([]))
    _, plan = plan_for({"a": mac("a", "0.32.4", python=stand_in_python), "b": mac("b", "0.32.3", python=stand_in_python)},
                       {"mlx_version": "0.32.4"}, python=stand_in_python)
    hosts = FakeSsh.local(tmp_path / "hosts", inventory_of(["a", "b"]), stdin_cut_short=True)
    [entry] = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(hosts))
    assert entry["status"] == "failed" and "did not arrive whole" in entry["output"]
    assert not list((hosts.homes["b"] / ".cache/mlxcluster/wheels").glob("*.whl"))
    assert not (hosts.homes["b"] / "pip.log").exists()


# ---- --mlx-version on the command line ----

def test_an_unknown_mlx_version_exits_2_before_any_host_is_probed(tmp_path, monkeypatch):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(fix_inventory_text(["a"]))

    def touched(*a, **k):
        raise AssertionError("a host was reached")

    hosts = run_hosts_by(monkeypatch, FakeSsh(default=None))  # any command fails the test
    monkeypatch.setattr(session_module, "run_doctor", touched)
    monkeypatch.setattr(fix, "available_versions", lambda: ["0.32.4", "0.32.3"])
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--fix", "--yes", "--mlx-version", "0.99.0"])
    assert result.exit_code == 2, result.output
    assert "mlx 0.99.0 is not on the package index" in result.output
    assert "0.32.4, 0.32.3" in result.output
    assert not list(fixes_dir().glob("*.json"))
    without_fix = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--mlx-version", "0.32.4"])
    assert without_fix.exit_code == 2 and "--mlx-version goes with --fix" in without_fix.output
    assert hosts.calls == []


def test_the_index_versions_are_read_from_pip_index_versions(monkeypatch):
    out = "mlx (0.32.4)\nAvailable versions: 0.32.4, 0.32.3, 0.2.0\n"
    monkeypatch.setattr(fix.subprocess, "run", lambda argv, **k: subprocess.CompletedProcess(argv, 0, out, ""))
    assert fix.available_versions() == ["0.32.4", "0.32.3", "0.2.0"]
    fix.check_mlx_version("0.32.3")


def test_mlx_version_reaches_the_plan_of_a_dry_run(tmp_path, monkeypatch, hosts_run_by):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(fix_inventory_text(["a", "b"]))
    result = check({"a": mac("a", "0.32.4"), "b": mac("b", "0.32.3")})

    hosts_run_by(FakeSsh(default=None))
    monkeypatch.setattr(session_module, "run_doctor", lambda *a, **k: DoctorReport("x", [result], {}, {}, True, 0.1, "lab"))
    monkeypatch.setattr(fix, "available_versions", lambda: ["0.32.4", "0.32.3", "0.31.2"])
    out = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--fix", "--dry-run", "--mlx-version", "0.31.2"])
    assert out.exit_code == 1, out.output
    assert "fix plan: 2 change(s) for 2 host(s)" in out.output
    assert "  [mlx-version] a: mlx 0.32.4 -> mlx 0.31.2 in /opt/venv/bin/python (Darwin arm64, Python 3.12)" in out.output
    assert "  [mlx-version] b: mlx 0.32.3 -> mlx 0.31.2" in out.output
    assert "dry run: nothing was changed" in out.output
