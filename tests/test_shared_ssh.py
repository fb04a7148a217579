"""Which jobs share one ssh connection per host, and the options that do it
(ssh.shared, jobs.connections). The logins counted on real hosts are in
tests/lab/test_shared_ssh_lab.py."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

from mlxcluster.jobs.connections import can_share, shared_connections
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import job_local
from mlxcluster.ssh import shared
from mlxcluster.ssh.launcher_ssh import write_wrapper


def remote_job(ranks_on_first_host: int = 1):
    job = job_local(2, "ring", "python3")
    hosts = [RankHost("mac1", "10.0.0.1", ("10.0.0.1",), "python3", ssh_options=("-p", "2222"))] * \
        ranks_on_first_host + [RankHost("mac2", "10.0.0.2", ("10.0.0.2",), "python3", user="me")]
    return replace(job, hosts=tuple(hosts))


def test_the_options_share_one_connection_and_keep_the_master_alive_checked():
    options = shared.share_options("/tmp/mlxc-abc")
    pairs = dict(o.split("=", 1) for o in options[1::2])
    assert options[0::2] == ("-o",) * 5
    assert pairs == {"ControlMaster": "auto", "ControlPath": "/tmp/mlxc-abc/%C",
                     "ControlPersist": str(shared.PERSIST_S), "ServerAliveInterval": "5",
                     "ServerAliveCountMax": "3"}
    assert shared.shared_in(("-p", "22", *options)) == options
    assert shared.shared_in(("-F", "/x/config", "-p", "22")) == ()


def test_the_socket_folder_is_private_and_short():
    folder = shared.open_folder()
    try:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        # macOS: a unix socket path is at most 104 bytes; %C expands to 40 hex digits
        assert len(f"{folder}/{'0' * 40}") < 104
    finally:
        shared.close(folder)
    assert not os.path.exists(folder)


def test_only_remote_hosts_with_few_ranks_share():
    assert not can_share(job_local(2, "ring", "python3").hosts)  # no ssh at all
    assert can_share(remote_job().hosts)
    assert can_share(remote_job(shared.MAX_SHARED_RANKS).hosts)
    assert not can_share(remote_job(shared.MAX_SHARED_RANKS + 1).hosts)  # past sshd's MaxSessions room


def test_a_shared_job_carries_the_options_until_it_ends_then_its_folder_goes():
    job = remote_job()
    with shared_connections(job, env={"PATH": os.defpath}) as sharing:
        folders = {shared.shared_in(h.ssh_options)[3].split("=", 1)[1].rsplit("/", 1)[0]
                   for h in sharing.hosts}
        (folder,) = folders
        assert os.path.isdir(folder)
        assert sharing.hosts[0].ssh_options[:2] == ("-p", "2222")  # the host's own options first
        assert [h.ssh_target for h in sharing.hosts] == ["10.0.0.1", "me@10.0.0.2"]
    assert not os.path.exists(folder)  # no master was opened: closing one is not an error
    local = job_local(2, "ring", "python3")
    with shared_connections(local) as same:
        assert same is local


def test_the_launchers_ssh_rides_on_the_jobs_connections(tmp_path):
    options = shared.share_options("/tmp/mlxc-xyz")
    write_wrapper(tmp_path, None, os.defpath, options)
    script = (tmp_path / "ssh").read_text()
    assert "ControlPath=/tmp/mlxc-xyz/%C" in script and "ControlMaster=auto" in script
    write_wrapper(tmp_path, None, os.defpath)
    assert "ControlPath" not in (tmp_path / "ssh").read_text()


def test_closing_asks_only_the_masters_whose_sockets_are_there(tmp_path, monkeypatch):
    """No socket: nothing is run. A socket whose master is gone: `ssh -O
    exit` (the real client) says so, and the folder still goes."""
    import subprocess

    ran: list[list[str]] = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: ran.append(argv) or real_run(argv, **kw))
    empty = shared.open_folder()
    shared.close(empty)
    assert ran == [] and not os.path.exists(empty)
    stale = shared.open_folder()
    (Path(stale) / ("0" * 40)).write_text("")
    shared.close(stale)
    assert [argv[-3:] for argv in ran] == [["-O", "exit", "mlxcluster-master"]]
    assert f"ControlPath={stale}/{'0' * 40}" in ran[0]
    assert not os.path.exists(stale)


def test_closing_asks_every_master_at_once(monkeypatch):
    """Three hosts' masters are asked together, not one after another: each
    (fake) ssh call waits at a barrier that only all three together pass."""
    import subprocess
    import threading

    together = threading.Barrier(3, timeout=5)
    asked: list[str] = []

    def ssh(argv, **kw):
        asked.append(argv[2])
        together.wait()  # raises BrokenBarrierError (the test fails) if the calls were serial
        return subprocess.CompletedProcess(argv, 255, "", "")

    monkeypatch.setattr(subprocess, "run", ssh)
    folder = shared.open_folder()
    for name in ("a" * 40, "b" * 40, "c" * 40):
        (Path(folder) / name).write_text("")
    shared.close(folder)
    assert sorted(asked) == [f"ControlPath={folder}/{c * 40}" for c in "abc"]
    assert not os.path.exists(folder)
