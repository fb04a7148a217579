"""SSH plumbing without the lab: config resolution, argv quoting, real
loopback failures from OpenSSH and paramiko, parallel outcomes, and the
data-path listener/connector scripts run for real on loopback."""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
import sys
import threading
import time

import paramiko
import pytest

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import BAD
from mlxcluster.doctor.checks.network import data_path
from mlxcluster.doctor.datapath import AGENT, Connect, DataPathReport, Endpoint, ring_endpoints
from mlxcluster.doctor.live import LiveCollection
from mlxcluster.ssh.hops import HOPS, hop_argv, hop_outcome
from mlxcluster.ssh.openssh import OpenSshRunner, explain_failure, ssh_argv
from mlxcluster.ssh.remote import (
    ParamikoRunner,
    SshError,
    fingerprint,
    load_ssh_config,
    resolve_target,
    run_parallel,
    split_jump,
)
from tests.fakes import FakeSsh, result

SSH_CONFIG = """\
Host studio-*
  User admin
  Port 2222
  IdentityFile ~/.ssh/id_cluster
  UserKnownHostsFile /tmp/cluster_known_hosts
Host studio-2
  HostName 192.168.1.22
  ProxyJump jump@bastion:2200
Host *
  ServerAliveInterval 30
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ssh_config_is_honoured(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(SSH_CONFIG)
    config = load_ssh_config(str(cfg))
    t = resolve_target(config, "studio-2")
    assert (t.hostname, t.port, t.user) == ("192.168.1.22", 2222, "admin")
    assert t.key_files[0].endswith("/.ssh/id_cluster") and "~" not in t.key_files[0]
    assert t.proxy_jump == ("jump@bastion:2200",)
    assert t.known_hosts == ("/tmp/cluster_known_hosts",)
    # Inventory user/port win over the config.
    t = resolve_target(config, "studio-1", user="me", port=22)
    assert (t.hostname, t.port, t.user, t.proxy_jump) == ("studio-1", 22, "me", ())
    assert split_jump("jump@bastion:2200") == ("bastion", "jump", 2200)
    assert split_jump("bastion") == ("bastion", None, None)


def test_openssh_argv_is_batch_mode_and_never_a_shell(tmp_path):
    argv = ssh_argv("studio-1", "true", ssh_config="/etc/cfg", connect_timeout=3, user="me", port=2222)
    assert argv == ["ssh", "-F", "/etc/cfg", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                    "-o", "ConnectTimeout=3", "-l", "me", "-p", "2222", "--", "studio-1", "true"]
    assert hop_argv("a b", "me", None, 5) == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                                              "-o", "ConnectTimeout=5", "-l", "me", "--", "a b", "true"]


def test_real_openssh_refused_on_loopback():
    runner = OpenSshRunner("/dev/null", connect_timeout=2, command_timeout=10)
    try:
        runner.run("127.0.0.1", "true", port=free_port())
    except SshError as err:
        assert err.kind == "refused", err
        assert "Remote Login" in err.hint
    else:
        raise AssertionError("ssh to a closed port succeeded")


def test_openssh_stderr_causes():
    assert explain_failure("h", 255, "Host key verification failed.\r\n").kind == "unknown-host-key"
    assert explain_failure("h", 255, "root@h: Permission denied (publickey).\r\n").kind == "auth"
    assert explain_failure("h", 255, "ssh: connect to host h port 22: No route to host\r\n").kind == "unreachable"
    other = explain_failure("h", 255, "kex_exchange_identification: read: Connection reset by peer\n")
    assert other.kind == "ssh" and "Connection reset" in str(other)


def test_real_paramiko_refused_and_timeout_on_loopback(tmp_path):
    known = tmp_path / "known_hosts"
    with ParamikoRunner(None, known_hosts=str(known), connect_timeout=1.0) as runner:
        started = time.monotonic()
        try:
            runner.run("127.0.0.1", "true", port=free_port())
        except SshError as err:
            assert err.kind == "refused", err
        else:
            raise AssertionError("connect to a closed port succeeded")
        # A listener that never speaks SSH: the banner timeout bounds the wait.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(1)
            try:
                runner.run("127.0.0.1", "true", port=silent.getsockname()[1])
            except SshError as err:
                assert err.kind in ("timeout", "ssh"), err
            else:
                raise AssertionError("silent server accepted")
        assert time.monotonic() - started < 8


def test_fingerprint_matches_ssh_keygen(tmp_path):
    key_file = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True, timeout=20)
    out = subprocess.run(["ssh-keygen", "-lf", f"{key_file}.pub"], capture_output=True, text=True,
                         timeout=20).stdout
    key = paramiko.Ed25519Key.from_private_key_file(str(key_file))
    assert fingerprint(key) == out.split()[1]


def test_run_parallel_collects_errors_and_runs_concurrently():
    def work(name: str) -> str:
        time.sleep(0.2)
        if name == "bad":
            raise SshError("timeout", "bad timed out")
        return name.upper()

    started = time.monotonic()
    outcomes = run_parallel(["a", "bad", "c", "d", "e", "f", "g", "h"], work)
    assert time.monotonic() - started < 1.0  # 8 x 0.2 s in parallel
    assert outcomes["a"].value == "A" and outcomes["a"].ok
    assert not outcomes["bad"].ok and outcomes["bad"].error.kind == "timeout"
    assert list(outcomes) == ["a", "bad", "c", "d", "e", "f", "g", "h"]


def test_ring_endpoints_follow_mlx_launch_numbering():
    plan = ring_endpoints({"a": ["10.0.0.1"], "b": ["10.0.0.2", "10.0.1.2"], "c": ["10.0.0.3"]})
    assert [(e.host, e.ip, e.port) for eps in plan.values() for e in eps] == [
        ("a", "10.0.0.1", 32323), ("b", "10.0.0.2", 32324), ("b", "10.0.1.2", 32325), ("c", "10.0.0.3", 32326)]


def test_data_path_agent_on_loopback():
    """Real sockets: a bound port accepts (the agent keeps accepting while its
    own connects run: here it connects to itself), an unbound one is refused,
    an IP not on this host cannot be bound (nothing is sent to it)."""
    open_port, closed_port = free_port(), free_port()
    spec = {"binds": [["127.0.0.1", open_port], ["198.51.100.250", open_port]], "seconds": 20}
    agent = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps(spec)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(agent.stdout.readline())
        assert ready["bound"] == [["127.0.0.1", open_port]]
        assert ready["errors"] == [["198.51.100.250", open_port, "EADDRNOTAVAIL"]]
        request = {"targets": [["127.0.0.1", open_port], ["127.0.0.1", closed_port]], "timeout": 2}
        agent.stdin.write(json.dumps(request) + "\n")
        agent.stdin.flush()
        rows = json.loads(agent.stdout.readline())
        assert [r[2] for r in rows] == ["ok", "ECONNREFUSED"]
        assert agent.poll() is None  # still listening until stdin closes
    finally:
        agent.stdin.close()  # stdin EOF ends the agent
        assert agent.wait(timeout=5) == 0

    report = DataPathReport(
        endpoints={"a": [Endpoint("a", "127.0.0.1", open_port)], "b": [Endpoint("b", "127.0.0.1", closed_port)]},
        bind_errors={"a": [("198.51.100.250", open_port, "EADDRNOTAVAIL")]},
        connects=[Connect("b", "a", "127.0.0.1", open_port, rows[0][2], 0.0),
                  Connect("a", "b", "127.0.0.1", closed_port, rows[1][2], 0.0)],
    )
    live = LiveCollection({}, {}, {}, data_path=report)
    ctx = CheckContext({}, live=True, services={"live": live})
    verdict = data_path(ctx)
    assert verdict.status is Status.FAIL
    # The missing IP is data-ips-present's finding: noted, not blamed here.
    assert "198.51.100.250" in verdict.evidence["a"] and "see data-ips-present" in verdict.evidence["a"]
    assert not verdict.evidence["a"].startswith("✗")
    assert "from a: refused: nothing listening" in verdict.evidence["b"]
    assert "allow TCP" in verdict.hint


def test_host_key_hint_names_the_port():
    from mlxcluster.ssh.remote import HostKeyUnknown

    err = HostKeyUnknown("[10.0.0.2]:2222", "ssh-ed25519", "SHA256:abc", "/k")
    assert "ssh -p 2222 10.0.0.2" in err.hint and "SHA256:abc" in str(err)


def test_hop_script_runs_every_hop_at_once_and_reports_each():
    """The script the first host runs: real processes, one row per hop, in order."""
    hops = [["sh", "-c", "sleep 1; echo out; exit 3"], ["sh", "-c", "echo 'Permission denied' >&2; exit 255"],
            ["/nonexistent/ssh", "x"], ["sleep", "30"], ["sh", "-c", "sleep 1"]]
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", HOPS, json.dumps({"hops": hops, "timeout": 1.5})],
                         capture_output=True, text=True, timeout=20)
    elapsed = time.monotonic() - started
    rows = json.loads(out.stdout)
    assert [r[0] for r in rows] == [3, 255, 127, None, 0]
    assert rows[0][1] == "out\n" and "Permission denied" in rows[1][2]
    assert "No such file" in rows[2][2]
    assert elapsed < 3.0  # concurrent: the slowest hop (1.5 s), not the sum (3.5 s)
    timed_out = hop_outcome("b", rows[3], 1.5)
    assert not timed_out.ok and timed_out.error.kind == "command-timeout"
    denied = hop_outcome("c", rows[1], 1.5)
    assert denied.ok and denied.value.exit_status == 255  # the check explains 255 itself


def test_hop_script_runs_at_most_parallel_hops_at_once():
    """Every host hops when doctor judges every pair: each runs at most
    ``parallel`` at a time, so no host receives more than sshd's MaxStartups."""
    hops = [["sh", "-c", "sleep 0.5"]] * 4
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", HOPS, json.dumps({"hops": hops, "timeout": 5, "parallel": 2})],
                         capture_output=True, text=True, timeout=20)
    elapsed = time.monotonic() - started
    assert [r[0] for r in json.loads(out.stdout)] == [0, 0, 0, 0]
    assert 1.0 <= elapsed < 2.5  # two rounds of two, not one of four


