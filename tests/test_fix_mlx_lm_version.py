"""mlx-lm-version and its fix: mlx_lm looked up by the probe (real probe
output), judged only when the job imports it, X chosen (most hosts; on a
tie this machine's when it is one of them, else the newest), the plan's commands, and the
fetch, send, install and undo run for real: pip download (from a folder of
small wheels standing in for the index), the send and the install by ``sh``
with a HOME per "host" into a real venv with real pip, which must keep the
host's mlx."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.doctor import load_checks
from mlxcluster.doctor.fixes import mlx_lm_version as fix
from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.apply import ApplyContext, apply_plan, undo_journal
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.plan import build_plan
from mlxcluster.facts.capture import PROBE, HostCapture
from mlxcluster.jobs.job import Job, program_imports
from mlxcluster.jobs.preflight import probe_arguments
from tests.fakes import FakeSsh
from tests.inventory_support import inventory_of
from tests.probe_support import run_probe

HERE = sys.executable
HERE_VERSION = metadata.version("mlx-lm")  # this machine's: wins a tie it is part of
SPEC = next(s for s in load_checks() if s.id == "mlx-lm-version")
PY = "/opt/venv/bin/python"


def host(name: str, mlx_lm: str | None, *, python: str = PY, found: bool | None = None) -> HostCapture:
    """A Linux host as the probe reports it, with mlx-lm ``mlx_lm`` (None: none)."""
    probe = {"probe_version": 1, "hostname": name, "platform": "linux",
             "os": {"system": "Linux", "machine": "x86_64", "name": "Debian GNU/Linux", "libc": "glibc 2.36"},
             "python": {"executable": python, "version": "3.11.7"},
             "mlx": {"version": "0.32.4", "import_ok": True},
             "trainer_modules": {"mlx_lm": {"distribution": "mlx-lm", "found": bool(mlx_lm) if found is None else found,
                                            "version": mlx_lm}}}
    return HostCapture(name, {PROBE: json.dumps(probe)})


def hosts(python: str = PY, **versions) -> dict[str, HostCapture]:
    return {n: host(n, v, python=python) for n, v in versions.items()}


def check(captures, imports=("mlx_lm",), python: str = PY):
    return SPEC.fn(CheckContext(captures, inventory=inventory_of(captures, python), live=True,
                                options={"trainer_modules": imports}))


def plan_for(captures, python: str = PY):
    result = check(captures, python=python)
    return result, build_plan([result], [SPEC], inventory_of(captures, python))


# ---- the probe ----

def test_the_probe_reports_mlx_lm_and_its_version_and_a_python_without_it_none(tmp_path):
    assert run_probe()["trainer_modules"]["mlx_lm"] == {"distribution": "mlx-lm", "found": True,
                                                        "version": HERE_VERSION}
    subprocess.run([HERE, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=60)
    assert run_probe(python=str(tmp_path / "venv" / "bin" / "python"))["trainer_modules"]["mlx_lm"] == {
        "distribution": "mlx-lm", "found": False, "version": None}


# ---- the check ----

def test_not_judged_unless_the_job_imports_mlx_lm():
    r = check(hosts(a="0.32.2", b=None), imports=("reference_train.train", "tokenizers"))
    assert r.status is Status.SKIP
    assert r.hint.startswith("not asked for: the job does not run mlx_lm (mlxcluster run -- -m mlx_lm ...")
    assert check(hosts(a="0.32.2", b=None), imports=("mlx_lm.generate",)).status is Status.FAIL


def test_one_version_everywhere_passes():
    r = check(hosts(a="0.32.2", b="0.32.2"))
    assert r.status is Status.PASS and r.hosts == {"a": "mlx-lm 0.32.2", "b": "mlx-lm 0.32.2"}


def test_another_version_and_none_fail_named_with_the_majoritys_command_per_host():
    r = check(hosts(a="0.32.2", b="0.31.3", c="0.32.2", d=None))
    assert r.status is Status.FAIL
    assert r.hosts == {"a": "mlx-lm 0.32.2", "b": f"✗ mlx-lm 0.31.3 (others: 0.32.2) in {PY}",
                       "c": "mlx-lm 0.32.2", "d": f"✗ no mlx-lm in {PY}"}
    assert r.hint == (f"on b, d: {PY} -m pip install mlx-lm==0.32.2 (mlx-lm 0.32.2: on 2 of 4 hosts; or doctor --fix "
                      "--imports mlx_lm: the wheels, with their dependencies, fetched here and sent over SSH, each "
                      "host's mlx kept)")
    assert set(r.fix_data) == {"b", "d"}
    assert r.fix_data["b"]["version"] == "0.31.3" and r.fix_data["d"]["version"] is None
    assert {d["to"] for d in r.fix_data.values()} == {"0.32.2"}


def test_found_without_a_version_is_blamed():
    captures = {"a": host("a", "0.32.2"), "b": host("b", None, found=True)}
    assert check(captures).hosts["b"] == f"✗ mlx-lm of no known version in {PY}"


def test_a_capture_without_mlx_lm_is_skipped_or_named():
    old = json.loads(host("a", "0.32.2").text(PROBE))
    old["trainer_modules"].pop("mlx_lm")
    only_old = {"a": HostCapture("a", {PROBE: json.dumps(old)})}
    assert check(only_old).status is Status.SKIP
    mixed = {**hosts(b="0.32.2", c="0.31.3"), **only_old}
    assert check(mixed).hosts["a"] == "not probed for mlx-lm (an older capture)"


# ---- choosing X ----

def test_x_is_the_most_hosts_version():
    assert fix.choose({"a": "0.31.3", "b": "0.32.2", "c": "0.31.3"}) == ("0.31.3", "on 2 of 3 hosts")


def test_a_tie_goes_to_this_machines_version_when_it_is_one_of_them():
    assert fix.choose({"a": "0.31.3", "b": HERE_VERSION})[0] == HERE_VERSION
    r = check(hosts(a="0.31.3", b=HERE_VERSION))
    assert r.fix_data["a"]["to"] == HERE_VERSION and list(r.fix_data) == ["a"]


def test_a_tie_without_this_machines_version_goes_to_the_newest_and_the_plan_says_so():
    x, why = fix.choose({"a": "0.31.3", "b": "0.30.0"})
    assert (x, why) == ("0.31.3", "the newest (a tie: 1 host each)")
    result, plan = plan_for(hosts(a="0.31.3", b="0.30.0"))
    assert result.status is Status.FAIL and list(result.fix_data) == ["b"]
    assert result.hosts["b"] == f"✗ mlx-lm 0.30.0 (others: 0.31.3) in {PY}"
    assert result.hint.startswith(f"on b: {PY} -m pip install mlx-lm==0.31.3 (mlx-lm 0.31.3: the newest (a tie: 1 host "
                                  "each); or doctor --fix --imports mlx_lm")
    [action] = plan.actions
    assert action.hosts == ("b",) and plan.left == []
    assert action.what.endswith("; mlx-lm 0.31.3: the newest (a tie: 1 host each)")


def test_no_host_having_it_gets_this_machines_version():
    assert fix.choose({"a": None, "b": None}) == (HERE_VERSION, "this machine's version (no host has mlx-lm)")


def test_no_host_having_it_nor_this_machine_plans_nothing_and_the_hint_says_so(monkeypatch):
    monkeypatch.setattr(fix, "version_here", lambda dist: None)
    result, plan = plan_for(hosts(a=None, b=None))
    assert result.status is Status.FAIL and not result.fix_data
    assert result.hint == (f"no host has mlx-lm, nor has this machine: install it here first ({sys.executable} -m pip "
                           "install mlx-lm, or mlxcluster's serve extra: pip install -e '.[serve]'), then doctor "
                           "--fix --imports mlx_lm installs that version on every host")
    assert plan.empty and plan.left == [result]


# ---- the plan ----

def test_the_plan_fetches_x_with_its_dependencies_the_old_one_alone_and_keeps_mlx():
    result, plan = plan_for(hosts(a="0.32.2", b="0.31.3", c="0.32.2", d=None))
    assert [a.hosts for a in plan.actions] == [("b",), ("d",)] and plan.left == []
    b, d = plan.actions
    assert b.kind == "mlx-lm-install"
    assert b.what == f"mlx-lm 0.31.3 -> mlx-lm 0.32.2 in {PY} (Linux x86_64, Python 3.11); mlx-lm 0.32.2: on 2 of 4 hosts"
    assert d.what == (f"no mlx-lm -> mlx-lm 0.32.2 in {PY} (Linux x86_64, Python 3.11); "  # its undo: an uninstall
                      "mlx-lm 0.32.2: on 2 of 4 hosts")
    cache = wheels.wheel_cache()
    x, old = b.commands[:2]
    assert x.startswith(f"here: {HERE} -m pip download mlx-lm==0.32.2 --only-binary=:all: --platform manylinux_2_36")
    assert x.endswith(f"-d {cache}/mlx_lm-0.32.2/manylinux_2_36_x86_64-cp311")
    assert old.startswith(f"here: {HERE} -m pip download mlx-lm==0.31.3 --no-deps --only-binary=:all: ")
    assert len([c for c in d.commands if c.startswith("here: ")]) == 1
    assert b.commands[-1] == (
        f"on b: {PY} -m pip install --isolated --disable-pip-version-check --no-index --find-links "
        f'"$HOME/.cache/mlxcluster/wheels" mlx-lm==0.32.2 $({PY} -c \'import importlib.metadata as m; '
        f'print("mlx==" + m.version("mlx"))\' 2>/dev/null)')


@pytest.mark.parametrize("shell", ["sh", "bash", "zsh"])
def test_the_pin_is_the_installed_mlx_as_one_word_or_nothing_in_each_login_shell(shell):
    """Read when the command runs, in the shells a host's login shell may be."""
    def words(dist):
        command = 'printf "[%s]" pip ' + wheels.kept_as_installed(HERE, dist)
        return subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=60).stdout

    assert words("mlx") == f"[pip][mlx=={metadata.version('mlx')}]"
    assert words("no-such-dist") == "[pip]"


