"""Test fixtures used across modules: where the real macOS captures are, and CI policy.

Under CI=true a test that needs the lab, mlx or Open MPI and cannot run FAILS;
it never skips. Outside CI it skips with one clear reason.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# MLX's CPU kernels are built once for the whole run (tests/kernel_cc/g++): the ranks of
# a local job meet each kernel at the same moment, and each would build it. The lab's
# hosts have the same g++ first on their PATH (tests/lab: Lab.shares_kernels);
# MLXCLUSTER_LAB_OWN_KERNELS=1 turns both off (bench/suite_cpu.py measures the two).
if os.environ.get("MLXCLUSTER_LAB_OWN_KERNELS", "") not in ("1", "true"):
    _KERNEL_CC = str(REPO / "tests" / "kernel_cc")
    if _KERNEL_CC not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = _KERNEL_CC + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(autouse=True)
def _no_user_inventory(monkeypatch, tmp_path_factory):
    """No test picks up the default inventory of the person running the tests
    ($MLXCLUSTER_INVENTORY, ~/.config/mlxcluster/cluster.yaml): commands see an
    inventory only where a test puts one. Tests that need "no ./cluster.yaml"
    chdir to a folder of their own."""
    monkeypatch.delenv("MLXCLUSTER_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))


# MLXCLUSTER_TEST_SHUFFLE=SEED runs the tests in an order shuffled by SEED
# (`make test-shuffled`): every test must pass alone and in any order. Every
# xdist worker collects the same order from the same seed, as xdist requires.
SHUFFLE_SEED = os.environ.get("MLXCLUSTER_TEST_SHUFFLE", "")


# Otherwise the test files run longest first, by the seconds each took in a
# measured run (tests/durations.json, `make test-durations`): `make test`
# hands whole files to its parallel workers in this order (xdist's
# loadscope, not reordered), so the long ones start at once and the short
# ones fill in beside them, instead of one long file starting last. A file
# not measured yet counts 0 s and runs after the measured ones.
DURATIONS = REPO / "tests" / "durations.json"


# The quick lane (`make test-quick`, --quick): every test that needs no lab and starts
# no multi-rank launch, for the edit-run loop. Which tests launch is measured, not
# guessed: `make test-launches` runs the suite watching each test's processes for a
# launcher or a rank (LAUNCH_MARKS) and writes tests/launches.json; a new test counts
# as quick until it is recorded.
LAUNCHES = REPO / "tests" / "launches.json"
LAUNCH_MARKS = ("mlx.launch", "mpirun", "prterun", "rank_wrapper", "MLX_RANK=")


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="FILE", default=None,
                     help="write each test file's seconds (setup, call and teardown) to FILE as JSON")
    parser.addoption("--quick", action="store_true", default=False,
                     help="only the tests that need no lab and start no multi-rank launch "
                          "(tests/launches.json)")
    parser.addoption("--record-launches", metavar="FILE", default=None,
                     help="write the tests that start a launcher or ranks to FILE as JSON")


def pytest_report_header(config):
    return f"test order shuffled with seed {SHUFFLE_SEED}" if SHUFFLE_SEED else None


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if config.getoption("--quick"):
        launching = set(json.loads(LAUNCHES.read_text())) if LAUNCHES.is_file() else set()
        slow = [item for item in items
                if item.get_closest_marker("lab") or item.nodeid in launching]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item not in set(slow)]
    if SHUFFLE_SEED:
        random.Random(SHUFFLE_SEED).shuffle(items)
        return
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file_of(item.nodeid), index)
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), 0.0),
                                 first_seen[_file_of(item.nodeid)]))


# --record-durations FILE: the seconds of each file, summed from every
# report (xdist's controller gets its workers' reports), written at the end.
_RECORDING: dict = {"to": None, "seconds": {}, "launches_to": None, "test_seconds": {},
                    "launching": set()}


def pytest_configure(config):
    _RECORDING["to"] = config.getoption("--record-durations")
    _RECORDING["launches_to"] = config.getoption("--record-launches")


def pytest_runtest_logreport(report):
    if _RECORDING["to"]:
        seconds = _RECORDING["seconds"]
        seconds[_file_of(report.nodeid)] = seconds.get(_file_of(report.nodeid), 0.0) + report.duration
    if _RECORDING["launches_to"]:
        test_seconds = _RECORDING["test_seconds"]
        test_seconds[report.nodeid] = test_seconds.get(report.nodeid, 0.0) + report.duration
        if ("launched", True) in report.user_properties:
            _RECORDING["launching"].add(report.nodeid)


class _LaunchWatch:
    """Looks at this process's descendants every 0.1 s while a test runs: did one of
    them run a launcher or a rank (LAUNCH_MARKS in its command line or environment)?
    A launch lasts seconds; the ranks' environment carries MLX_RANK."""

    def __init__(self) -> None:
        import threading

        self.seen = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _looks_launched(self, proc) -> bool:
        import psutil

        try:
            words = " ".join(proc.cmdline())
            if any(mark in words for mark in LAUNCH_MARKS):
                return True
            return "MLX_RANK" in proc.environ()
        except psutil.Error:
            return False

    def _watch(self) -> None:
        import psutil

        me = psutil.Process()
        while not self.seen and not self.done.wait(0.1):
            try:
                children = me.children(recursive=True)
            except psutil.Error:
                continue
            self.seen = any(self._looks_launched(child) for child in children)

    def stop(self) -> bool:
        self.done.set()
        self.thread.join()
        return self.seen


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    watch = _LaunchWatch() if item.config.getoption("--record-launches") else None
    item.stash[_LAUNCH_WATCH] = watch
    yield