def test_hop_script_ends_with_its_hops_once_nobody_reads_it():
    """sshd leaves a command without a terminal running when doctor's
    connection drops (Ctrl-C, a lost link); the script finds its output pipe
    gone within a moment and ends with its hops, not after their timeout."""
    import psutil

    script = subprocess.Popen([sys.executable, "-c", HOPS, json.dumps({"hops": [["sleep", "60"]], "timeout": 90})],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        while not psutil.Process(script.pid).children():  # the hop started
            time.sleep(0.05)
        hop = psutil.Process(script.pid).children()[0]
        assert select.select([script.stdout], [], [], 5)[0], "no beat from the script within 5 s"
        assert script.stdout.readline() == b"\n"  # the script's beat, while its hop runs
        script.stdout.close()  # what sshd's exit does to the session's pipe
        assert script.wait(timeout=10) == 3
        hop.wait(timeout=10)  # psutil.TimeoutExpired here: the hop outlived the script
    finally:
        script.kill()


def test_every_host_hops_to_every_other_starting_after_itself():
    """collect_host_to_host: the first host to all at once, the others
    PARALLEL at a time starting with the host after them; a host not
    connected makes no hop."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from mlxcluster.doctor.live import collect_host_to_host
    from mlxcluster.ssh.hops import PARALLEL
    from mlxcluster.ssh.results import Outcome

    hosts = [SimpleNamespace(name=n, ssh=f"{n}.lan", user=None, port=None, python="/py") for n in "abcd"]
    links = {}
    for h in hosts:
        links[h.name] = Future()
        links[h.name].set_result(Outcome(h.name, value=True) if h.name != "d" else
                                 Outcome(h.name, error=SshError("refused", "d: refused")))

    def every_hop_ok(host, command):
        spec = json.loads(shlex.split(command)[-1])
        return result(json.dumps([[0, "", "", 0.1] for _ in spec["hops"]]) + "\n")

    runner = FakeSsh(default=every_hop_ok)
    first, hops = collect_host_to_host(runner, hosts, links, 5.0)
    calls = dict(runner.calls)  # each host's command, by its ssh address
    assert first == "a"
    assert {s: list(h) for s, h in hops.items()} == {"a": ["b", "c", "d"], "b": ["c", "d", "a"], "c": ["d", "a", "b"]}
    assert "parallel" not in json.loads(shlex.split(calls["a.lan"])[-1])
    assert json.loads(shlex.split(calls["b.lan"])[-1])["parallel"] == PARALLEL
    assert "d.lan" not in calls


def test_data_path_agent_waits_briefly_for_a_busy_port():
    """A port whose listener exits within the patience is taken; one held
    longer is reported EADDRINUSE (the data-path check: 'port already in use')."""
    freed, held = socket.socket(), socket.socket()
    for s in (freed, held):
        s.bind(("127.0.0.1", 0))
        s.listen(1)
    freed_port, held_port = freed.getsockname()[1], held.getsockname()[1]
    threading.Timer(0.4, freed.close).start()
    spec = {"binds": [["127.0.0.1", freed_port], ["127.0.0.1", held_port]], "seconds": 20, "busy_patience": 1.0}
    agent = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps(spec)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(agent.stdout.readline())
        assert ready["bound"] == [["127.0.0.1", freed_port]]
        assert ready["errors"] == [["127.0.0.1", held_port, "EADDRINUSE"]]
        # The holder is named (lsof, or ss): this test process.
        [[ip, port, holder]] = ready["holders"]
        assert (ip, port) == ("127.0.0.1", held_port) and holder.endswith(f"(pid {os.getpid()})"), holder
    finally:
        agent.stdin.close()
        held.close()
        assert agent.wait(timeout=5) == 0

    report = DataPathReport(endpoints={"a": [Endpoint("a", "127.0.0.1", held_port)]},
                            bind_errors={"a": [("127.0.0.1", held_port, "EADDRINUSE")]},
                            holders={"a": {("127.0.0.1", held_port): holder}})
    verdict = data_path(CheckContext({}, live=True, services={"live": LiveCollection({}, {}, {}, data_path=report)}))
    assert verdict.status is Status.FAIL
    assert verdict.evidence["a"] == f"{BAD}cannot listen on 127.0.0.1:{held_port}: port already in use by {holder}"
    assert "--starting-port" in verdict.hint


@pytest.mark.parametrize("text", ["Match bogus\n", "Host a\n  Port notanumber\n  =x\n", b"\xff\xfe\x00bin"])
def test_an_ssh_config_paramiko_cannot_read_is_an_input_error(tmp_path, text):
    from mlxcluster.errors import InputError
    from mlxcluster.ssh.remote import load_ssh_config

    cfg = tmp_path / "config"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=f"ssh config {cfg} cannot be read"):
        load_ssh_config(str(cfg))
