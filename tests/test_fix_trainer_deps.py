"""trainer-deps and its fix: what the trainer's ranks import is probed
without importing it (real probe output, here and in a venv without those
packages), judged (always numpy and PyYAML; tokenizers when `train`'s data
needs it), and the missing distributions installed from wheels fetched
here: the pip download commands, the send, the install and its undo run for
real by ``sh`` with a HOME per "host" (pip stood in for by a script that
records what it was asked and answers as pip does)."""

from __future__ import annotations

import ast
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcluster.doctor.checks import software
from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.doctor import load_checks
from mlxcluster.doctor.fixes import trainer_deps as fix
from mlxcluster.doctor.fixes import wheels as wheels_module
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts.capture import PROBE, HostCapture
from mlxcluster.launch.trainer import data_modules
from reference_train.config import build_config
from tests.fakes import FakeSsh
from tests.inventory_support import inventory_of
from tests.probe_support import load_probe_module, run_probe

HERE = sys.executable
SPEC = next(s for s in load_checks() if s.id == "trainer-deps")
TRAIN = Path(__file__).parent.parent / "reference_train"


@pytest.fixture(scope="module")
def real_probe() -> dict:
    facts = run_probe()
    facts.pop("raw")
    return facts


def hosts(base: dict, python: str = "/opt/venv/bin/python", **missing) -> dict[str, HostCapture]:
    """Three hosts from the real probe; missing[name]: the modules that host lacks."""
    out = {}
    for name in ("a", "b", "c"):
        facts = copy.deepcopy(base)
        facts["hostname"], facts["python"]["executable"] = name, python
        for module in missing.get(name, ()):
            facts["trainer_modules"][module].update(found=False, version=None)
        out[name] = HostCapture(name, {PROBE: json.dumps(facts)})
    return out


def check(captures, **options):
    return SPEC.fn(CheckContext(captures, live=True, options=options))


# ---- the probe ----

def test_the_probe_reports_each_module_and_its_version_without_importing_it(real_probe):
    from importlib import metadata

    assert real_probe["trainer_modules"]["yaml"] == {"distribution": "PyYAML", "found": True,
                                                     "version": metadata.version("PyYAML")}
    assert real_probe["trainer_modules"]["numpy"]["version"] == metadata.version("numpy")
    assert set(real_probe["trainer_modules"]) == set(software.JOB_MODULES)


