"""One launch path: smoke, train and run plan, start and probe through
mlxcluster.jobs, and nothing outside it starts a launcher.

The source checks read the package's own files (ast, not text); the path
checks run the real planners and the real local probe, with the launcher
replaced only where a test must not start one.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxcluster.jobs import hosts as job_hosts
from mlxcluster.jobs import process
from mlxcluster.jobs import run as job_run
from mlxcluster.jobs.job import job_local
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.jobs.preflight import check_probes, probe_hosts
from mlxcluster.launch.trainer import parse_trainer_args, trainer_job
from mlxcluster.smoke import run as smoke_run
from mlxcluster.smoke.launch import WorkerOptions, plan_launch

PACKAGE = Path(__file__).resolve().parents[1] / "mlxcluster"
# Popen outside the jobs layer, each for a reason that is not a job's launcher.
OTHER_PROCESSES = {
    "tune/measure.py": "the receiving end of a raw TCP stream (tune's limit), one per host pair",
    "transfer/link.py": "a copy sent to or read from a host: bytes written into ssh's stdin or "
                        "read from its stdout, under a watchdog of its own",
    "serve/tunnel.py": "the ssh port forward to rank 0's server, running as long as one launch; "
                       "nothing to read from it",
    "transfer/rsync.py": "a copy sent to a host by rsync, its progress read, under the same watchdog",
    "transfer/fanout.py": "a host's offer of its copy to the others, alive as long as their takes; "
                          "its first line read, then ended by closing its stdin",
}


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


def classes_named(name: str) -> list[str]:
    return [path for path, tree in modules().items() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and node.name == name]


def popen_callers() -> set[str]:
    """Modules that call ``subprocess.Popen`` (or a bare imported ``Popen``)."""
    found = set()
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Attribute) and f.attr == "Popen") or \
                        (isinstance(f, ast.Name) and f.id == "Popen"):
                    found.add(path)
    return found


@pytest.mark.parametrize("name, home", [("RankHost", "jobs/hosts.py"), ("LaunchPlan", "jobs/plan.py"),
                                        ("RunOutcome", "jobs/watch.py"), ("HostProbe", "jobs/preflight.py")])
def test_each_job_type_exists_once_in_the_jobs_layer(name, home):
    assert classes_named(name) == [home]


def test_only_the_jobs_layer_starts_processes_that_stream():
    assert popen_callers() - set(OTHER_PROCESSES) == {"jobs/process.py"}
    assert set(OTHER_PROCESSES) <= popen_callers()  # an entry here that no longer applies goes


def test_the_jobs_layer_never_imports_the_commands_above_it():
    """smoke, the launch path and the CLI use jobs; jobs uses none of them
    (the preflight's smoke all_sum lives in mlxcluster/launch/, above both),
    nor the trainer: of reference_train only the heartbeat protocol's marks
    (reference_train/metrics.py, no mlx), so that one copy of them exists."""
    above = ("mlxcluster.smoke", "mlxcluster.launch", "mlxcluster.cli", "mlxcluster.tune",
             "mlxcluster.demo", "reference_train")
    offenders = []
    for path, tree in modules().items():
        if not path.startswith("jobs/"):
            continue
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path}: {n}" for n in names if n.startswith(above)
                          and n != "reference_train.metrics"]
    assert offenders == []


@pytest.fixture
def recorded_launches(monkeypatch):
    """process.start_plan records each plan and starts a launcher that exits
    at once (no rank runs), so that the caller's whole path still runs."""
    plans: list[LaunchPlan] = []

    def start_plan(plan: LaunchPlan) -> process.Running:
        plans.append(plan)
        plan.write_files()
        return process.start([sys.executable, "-c", "pass"])

    monkeypatch.setattr(process, "start_plan", start_plan)
    return plans


def test_smoke_train_and_run_start_through_one_plan_and_one_starter(recorded_launches, tmp_path):
    hosts = job_hosts.local_hosts(2)
    report = smoke_run.run_plan(plan_launch("ring", hosts, WorkerOptions(ops=("all_sum",))), timeout_s=20)
    assert report.status == "failed"  # the stand-in launcher ran no rank
    train = trainer_job(job_local(2, "ring", sys.executable),
                        parse_trainer_args(("--config", "tiny")))
    assert job_run.run_job(train, lambda *_: None, stall_timeout=None).exit_code == 0
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    run = replace(job_local(2, "ring", sys.executable), program=(str(script),), tag_output=True)
    job_run.run_job(run, lambda *_: None, stall_timeout=None, run_id="mlxrun-layouttest")

    assert [type(p) for p in recorded_launches] == [LaunchPlan] * 3
    assert all(type(h) is job_hosts.RankHost for p in recorded_launches for h in p.hosts)
    smoke, trained, ran = recorded_launches
    assert smoke.run_id.startswith("mlxsmoke-")
    # Every rank of all three runs under the one rank wrapper, the run id on its command line.
    for plan, program in ((smoke, f"{smoke.run_dir}/worker.py"), (trained, "reference_train.train"),
                          (ran, str(script))):
        assert plan.argv[plan.argv.index("--") + 1:][:5] == [
            "-X", f"mlxcluster_run={plan.run_id}", "-m", "mlxcluster.jobs.rank_wrapper",
            "-m" if program.endswith("train") else program]
    assert ran.run_id == "mlxrun-layouttest"


def test_the_preflight_is_doctors_probe_run_with_the_jobs_python():
    """The real probe (probe_script.py, as doctor runs it) on this machine:
    the trainer and the rank wrapper import, mlx's version is the installed
    one; a `run` job's missing script is named."""
    job = trainer_job(job_local(2, "ring", sys.executable), parse_trainer_args(("--config", "tiny")))
    probes = probe_hosts(job)
    assert len(probes) == 1  # two ranks, one host
    facts = probes[0].facts
    assert probes[0].error is None
    assert facts["mlx"] == importlib.metadata.version("mlx")
    assert facts["import_errors"] == {} and "rank_wrapper_error" not in facts
    assert facts["python"] == sys.executable and facts["cpus"] >= 1
    assert check_probes(job, probes) == []

    unknown = replace(job, imports=("reference_train.no_such_module",))
    assert check_probes(unknown, probe_hosts(unknown)) == [
        "local-0: reference_train.no_such_module does not import: ModuleNotFoundError: No module "
        "named 'reference_train.no_such_module'"]
    missing = replace(job, program=("/nonexistent/dir/train.py",), imports=())
    problems = check_probes(missing, probe_hosts(missing))
    assert problems == ["local-0: no file /nonexistent/dir/train.py (every rank runs it from that "
                        "path; copy it there or use a shared folder)"]


def test_a_python_that_is_not_there_is_named_by_the_probe():
    job = replace(job_local(1, "ring", sys.executable), python="/nonexistent/bin/python3")
    probe = probe_hosts(job)[0]
    assert probe.facts == {} and "/nonexistent/bin/python3 not found" in probe.error

