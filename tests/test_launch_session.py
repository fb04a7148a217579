"""The launch session (mlxcluster.launch.session): one order of steps from a
command's request to a job ready to launch, for `run`, `train` and `serve`.

The order and what stops it are checked with stand-ins for the steps that
reach hosts (remote hosts here are addresses nobody answers at); the
session on local ranks runs for real: the real probe, the real all_sum.
`run` and `train` through the session are tested end to end in
tests/test_run_local.py, tests/test_train_launch.py and on the lab
(tests/lab/test_run_lab.py, tests/lab/test_train_lab.py).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import InputError
from mlxcluster.jobs.events import Aside, Checked
from mlxcluster.launch import code, preflight, session, sync
from mlxcluster.launch.job_source import JobSource, choose_job
from mlxcluster.launch.program import program_job, program_request
from mlxcluster.launch.session import LaunchFlags, LaunchRequest, launch_session
from mlxcluster.launch.trainer import parse_trainer_args, training_request


def two_remote_hosts(tmp_path: Path) -> str:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": f"192.0.2.{i}", "ips": [f"192.0.2.{i}"]} for i in (1, 2)]}))
    return str(hostfile)


@pytest.fixture
def steps(monkeypatch) -> list[str]:
    """Every step of the session that reaches a host, recorded in order (and
    run nowhere): the python check, the script, the code, the preflight, the
    model and data folders."""
    called: list[str] = []

    def record(name, result=None):
        def step(*args, **kwargs):
            called.append(name)
            return result(*args) if result else None
        return step

    monkeypatch.setattr(session, "require_job_python", record("python"))
    monkeypatch.setattr(sync, "sync_script", record("script"))
    monkeypatch.setattr(code, "sync_code", record("code", lambda job, env, on_event: job))
    monkeypatch.setattr(preflight, "preflight",
                        record("preflight", lambda job, env, on_event: (job, "0.32.4")))
    monkeypatch.setattr(sync, "sync_model", record("model"))
    monkeypatch.setattr(sync, "sync_data", record("data"))
    return called


def test_the_steps_come_in_one_order_on_one_connection_per_host(tmp_path, steps, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.py").write_text("print('hi')\n")
    checked = []
    request = LaunchRequest(
        LaunchFlags(JobSource(hostfile=two_remote_hosts(tmp_path))), "mlxserve",
        program=partial(program_job, argv=(str(tmp_path / "serve.py"), "--port", "8080")),
        check=lambda job, env, on_event: checked.append(job) or steps.append("check"),
        models=("M",), data=("D",))
    events: list[object] = []
    with launch_session(request, {}, events.append) as prepared:
        assert steps == ["python", "check", "script", "code", "preflight", "model", "data"]
        job = prepared.job
        # The check saw the job as it will run, its hosts already sharing one connection each.
        assert checked == [job]
        assert all(any("ControlPath" in o for o in h.ssh_options) for h in job.hosts)
        folder = next(o for o in job.hosts[0].ssh_options if "ControlPath" in o).split("=", 1)[1]
        assert Path(folder).parent.is_dir()
    assert not Path(folder).parent.exists()  # the session's connections ended with it
    assert job.program == (str(tmp_path / "serve.py"), "--port", "8080") and job.tag_output
    assert prepared.run_id.startswith("mlxserve-") and prepared.mlx_version == "0.32.4"
    assert prepared.inventory is None and not job.detached


def test_a_check_refuses_before_anything_is_sent(tmp_path, steps):
    """serve's split check: exit 2 before the model (or anything) is sent."""
    def refuse(job, env, on_event):
        steps.append("check")
        raise InputError("2 KV heads do not split over 3 ranks", "use 2 hosts")

    request = LaunchRequest(LaunchFlags(JobSource(hostfile=two_remote_hosts(tmp_path))),
                            "mlxserve", check=refuse, models=("M",))
    with pytest.raises(InputError, match="KV heads"), launch_session(request, {}, print):
        pass
    assert steps == ["python", "check"]


def test_the_flags_turn_steps_off(tmp_path, steps):
    """--no-preflight, --no-sync-code, --no-sync-script and train's
    --no-sync-data; the python is still looked for."""
    (tmp_path / "s.py").write_text("")
    flags = LaunchFlags(JobSource(hostfile=two_remote_hosts(tmp_path)), preflight=False,
                        send_code=False)
    request = program_request((str(tmp_path / "s.py"),), flags, detached=True, send_script=False)
    with launch_session(request, {}, print) as prepared:
        assert steps == ["python"]
    assert prepared.mlx_version is None and prepared.job.detached
    assert prepared.run_id.startswith("mlxrun-")


def test_train_asks_for_its_folders_and_checks_the_batch_over_the_ranks(tmp_path, steps):
    args = parse_trainer_args(("--config", "tiny", "--data", str(tmp_path / "d"),
                               "--init_from", str(tmp_path / "m"), "--out", str(tmp_path / "o")))
    flags = LaunchFlags(JobSource(hostfile=two_remote_hosts(tmp_path)))
    request = training_request(args, flags, detached=False, send_folders=True)
    assert request.models == (str(tmp_path / "m"),) and request.data == (str(tmp_path / "d"),)
    assert training_request(args, flags, detached=False, send_folders=False).data == ()
    three = LaunchFlags(JobSource(local_ranks=3))
    with pytest.raises(InputError, match="does not split over 3 ranks"), \
            launch_session(training_request(args, three, detached=False, send_folders=True), {}, print):
        pass
    assert steps == []  # refused from the ranks' count alone


def test_choose_job_says_where_the_settings_came_from(tmp_path, monkeypatch):
    """The inventory found by default and what tune recorded: Asides (stderr),
    never the job's stdout."""
    hostfile = two_remote_hosts(tmp_path)
    Path(f"{hostfile}.args").write_text("--connections-per-ip 2\n")
    events: list[object] = []
    job, inventory = choose_job(JobSource(hostfile=hostfile), events.append)
    assert job.connections_per_ip == 2 and inventory is None
    assert [type(e) for e in events] == [Aside] and f"{hostfile}.args" in events[0].text

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text("cluster: c\npython: relative/python\nhosts: []\n")
    result = CliRunner().invoke(cli, ["run", "--", "x.py"])
    assert result.exit_code == 2, result.output
    assert "inventory: ./cluster.yaml (current directory)" in result.stderr
    assert "inventory:" not in result.stdout


def test_a_serve_shaped_request_on_local_ranks():
    """What serve asks (an mlx_lm module on every rank), prepared for real on
    2 local ranks: the real probe judges mlx_lm there as it does for `run -m
    mlx_lm`, the real all_sum runs; the job is left ready for the jobs layer
    (``run_program``, which `run` launches through: tests/test_run_local.py)."""
    events: list[object] = []
    argv = ("-m", "mlx_lm.server", "--model", "M", "--port", "8080")
    request = LaunchRequest(LaunchFlags(JobSource(local_ranks=2, python=sys.executable)),
                            "mlxserve", program=partial(program_job, argv=argv))
    with launch_session(request, dict(os.environ), events.append) as prepared:
        assert prepared.job.imports == ("mlx_lm",) and prepared.job.program == argv
    checked = [e.text for e in events if isinstance(e, Checked)]
    assert any(t.startswith("1 host(s) run") and t.endswith("and mlx_lm") for t in checked), checked
    assert any(t.startswith("smoke: all_sum over 2 ranks") for t in checked), checked
    assert prepared.mlx_version and prepared.run_id.startswith("mlxserve-")