def test_a_python_without_them_reports_them_absent(tmp_path):
    subprocess.run([HERE, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=60)
    got = run_probe(python=str(tmp_path / "venv" / "bin" / "python"))["trainer_modules"]
    assert got["yaml"] == {"distribution": "PyYAML", "found": False, "version": None}
    assert not got["numpy"]["found"] and not got["tokenizers"]["found"]


def test_the_probe_and_the_checks_name_the_same_modules():
    assert dict(load_probe_module().JOB_MODULES) == software.JOB_MODULES
    assert set(software.TRAINER_MODULES) < set(software.JOB_MODULES)


def test_every_module_the_trainer_imports_at_start_is_checked():
    """reference_train's module-level imports (what `import reference_train.train`
    runs) outside the standard library and mlx are the check's always-needed
    ones; its lazy imports are tokenizers (judged for `train`) or run only
    here (prepare, the loss plot)."""
    top, lazy = set(), set()
    for path in TRAIN.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                (top if node in tree.body else lazy).update(n.split(".")[0] for n in names)
    outside = {n for n in top | lazy if n not in sys.stdlib_module_names and n not in ("mlx", "reference_train")}
    assert {n for n in outside if n in top} == set(software.TRAINER_ALWAYS)
    assert {n for n in outside if n not in top} == {"tokenizers", "transformers", "jinja2", "datasets",
                                                    "matplotlib"}


# ---- the check ----

def test_every_host_with_numpy_and_pyyaml_passes_whatever_tokenizers(real_probe):
    r = check(hosts(real_probe, b=["tokenizers"]))
    assert r.status is Status.PASS
    assert r.hosts["b"].startswith("numpy ") and "(no tokenizers: for data with a tokenizer.json" in r.hosts["b"]


def test_a_host_without_pyyaml_fails_named_with_the_command_at_this_machines_version(real_probe, monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: {"PyYAML": "6.0.2"}.get(dist))
    r = check(hosts(real_probe, b=["yaml"]))
    assert r.status is Status.FAIL
    assert r.hosts["b"].startswith("✗ no PyYAML in /opt/venv/bin/python; numpy ")
    assert r.hint == ("on b: /opt/venv/bin/python -m pip install PyYAML==6.0.2 "
                      "(or doctor --fix: the wheels fetched here, sent over SSH)")
    assert list(r.fix_data) == ["b"] and set(r.fix_data["b"]["missing"]) == {"PyYAML"}


def test_without_it_here_the_most_hosts_version_is_installed(real_probe, monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: None)
    captures = hosts(real_probe, b=["yaml"])
    version = json.loads(captures["a"].text(PROBE))["trainer_modules"]["yaml"]["version"]
    assert check(captures).hint.startswith(f"on b: /opt/venv/bin/python -m pip install PyYAML=={version} ")


def test_without_it_here_a_tie_goes_to_the_newest_and_none_anywhere_to_the_index(real_probe, monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: None)
    assert fix.choose("PyYAML", {"a": "6.0.2", "b": "6.0.10"}) == ("6.0.10", "the newest (a tie: 1 host each)")
    assert fix.choose("PyYAML", {"a": None}) == (None, "no host has PyYAML, nor has this machine")
    monkeypatch.setattr(fix, "version_here", lambda dist: "6.0.2")
    # this machine's goes first, whatever the hosts have (the trainer was tried with it)
    assert fix.choose("PyYAML", {"a": "6.0.3", "b": "6.0.3"}) == ("6.0.2", "this machine's version")


def test_tokenizers_fails_only_when_train_says_its_data_needs_it(real_probe):
    captures = hosts(real_probe, c=["tokenizers"])
    asked = check(captures, trainer_modules=("reference_train.train", "tokenizers"))
    assert asked.status is Status.FAIL and asked.hosts["c"].startswith("✗ no tokenizers in ")
    # doctor alone does not judge it: its fix needs the data named
    assert "(or doctor --fix --train-data DIR (DIR: your --data)" in asked.hint
    assert check(captures).status is Status.PASS


def test_a_capture_older_than_the_check_is_skipped(real_probe):
    old = copy.deepcopy(real_probe)
    old.pop("trainer_modules")
    r = check({"a": HostCapture("a", {PROBE: json.dumps(old)})})
    assert r.status is Status.SKIP and "older than this check" in r.hint


def test_trains_data_decides_whether_tokenizers_is_needed(tmp_path):
    def data(tokenizer) -> str:
        folder = tmp_path / json.dumps(tokenizer).replace("/", "_").replace('"', "")
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps({"tokenizer": tokenizer}))
        return str(folder)

    def needs(*flags):
        return data_modules(build_config(["--config", "tiny", *flags]).data)

    assert needs() == ()  # the default corpus: byte-level
    assert needs("--data", data({"kind": "byte"})) == ()
    assert needs("--data", data({"kind": "folder", "path": "/m"})) == ("tokenizers",)
    assert needs("--data", data({"kind": "hf", "name": "gpt2"})) == ("tokenizers",)
    assert needs("--data", str(tmp_path / "elsewhere")) == ()  # not readable here: the hosts' own


# ---- the fix: plan, fetch, send, install, undo ----

def plan_for(captures, python="/opt/venv/bin/python"):
    result = check(captures)
    return result, build_plan([result], [SPEC], inventory_of(captures, python))