def test_mlx_lm_is_installed_after_mlx():
    from mlxcluster.doctor.fixes.plan import KIND_ORDER

    assert KIND_ORDER[-2:] == ("mlx-install", "mlx-lm-install")


# ---- fetched, sent, installed, undone: real pip, small wheels ----

def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A wheel of ``name`` ``version`` as pip builds one: a module, METADATA, WHEEL, RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {f"{dist}/__init__.py": f"__version__ = {version!r}\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).decode().rstrip('=')},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for p, t in {**files, f"{info}/RECORD": record}.items():
            z.writestr(p, t)


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A folder of wheels the fix's pip download reads instead of the index
    (its environment: no config, no index, these links): mlx 0.32.4 and a
    newer 0.33.0, mlx-lm 0.31.3, 0.32.2 (needing lm-helper) and 0.33.0
    (needing mlx 0.33)."""
    folder = tmp_path / "index"
    folder.mkdir()
    wheel(folder, "mlx", "0.32.4")
    wheel(folder, "mlx", "0.33.0")
    wheel(folder, "lm-helper", "1.0")
    wheel(folder, "mlx-lm", "0.31.3", ("mlx>=0.31.2",))
    wheel(folder, "mlx-lm", "0.32.2", ("mlx>=0.32.2", "lm-helper>=1.0"))
    wheel(folder, "mlx-lm", "0.33.0", ("mlx>=0.33.0", "lm-helper>=1.0"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def venv_with(tmp_path: Path, index: Path, *requirements: str) -> str:
    """A venv (this python, this venv's pip on its path) holding ``requirements`` from ``index``."""
    root = tmp_path / "hostvenv"
    subprocess.run([HERE, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    pip_only = root / "pip-only"
    pip_only.mkdir()
    (pip_only / "pip").symlink_to(Path(__import__("pip").__file__).parent)
    [site] = root.glob("lib/python*/site-packages")
    (site / "pip-only.pth").write_text(f"{pip_only}\n")
    python = str(root / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--isolated", "--no-index", "--no-deps", "--find-links",
                    str(index), *requirements], check=True, timeout=120, capture_output=True)
    return python


def installed(python: str) -> dict[str, str]:
    """Every distribution in ``python``'s venv (run from / : not this checkout's egg-info)."""
    out = subprocess.run([python, "-c", "import importlib.metadata as m, json; print(json.dumps("
                          "{d.metadata['Name']: d.version for d in m.distributions()}))"],
                         capture_output=True, text=True, timeout=60, check=True, cwd="/").stdout
    return json.loads(out)


def test_x_installed_with_its_dependencies_the_hosts_mlx_kept_twice_is_once_undo_restores(tmp_path, index):
    python = venv_with(tmp_path, index, "mlx==0.32.4", "mlx-lm==0.31.3")
    captures = hosts(python, a="0.32.2", b="0.31.3", c="0.32.2")
    _, plan = plan_for(captures, python)
    machines = FakeSsh.local(tmp_path / "hosts", inventory_of(captures))
    journal = Journal.create(fixes_dir(), None)
    [entry] = apply_plan(plan, journal, ApplyContext(machines))
    assert entry["status"] == "applied", entry["output"]
    assert "Successfully installed lm-helper-1.0 mlx-lm-0.32.2" in entry["output"]
    # the download took mlx 0.33.0 (mlx-lm needs an mlx); the host kept its own
    sent = sorted(p.name for p in (machines.homes["b"] / ".cache/mlxcluster/wheels").glob("*.whl"))
    assert "mlx-0.33.0-py3-none-any.whl" in sent and "mlx_lm-0.31.3-py3-none-any.whl" in sent
    assert installed(python) == {"mlx": "0.32.4", "mlx-lm": "0.32.2", "lm-helper": "1.0"}

    again = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(machines))
    assert again[0]["status"] == "unchanged" and again[0]["undo"] is None
    assert "sent 0 wheel(s) (the host had them)" in again[0]["output"]

    done = undo_journal(read_journal(journal.path), lambda: machines)
    assert [s for _, s, _ in done] == ["restored"]
    assert installed(python) == {"mlx": "0.32.4", "mlx-lm": "0.31.3", "lm-helper": "1.0"}


def test_a_host_without_it_gets_it_and_its_dependencies_and_undo_uninstalls_exactly_those(tmp_path, index):
    python = venv_with(tmp_path, index, "mlx==0.32.4")
    captures = hosts(python, a="0.32.2", b=None, c="0.32.2")
    _, plan = plan_for(captures, python)
    machines = FakeSsh.local(tmp_path / "hosts", inventory_of(captures))
    journal = Journal.create(fixes_dir(), None)
    [entry] = apply_plan(plan, journal, ApplyContext(machines))
    assert entry["status"] == "applied", entry["output"]
    assert installed(python) == {"mlx": "0.32.4", "mlx-lm": "0.32.2", "lm-helper": "1.0"}
    assert entry["undo"]["commands"] == [f"{python} -m pip uninstall --isolated --disable-pip-version-check "
                                         "-y lm-helper mlx-lm"]
    done = undo_journal(read_journal(journal.path), lambda: machines)
    assert [s for _, s, _ in done] == ["restored"]
    assert installed(python) == {"mlx": "0.32.4"}


def test_an_x_that_needs_another_mlx_fails_and_changes_nothing(tmp_path, index):
    python = venv_with(tmp_path, index, "mlx==0.32.4", "mlx-lm==0.31.3")
    captures = hosts(python, a="0.33.0", b="0.31.3", c="0.33.0")
    _, plan = plan_for(captures, python)
    machines = FakeSsh.local(tmp_path / "hosts", inventory_of(captures))
    # Without the pin pip would replace the host's mlx from the wheels sent:
    [entry] = apply_plan(plan, Journal.create(fixes_dir(), None), ApplyContext(machines))
    wheel_dir = machines.homes["b"] / ".cache/mlxcluster/wheels"
    would = subprocess.run([python, "-m", "pip", "install", "--isolated", "--dry-run", "--no-index", "--find-links",
                            str(wheel_dir), "mlx-lm==0.33.0"], capture_output=True, text=True, timeout=120)
    assert "Would install lm-helper-1.0 mlx-0.33.0 mlx-lm-0.33.0" in would.stdout, would.stdout + would.stderr
    # ... with it the install fails and the host is as it was.
    assert entry["status"] == "failed" and entry["undo"] is None
    assert "mlx==0.32.4" in entry["output"] and "conflict" in entry["output"].lower(), entry["output"]
    assert installed(python) == {"mlx": "0.32.4", "mlx-lm": "0.31.3"}


# ---- where the job says so: run -m, doctor --imports ----

def test_run_dash_m_mlx_lm_asks_the_preflight_for_mlx_lm_and_nothing_else():
    assert program_imports(("-m", "mlx_lm", "lora", "--train")) == ("mlx_lm",)
    assert program_imports(("-m", "mlx_lm.generate", "--prompt", "hi")) == ("mlx_lm",)
    assert program_imports(("-m", "mymodule")) == ()  # its import could do anything: not tried
    assert program_imports(("/abs/mlx_lm.py",)) == ()
    job = Job((), "ring", "python3", program=("-m", "mlx_lm.generate"), imports=program_imports(("-m", "mlx_lm.generate")))
    assert probe_arguments(job)[:4] == ["--import", "mlxcluster.jobs.rank_wrapper", "--import", "mlx_lm"]


def test_doctor_imports_reaches_the_checks_with_and_without_fix(doctor_asked):
    inventory, asked = doctor_asked
    cli = CliRunner()
    done = cli.invoke(main, ["doctor", "-i", inventory, "--imports", "mlx_lm"])
    assert done.exit_code == 0, done.output
    done = cli.invoke(main, ["doctor", "-i", inventory, "--fix", "--yes", "--imports", "mlx_lm.generate",
                             "--imports", "tokenizers"])
    assert done.exit_code == 0, done.output
    assert asked == [("mlx_lm",), ("mlx_lm.generate", "tokenizers")]


def test_doctor_imports_refuses_what_no_check_judges_and_replays(doctor_asked):
    inventory, asked = doctor_asked
    cli = CliRunner()
    done = cli.invoke(main, ["doctor", "-i", inventory, "--imports", "mlx-lm"])
    assert done.exit_code == 2 and "--imports mlx-lm: no check judges it" in done.output
    assert "numpy, yaml, tokenizers, mlx_lm" in done.output
    done = cli.invoke(main, ["doctor", "--local", "--imports", "mlx_lm"])
    assert done.exit_code == 2 and "--imports goes with a live check" in done.output
    done = cli.invoke(main, ["doctor", "--undo", "x.json", "--imports", "mlx_lm"])
    assert done.exit_code == 2 and "--undo JOURNAL excludes --imports" in done.output
    assert asked == []
