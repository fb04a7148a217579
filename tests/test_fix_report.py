"""``doctor --fix --html PAGE``: the page says what was fixed, on which host,
each re-checked check before and after, and what is left for the user with
its steps. Through click's runner with the live doctor runs replaced by
reports given in turn (the plan, the fixes, the journal, the inventory edit
and the page are the real ones); the page read in headless chromium
(tests/browser.py) as a person sees it."""

from __future__ import annotations

import re
import sys
from html import unescape
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.doctor import DoctorReport
from mlxcluster.doctor.fixes import session as session_module
from tests.browser import CHROMIUM, render
from tests.conftest import require
from tests.fakes import SUDO_WANTS_PASSWORD, FakeSsh, run_hosts_by
from tests.inventory_support import fix_inventory_text
from tests.report_support import external_references

INVENTORY = fix_inventory_text(["a", "b"])  # the inventory_file fixture's (tests/conftest.py)
LIB = "/opt/venv/lib/libmpi.so.40"
RECOVERY = "shut b down, hold the power button, Options > Terminal, run 'rdma_ctl enable', reboot"
BRIDGE_OFF = "sudo -n networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off"
EVIL = "<script>alert(1)</script>"


def report(*results: CheckResult) -> DoctorReport:
    statuses = {r.status for r in results}
    verdict = "fail" if Status.FAIL in statuses else "warn" if Status.WARN in statuses else "pass"
    return DoctorReport(verdict, list(results), {}, {}, True, 0.1, "lab")


def libmpi(status: Status) -> CheckResult:
    if status is Status.PASS:
        return CheckResult("libmpi-by-hand", "MLX finds libmpi", Status.PASS, {"a": "ok", "b": "ok"})
    return CheckResult("libmpi-by-hand", "MLX finds libmpi", status, {h: f"! {LIB}" for h in "ab"},
                       "set MLX_MPI_LIBNAME", {h: {"MLX_MPI_LIBNAME": LIB} for h in "ab"})


def bridge() -> CheckResult:  # b's bridge holds the ports; its fix needs root there
    return CheckResult("thunderbolt-bridge", "Thunderbolt Bridge does not hold the ports", Status.WARN,
                       {"a": "bridge0 holds no Thunderbolt port", "b": f"! bridge0 holds en1, {EVIL}"},
                       "turn the Thunderbolt Bridge off", {"b": {"members": ["en1", EVIL]}})


def rdma() -> CheckResult:  # no fix: left for the user, with the steps
    return CheckResult("rdma-enabled", "RDMA enabled", Status.FAIL,
                       {"a": "enabled", "b": "✗ rdma_ctl status: disabled"}, RECOVERY)


@pytest.fixture
def session(monkeypatch, inventory_file):
    """The inventory and a doctor whose reports are given in turn. b's sudo wants a
    password: only 'sudo -n true' may run there (any other command fails the test)."""
    reports: list[DoctorReport] = []
    runner = FakeSsh({"sudo -n true": SUDO_WANTS_PASSWORD}, default=None)
    monkeypatch.setattr(session_module, "run_doctor", lambda inv, **k: reports.pop(0))
    run_hosts_by(monkeypatch, runner)
    return inventory_file, reports, runner