def test_the_plan_fetches_with_dependencies_for_the_hosts_platform(real_probe, monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: {"PyYAML": "6.0.2", "numpy": "2.4.6"}.get(dist))
    _, plan = plan_for(hosts(real_probe, b=["yaml", "numpy"]))
    [action] = plan.actions
    assert action.hosts == ("b",) and action.kind == "trainer-install"
    assert action.what.startswith("install numpy==2.4.6, PyYAML==6.0.2 in /opt/venv/bin/python (Linux ")
    assert action.what.endswith("): the trainer's ranks import them (numpy 2.4.6: this machine's version; "
                                "PyYAML 6.0.2: this machine's version)")
    here = [c for c in action.commands if c.startswith("here: ")]
    assert len(here) == 2 and "--no-deps" not in here[1]
    assert here[1].startswith(f"here: {HERE} -m pip download PyYAML==6.0.2 --only-binary=:all: --platform manylinux_")
    assert action.commands[-1] == ("on b: /opt/venv/bin/python -m pip install --isolated --disable-pip-version-check "
                                   '--no-index --find-links "$HOME/.cache/mlxcluster/wheels" numpy==2.4.6 PyYAML==6.0.2')


def test_pip_says_what_it_installed():
    out = "Processing ./pyyaml-6.0.2.whl\nInstalling collected packages: PyYAML\n" \
          "Successfully installed PyYAML-6.0.2 huggingface-hub-0.36.0 tokenizers-0.22.1\n"
    assert fix.installed_by(out) == ["PyYAML", "huggingface-hub", "tokenizers"]
    assert fix.installed_by("Requirement already satisfied: PyYAML==6.0.2") == []


@pytest.fixture
def pip_that_installs(tmp_path):
    """A python whose pip records its arguments and says it installed what it was asked."""
    folder = tmp_path / "venv" / "bin"
    folder.mkdir(parents=True)
    py = folder / "python"
    py.write_text('#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; '
                  'printf "%s|" "$@" >> "$HOME/pip.log"; echo >> "$HOME/pip.log"; '
                  'for a; do case $a in *==*) echo "Successfully installed $(echo $a | sed s/==/-/)";; esac; done; '
                  f'exit 0; fi\nexec {HERE} "$@"\n')
    py.chmod(0o755)
    return str(py)


def test_wheels_fetched_once_sent_installed_and_undo_uninstalls_what_pip_installed(
        tmp_path, monkeypatch, real_probe, pip_that_installs):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fix, "version_here", lambda dist: "6.0.2")
    fetches = []

    def fetch(argv, dest, timeout):
        fetches.append(argv)
        (dest / "pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"yaml" * 999)

    monkeypatch.setattr(wheels_module, "fetch", fetch)
    captures = hosts(real_probe, python=pip_that_installs, b=["yaml"], c=["yaml"])
    _, plan = plan_for(captures, python=pip_that_installs)
    assert [a.hosts for a in plan.actions] == [("b",), ("c",)]
    machines = FakeSsh.local(tmp_path / "hosts", inventory_of(captures))
    journal = Journal.create(fixes_dir(), "/tmp/x/cluster.yaml")
    entries = apply_plan(plan, journal, ApplyContext(machines))
    assert [e["status"] for e in entries] == ["applied", "applied"], entries
    assert len(fetches) == 1  # both hosts: the same platform and Python
    for name in ("b", "c"):
        got = machines.homes[name] / ".cache/mlxcluster/wheels"
        assert [p.name for p in got.iterdir()] == ["pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl"]
        assert (machines.homes[name] / "pip.log").read_text().splitlines() == [
            f"install|--isolated|--disable-pip-version-check|--no-index|--find-links|{got}|PyYAML==6.0.2|"]
    assert "a" not in {h for h, _ in machines.calls}

    done = undo_journal(read_journal(journal.path), lambda: machines)
    assert [s for _, s, _ in done] == ["restored", "restored"]
    for name in ("b", "c"):
        assert (machines.homes[name] / "pip.log").read_text().splitlines()[-1] == \
            "uninstall|--isolated|--disable-pip-version-check|-y|PyYAML|"


def test_an_install_that_installed_nothing_is_unchanged_with_nothing_to_undo(tmp_path, monkeypatch, real_probe):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fix, "version_here", lambda dist: "6.0.2")
    monkeypatch.setattr(wheels_module, "fetch", lambda argv, dest, timeout: (dest / "PyYAML-6.0.2-py3-none-any.whl").write_bytes(b"y"))
    py = tmp_path / "py"
    py.write_text(f'#!/bin/sh\n[ "$1" = -m ] && echo "Requirement already satisfied: PyYAML" && exit 0\nexec {HERE} "$@"\n')
    py.chmod(0o755)
    captures = hosts(real_probe, python=str(py), b=["yaml"])
    _, plan = plan_for(captures, python=str(py))
    machines = FakeSsh.local(tmp_path / "h", inventory_of(captures))
    [entry] = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(machines))
    assert entry["status"] == "unchanged" and entry["undo"] is None


