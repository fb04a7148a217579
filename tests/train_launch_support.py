"""What the train-launch tests share: an inventory of two Macs that are not
there, and a fixture under which nothing may reach a host or start a process
(tests/test_train_launch.py, tests/test_train_pipeline_launch.py)."""

from __future__ import annotations

import subprocess

import pytest

INVENTORY = """
cluster: lab
python: /opt/venv/bin/python
ssh_config: /tmp/ssh_config
hosts:
  - name: mac1
    ssh: mac1.local
    ips: [10.0.0.1]
  - name: mac2
    ssh: 10.0.0.2
"""


@pytest.fixture
def nothing_may_start(monkeypatch):
    """Every step of `mlxcluster train` that reaches a host or starts a process
    records that it was called (and starts nothing)."""
    import mlxcluster.launch.preflight as preflight
    import mlxcluster.launch.session as session
    import mlxcluster.launch.trainer as trainer

    called: list[str] = []

    def recorder(name):
        def record(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} was called")
        return record

    for module, name in ((preflight, "run_doctor_preflight"), (preflight, "probe_hosts"),
                         (preflight, "smoke_all_sum"), (trainer, "run_job"),
                         (session, "require_job_python")):
        monkeypatch.setattr(module, name, recorder(name))
    monkeypatch.setattr(subprocess, "Popen", recorder("subprocess.Popen"))
    return called