def text_of(html: str) -> str:
    """The page's words without its markup (for what the browser test does not cover)."""
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_the_page_shows_what_was_fixed_where_before_after_and_what_is_left(session, tmp_path):
    require(CHROMIUM is not None, "chromium is not installed (apt-get install chromium; make test does)")
    inventory, reports, runner = session
    reports += [report(libmpi(Status.WARN), bridge(), rdma()), report(libmpi(Status.PASS), bridge(), rdma())]
    page = tmp_path / "fixed.html"
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--fix", "--yes", "--html", str(page)])
    assert result.exit_code == 1, result.output  # b's bridge is not fixed, rdma is left
    assert f"wrote {page}" in result.output and LIB in inventory.read_text()
    assert runner.calls == [("10.0.0.2", "sudo -n true")]  # nothing else ran on b
    html = page.read_text()
    assert external_references(html) == [] and EVIL not in html  # escaped, like every value from a host
    journal = re.search(r"undo: mlxcluster doctor --undo (\S+\.json)", result.output).group(1)

    shown = render(page, tmp_path / "fixed.png")

    print(f"--fix page rendered in {shown.seconds:.1f} s", file=sys.stderr)
    assert shown.requests == [page.resolve().as_uri()] and shown.console == []
    text = shown.text
    fixed = text.index("What doctor --fix did")
    assert fixed < text.index("What to fix first")  # above the checks, which are the re-check's
    assert "doctor --fix: 1 change(s) applied on a, b; 1 failed or skipped; 1 of 3 check(s) pass after" in text
    # Per host: what was done there.
    assert re.search(r"a\s+1 applied", text) and re.search(r"b\s+1 applied, 1 failed", text)
    # Each change: its status, check, hosts, what, the exact command.
    assert re.search(r"applied\s+libmpi-by-hand\s+a, b\s+inventory env: MLX_MPI_LIBNAME=" + re.escape(LIB), text)
    assert f"edit {inventory}: env.MLX_MPI_LIBNAME: '{LIB}'" in text
    assert re.search(r"failed\s+thunderbolt-bridge\s+b\s+Thunderbolt Bridge service off on b", text)
    assert BRIDGE_OFF in text
    # Why it failed, and what to run by hand.
    assert "sudo needs a password on b (sudo -n true: sudo: a password is required): nothing was changed" in text
    assert "sudo networksetup -setnetworkserviceenabled 'Thunderbolt Bridge' off" in text
    # Before -> after of every re-checked check.
    verdicts = text[text.index("Before → after"):text.index("Left for you")]
    assert re.search(r"MLX finds libmpi \[libmpi-by-hand\]\s+! warning\s+✓ passed", verdicts)
    assert re.search(r"Thunderbolt Bridge does not hold the ports \[thunderbolt-bridge\]\s+! warning\s+! warning",
                     verdicts)
    assert re.search(r"RDMA enabled \[rdma-enabled\]\s+✗ failed\s+✗ failed", verdicts)
    # Left for you: the blamed hosts and the steps.
    left = text[text.index("Left for you"):text.index("What to fix first")]
    assert "rdma_ctl status: disabled" in left and RECOVERY in left and "turn the Thunderbolt Bridge off" in left
    assert "libmpi" not in left  # fixed
    assert not re.search(r"\ba\s+enabled", left) and re.search(r"\ba\s+enabled", text)  # only b is blamed
    assert f"undo: mlxcluster doctor --undo {journal}" in text


def test_a_dry_run_page_shows_the_plan_and_that_nothing_changed(session, tmp_path):
    inventory, reports, runner = session
    reports.append(report(libmpi(Status.WARN), rdma()))
    page = tmp_path / "plan.html"
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--fix", "--dry-run", "--html", str(page)])
    assert result.exit_code == 1 and inventory.read_text() == INVENTORY and runner.calls == []
    text = text_of(page.read_text())
    assert "doctor --fix: nothing was changed (dry run); 1 change(s) planned" in text
    assert f"planned libmpi-by-hand a, b inventory env: MLX_MPI_LIBNAME={LIB}" in text
    assert "Before → after" not in text and "journal:" not in text
    assert RECOVERY in text[text.index("Left for you"):]


@pytest.mark.parametrize("args, message", [
    (["--fix", "--yes", "--json"], "--fix excludes --json"),
    (["--undo", "j.json"], "--undo JOURNAL excludes --html"),
])
def test_what_still_makes_no_sense_with_html_exits_2(session, tmp_path, args, message):
    inventory, reports, _ = session
    page = tmp_path / "p.html"
    result = CliRunner().invoke(main, ["doctor", *args, "--html", str(page)])
    assert result.exit_code == 2 and message in result.output and not page.exists()


def test_an_unwritable_page_exits_2_before_any_host(session, tmp_path):
    inventory, reports, _ = session
    reports.append(report(libmpi(Status.WARN)))  # would be used if doctor ran
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--fix", "--yes",
                                       "--html", str(tmp_path / "missing" / "p.html")])
    assert result.exit_code == 2 and len(reports) == 1 and inventory.read_text() == INVENTORY
    assert not Path(tmp_path / "missing").exists()
