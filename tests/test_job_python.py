"""The job's python looked for on every host (mlxcluster/jobs/job_python.py); the
real ssh path is tests/lab/test_run_lab.py (a python missing on one host)."""

from __future__ import annotations

import sys

import pytest

from mlxcluster.errors import EXIT_USAGE
from mlxcluster.jobs.job import job_local
from mlxcluster.jobs.job_python import is_missing_python, python_not_found, require_job_python
from tests.fakes import FakeSsh


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


def test_ranks_on_this_machine_are_not_asked_over_ssh(hosts_run_by):
    """--local ranks: the python was checked here when the job was built."""
    fake = hosts_run_by(FakeSsh(default=None))  # any command on a host fails the test
    require_job_python(job_local(2, "ring", sys.executable))
    assert fake.calls == []
