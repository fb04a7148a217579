"""The one way to run a command on a host (mlxcluster/ssh/runner.py): every runner
has its one ``run``, the process runner keeps its contract on this machine, and the
jobs layer's host commands go through it, so the unit tests' one fake (FakeSsh,
installed by ``hosts_run_by``) stands in for the hosts of every layer. Over real
sshd: tests/lab/test_lab.py, test_jobs_lab.py, test_code_sync_lab.py,
test_shared_ssh_lab.py."""

from __future__ import annotations

import inspect
import io
import shlex
import sys

import pytest

from mlxcluster.errors import EXIT_USAGE, InputError
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.jobs.hosts import HostResult, host_link, hosts_from_inventory, run_script
from mlxcluster.jobs.job import job_from_inventory, job_local
from mlxcluster.jobs.job_python import require_job_python
from mlxcluster.jobs.preflight import probe_capture
from mlxcluster.jobs.restarts import unreachable_hosts
from mlxcluster.ssh.openssh import OpenSshRunner
from mlxcluster.ssh.remote import ParamikoRunner
from mlxcluster.ssh.results import SshError
from mlxcluster.ssh.runner import HostRunner, ProcessRunner, unreachable
from mlxcluster.transfer.link import NoAnswer
from tests.fakes import FakeSsh, result

TWO_MACS = """cluster: lab
python: /opt/venv/bin/python
hosts:
  - {name: mac1, ssh: mac1.local}
  - {name: mac2, ssh: mac2.local}
"""


def bash(command: str) -> list[str]:
    return ["bash", "-c", command]


def keyword_parameters(run) -> list[tuple[str, object]]:
    return sorted((p.name, p.default) for p in inspect.signature(run).parameters.values()
                  if p.kind is p.KEYWORD_ONLY)


@pytest.mark.parametrize("runner", [ParamikoRunner, OpenSshRunner, ProcessRunner, FakeSsh])
def test_every_runner_has_the_one_run(runner):
    assert keyword_parameters(runner.run) == keyword_parameters(HostRunner.run) == [
        ("port", None), ("stdin", None), ("timeout", None), ("user", None)]
    positional = [p for p in inspect.signature(runner.run).parameters.values()
                  if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert len(positional) == 3  # self, the host, the command


def test_the_process_runner_gives_back_what_the_command_did():
    runner = ProcessRunner(bash)
    assert isinstance(runner, HostRunner)
    done = runner.run("here", "echo out; echo err >&2; exit 3")
    assert (done.stdout, done.stderr, done.exit_status) == ("out\n", "err\n", 3)
    for given in ("text in", b"text in", io.BytesIO(b"text in")):
        assert runner.run("here", "cat", stdin=given).stdout == "text in"
    assert runner.run("here", "cat").stdout == ""  # no input: not this process's stdin


def test_ssh_exit_255_is_given_back_and_named():
    done = ProcessRunner(bash).run("here", "echo 'ssh: connect to host x: refused' >&2; exit 255")
    assert unreachable(done) and "refused" in done.stderr
    assert not unreachable(result(exit_status=1))


def test_a_command_past_its_timeout_and_a_missing_client_raise_ssh_errors():
    with pytest.raises(SshError) as late:
        ProcessRunner(bash).run("mac1", "sleep 5", timeout=0.3)
    assert late.value.kind == "command-timeout"
    assert str(late.value) == "mac1: command did not finish within 0 s"
    with pytest.raises(SshError) as missing:
        ProcessRunner(lambda c: ["/nonexistent/ssh", c]).run("mac1", "true")
    assert missing.value.kind == "ssh" and "/nonexistent/ssh" in str(missing.value)


def test_the_env_given_is_the_programs():
    runner = ProcessRunner(bash, env={"PATH": "/usr/bin:/bin", "MARK": "given"})
    assert runner.run("here", "echo $MARK").stdout == "given\n"


# ---- the jobs layer through the one fake --------------------------------------------------

def test_a_rank_hosts_script_goes_to_the_fake_by_host_name(hosts_run_by):
    hosts = hosts_from_inventory(parse_inventory(TWO_MACS))
    fake = hosts_run_by(FakeSsh({("mac2", "uptime"): result("up\n")},
                                default=result(stderr="boom\n", exit_status=2)))
    assert [run_script(h, "uptime") for h in hosts] == [
        HostResult("mac1", False, "", "boom"), HostResult("mac2", True, "up\n")]
    assert fake.calls == [("mac1", "uptime"), ("mac2", "uptime")]


def test_a_missing_python_and_an_unreachable_host_are_told_apart(hosts_run_by):
    job = job_from_inventory(parse_inventory(TWO_MACS), "ring")
    asked = "/opt/venv/bin/python -S -c ''"
    fake = hosts_run_by(FakeSsh({
        ("mac1", asked): result(stderr="bash: /opt/venv/bin/python: No such file or directory",
                                exit_status=127),
        ("mac2", asked): result(stderr="ssh: connect to host mac2.local port 22: No route to host",
                                exit_status=255)}, default=None))
    with pytest.raises(InputError) as missing:
        require_job_python(job)
    assert str(missing.value) == "python not found: /opt/venv/bin/python on mac1"
    assert missing.value.exit_code == EXIT_USAGE
    assert unreachable_hosts(job) == ["mac2"]
    assert sorted(fake.calls) == [("mac1", asked)] * 2 + [("mac2", asked)] * 2


def test_a_host_that_does_not_answer_in_time(hosts_run_by):
    job = job_from_inventory(parse_inventory(TWO_MACS), "ring")

    def hangs(host, command):
        raise SshError("command-timeout", f"{host}: command did not finish within 20 s")

    hosts_run_by(FakeSsh(default=hangs))
    assert unreachable_hosts(job) == ["mac1", "mac2"]
    assert run_script(job.hosts[0], "true", timeout=20).error == "timed out after 20 s"
    capture = probe_capture(job.hosts[0], job.python, {}, timeout=7)
    assert capture.error == "no answer within 7 s"
    with pytest.raises(NoAnswer, match="mac1 did not answer within 9 s"):
        host_link(job.hosts[0]).run("true", timeout=9)


def test_ranks_on_this_machine_run_through_the_runner_too(hosts_run_by):
    """--local ranks: no ssh, but the same runner (bash here, or the fake)."""
    job = job_local(2, "ring", sys.executable)
    assert run_script(job.hosts[0], "echo here").output == "here\n"
    fake = hosts_run_by(FakeSsh({"echo here": result("faked\n")}, default=None))
    assert run_script(job.hosts[0], "echo here").output == "faked\n"
    assert fake.calls == [(job.hosts[0].name, "echo here")]


def test_serve_asks_a_rank_hosts_free_port_through_the_fake(hosts_run_by):
    from mlxcluster.errors import MlxclusterError
    from mlxcluster.serve.tunnel import FREE_PORT_SCRIPT, free_port_on

    mac1, mac2 = hosts_from_inventory(parse_inventory(TWO_MACS))
    asked = f"/opt/venv/bin/python -c {shlex.quote(FREE_PORT_SCRIPT)}"
    refused = result(stderr="ssh: connect to host mac2.local port 22: Connection refused\n",
                     exit_status=255)
    fake = hosts_run_by(FakeSsh({("mac1", asked): result("51234\n"), ("mac2", asked): refused},
                                default=None))
    assert free_port_on(mac1) == 51234
    with pytest.raises(MlxclusterError, match="mac2: could not find a free port for the server "
                                              r"\(ssh: connect to host mac2.local port 22: Connection refused\)"):
        free_port_on(mac2)
    assert fake.calls == [("mac1", asked), ("mac2", asked)]