_LAUNCH_WATCH = pytest.StashKey[object]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    watch = item.stash.get(_LAUNCH_WATCH, None)
    if watch is not None and call.when == "teardown" and watch.stop():
        outcome.get_result().user_properties.append(("launched", True))


def require(condition: bool, reason: str) -> None:
    """Skip outside CI, fail under CI=true, when a test's prerequisite is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


# Real captures from real Macs, each with its source in SOURCES.md beside them.
# They live in the repository: a clone alone must pass its tests.
MACOS_FIXTURES = REPO / "tests" / "fixtures" / "macos"


@pytest.fixture(scope="session")
def macos_fixtures() -> Path:
    return MACOS_FIXTURES


# ---- no test writes into the working tree (tests/worktree_guard.py) --------------------

_WORKTREE_BEFORE = pytest.StashKey[object]()


def pytest_sessionstart(session):
    from tests.worktree_guard import snapshot

    if not hasattr(session.config, "workerinput"):  # once per run, in the controller
        session.config.stash[_WORKTREE_BEFORE] = snapshot(REPO)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when it left output in the repository: a test writes into
    a temporary folder (tmp_path), never the checkout."""
    from tests.worktree_guard import left_behind, snapshot

    if _RECORDING["to"] and not hasattr(session.config, "workerinput"):
        measured = dict(sorted(((f, round(t, 1)) for f, t in _RECORDING["seconds"].items()),
                               key=lambda pair: -pair[1]))
        Path(_RECORDING["to"]).write_text(json.dumps(measured, indent=1) + "\n")
    if _RECORDING["launches_to"] and not hasattr(session.config, "workerinput"):
        launching = {nodeid: round(_RECORDING["test_seconds"][nodeid], 1)
                     for nodeid in sorted(_RECORDING["launching"])}
        Path(_RECORDING["launches_to"]).write_text(json.dumps(launching, indent=1) + "\n")
    before = session.config.stash.get(_WORKTREE_BEFORE, None)
    after = snapshot(REPO) if before is not None else None
    left = left_behind(before, after) if after is not None else []
    if not left:
        return
    shown = left[:20] + ([f"... and {len(left) - 20} more"] if len(left) > 20 else [])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"this test run left {len(left)} path(s) in the working tree {REPO} (a test must "
             "write into a temporary folder: tmp_path, cwd=tmp_path, monkeypatch.chdir(tmp_path)):",
             *(f"  {p}" for p in shown)]
    if reporter is not None:
        reporter.write_line("")  # after the progress line
        reporter.section("files left in the working tree", sep="=", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---- the fine-tuning tests' model and data ---------------------------------------------

@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    """A tiny random Llama 3 folder (mlx-lm's classes and writer) with a BPE tokenizer trained
    here: the fine-tuning tests' model, made once per run. Tests only read it (a test that
    changes a model works on a copy)."""
    from tests.hf_support import LLAMA3_CONFIG, make_llama_folder, train_tokenizer

    return make_llama_folder(tmp_path_factory.mktemp("hf") / "tiny-llama", LLAMA3_CONFIG,
                             tokenizer=train_tokenizer())


@pytest.fixture(scope="session")
def llama_data(llama, tmp_path_factory):
    """200 stories of the bundled corpus tokenized with `llama`'s tokenizer, made once per
    run; tests only read it."""
    from reference_train import prepare

    out = tmp_path_factory.mktemp("data") / "llama"
    assert prepare.main(["--out", str(out), "--tokenizer", str(llama), "--stories", "200"]) == 0
    return out


# ---- inventories and doctor runs without hosts (tests/inventory_support.py, tests/fakes.py) --

@pytest.fixture
def inventory_file(request, tmp_path) -> Path:
    """tmp_path/cluster.yaml holding the test module's INVENTORY text: the inventory its
    tests give commands, edit (doctor --fix) and compare with that text byte for byte."""
    path = tmp_path / "cluster.yaml"
    path.write_text(request.module.INVENTORY)
    return path


@pytest.fixture
def inventory(inventory_file):
    """``inventory_file`` loaded."""
    from mlxcluster.inventory.inventory import load_inventory

    return load_inventory(inventory_file)


@pytest.fixture
def hosts_run_by(monkeypatch):
    """``hosts_run_by(fake)``: every command any layer runs on a host goes to ``fake``
    (tests/fakes.py's ``run_hosts_by``). Returns ``fake``."""
    from tests.fakes import run_hosts_by

    return lambda fake: run_hosts_by(monkeypatch, fake)


@pytest.fixture
def doctor_asked(tmp_path, monkeypatch, hosts_run_by):
    """An inventory, and what run_doctor is asked for (its trainer_modules) by doctor and
    doctor --fix, run_doctor standing in for the hosts (no command reaches one)."""
    from mlxcluster.doctor import request as doctor_request
    from mlxcluster.doctor.doctor import DoctorReport
    from mlxcluster.doctor.fixes import session
    from tests.fakes import FakeSsh

    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("cluster: c\npython: /usr/bin/python3\nhosts:\n  - {name: a, ssh: a.local}\n")
    asked = []

    def run_doctor(inv, **kwargs):
        asked.append(kwargs.get("trainer_modules"))
        return DoctorReport("pass", [], {}, {}, True, 0.1, "c")

    monkeypatch.setattr(doctor_request, "run_doctor", run_doctor)
    monkeypatch.setattr(session, "run_doctor", run_doctor)
    hosts_run_by(FakeSsh(default=None))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return str(inventory), asked
