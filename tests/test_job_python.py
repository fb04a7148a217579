"""The job's python looked for on every host (mlxcluster/jobs/job_python.py); the
real ssh path is tests/lab/test_run_lab.py (a python missing on one host)."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace

import pytest

from mlxcluster.errors import EXIT_USAGE, InputError
from mlxcluster.jobs import process
from mlxcluster.jobs import run as job_run
from mlxcluster.jobs.job import job_local
from mlxcluster.jobs.job_python import (
    is_missing_python,
    python_not_found,
    require_job_python,
    start_python_check,
)


@pytest.mark.parametrize("returncode, stderr, missing", [
    (127, "bash: line 1: /no/such/python: No such file or directory", True),
    (127, "", True),                                        # a shell that said nothing
    (2, "/lab/bin/python: 2: exec: /no/such/python: not found", True),
    (126, "bash: /opt/venv/bin/python: Permission denied", True),
    (255, "ssh: connect to host 10.0.0.3 port 22: No route to host", False),  # the host, not the path
    (255, "ssh: Could not resolve hostname mac9: Name or service not known", False),
    (0, "", False),
    (1, "Fatal Python error: init_fs_encoding", False),   # there, but broken: the probe says more
])
def test_what_says_the_python_is_not_there(returncode, stderr, missing):
    assert is_missing_python(returncode, stderr) is missing


def test_the_error_names_every_host_and_is_bad_input():
    err = python_not_found("/opt/venv/bin/python", ["mac2", "mac3"])
    assert str(err) == "python not found: /opt/venv/bin/python on mac2, mac3"
    assert err.exit_code == EXIT_USAGE and "same venv at that path on every host" in err.hint


def test_ranks_on_this_machine_are_not_asked_over_ssh(monkeypatch):
    """--local ranks: the python was checked here when the job was built."""
    def no_run(*args, **kwargs):
        raise AssertionError("nothing may run")

    monkeypatch.setattr(subprocess, "run", no_run)
    require_job_python(job_local(2, "ring", sys.executable))


def test_the_check_runs_in_the_background_and_its_answer_raises_when_asked():
    """start_python_check returns while the hosts are still answering; the
    answer, once asked for, raises the check's own error."""
    asked, may_answer = threading.Event(), threading.Event()

    def slow_missing(job, env):
        asked.set()
        assert may_answer.wait(5)
        raise python_not_found(job.python, ["mac2"])

    job = replace(job_local(2, "ring", sys.executable), python="/opt/py")
    answer = start_python_check(job, None, slow_missing)
    assert asked.wait(5)  # running, and we are already back
    may_answer.set()
    with pytest.raises(InputError) as err:
        answer()
    assert str(err.value) == "python not found: /opt/py on mac2"
    start_python_check(job, None, lambda job, env: None)()  # found: no error


def test_a_missing_python_stops_the_job_after_planning_before_any_start(monkeypatch, tmp_path):
    """run_job calls before_start once the launch is planned; its error ends
    the job there: no launcher started, no host swept."""
    events: list[str] = []
    real_plan = job_run.plan_job
    monkeypatch.setattr(job_run, "plan_job", lambda *a, **kw: events.append("planned") or real_plan(*a, **kw))
    monkeypatch.setattr(process, "start_plan", lambda plan: events.append("started"))
    monkeypatch.setattr(job_run, "sweep", lambda *a, **kw: events.append("swept") or [])
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    job = replace(job_local(2, "ring", sys.executable), program=(str(script),))

    def missing():
        events.append("checked")
        raise python_not_found(job.python, ["mac2"])

    with pytest.raises(InputError):
        job_run.run_job(job, lambda *_: None, stall_timeout=None, before_start=missing)
    assert events == ["planned", "checked"]