def test_train_asks_its_preflight_and_doctor_for_what_its_data_needs(tmp_path, monkeypatch):
    from mlxcluster.doctor.doctor import DoctorReport
    from mlxcluster.jobs.job import Job
    from mlxcluster.launch import preflight
    from mlxcluster.launch.trainer import parse_trainer_args, trainer_job

    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": {"kind": "folder", "path": "/m"}}))
    job = trainer_job(Job((), "ring", "python3"), parse_trainer_args(("--config", "tiny", "--data", str(tmp_path))))
    assert job.imports == ("reference_train.train", "tokenizers")  # the preflight's probe imports both
    asked = {}

    def run_doctor(inventory, **kwargs):
        asked.update(kwargs)
        return DoctorReport("pass", [], {}, {}, True, 0.1, "lab")

    monkeypatch.setattr(preflight, "run_doctor", run_doctor)
    preflight.run_doctor_preflight(object(), "ring", lambda event: None, job.imports)
    assert asked["trainer_modules"] == ("reference_train.train", "tokenizers")


@pytest.mark.parametrize("version", [["6.0"], {"v": 1}, 6.0, True])
def test_a_wrong_typed_version_is_unknown_not_a_crash(real_probe, version):
    captures = hosts(real_probe, b=["yaml"])
    bad = json.loads(captures["a"].text(PROBE))
    bad["trainer_modules"]["yaml"]["version"] = version
    captures["a"] = HostCapture("a", {PROBE: json.dumps(bad)})
    r = check(captures)
    assert r.status is Status.FAIL and r.hosts["a"].startswith("numpy ") and "PyYAML (version unknown)" in r.hosts["a"]


def test_doctor_train_data_asks_for_what_that_data_needs_and_fix_passes_it_on(tmp_path, doctor_asked):
    """`doctor --train-data DIR` (and `doctor --fix --train-data DIR`, which
    then installs it) judges tokenizers for data tokenized with a tokenizer.json."""
    from click.testing import CliRunner

    from mlxcluster.cli import main

    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"tokenizer": {"kind": "folder", "path": "/m"}}))
    inventory, asked = doctor_asked
    cli = CliRunner()
    done = cli.invoke(main, ["doctor", "-i", inventory, "--train-data", str(data)])
    assert done.exit_code == 0, done.output
    done = cli.invoke(main, ["doctor", "-i", inventory, "--fix", "--yes", "--train-data", str(data)])
    assert done.exit_code == 0, done.output
    assert asked == [("tokenizers",), ("tokenizers",)]
    byte = tmp_path / "byte"
    byte.mkdir()
    (byte / "meta.json").write_text(json.dumps({"tokenizer": {"kind": "byte"}}))
    assert cli.invoke(main, ["doctor", "-i", inventory, "--train-data", str(byte)]).exit_code == 0
    assert asked[-1] == ()
    done = cli.invoke(main, ["doctor", "--local", "--train-data", str(data)])
    assert done.exit_code == 2 and "--train-data goes with a live check" in done.output
