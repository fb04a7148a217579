"""The launchers' ssh (keepalive, BatchMode, the inventory's ssh_config), the
run marker and sweep script, naming a lost host, and dropping mlx.launch's
own stop-path tracebacks. The multi-host behaviour is in
tests/lab/test_dead_host_lab.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxcluster.jobs.cleanup import (
    LauncherStopNoise,
    bracketed,
    launcher_env,
    lost_host,
    marked_program,
    new_run_id,
    run_pattern,
    stop_script,
)
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from mlxcluster.ssh.launcher_ssh import WRAPPER_MARK, launcher_environment, real_ssh
from tests import waits

# What mlx.launch 0.32.4 printed on stderr when it stopped the other ranks
# after labhost3's ssh was lost (lab run; paths shortened).
LAUNCHER_STOP_TRACEBACK = """\
Exception in thread Thread-2 (_thread_fn):
Traceback (most recent call last):
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
    self.run()
  File "/work/main/.venv/lib/python3.11/site-packages/mlx/_distributed_utils/launch.py", line 228, in _thread_fn
    command.terminate()
  File "/work/main/.venv/lib/python3.11/site-packages/mlx/_distributed_utils/launch.py", line 97, in terminate
    c = run(
        ^^^^
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/subprocess.py", line 571, in run
    raise CalledProcessError(retcode, process.args,
subprocess.CalledProcessError: Command 'ssh root@10.77.122.12 'pid=$(cat /tmp/lab/t2/tmp.ePmRlcjYNy
); if ps -p $pid >/dev/null; then     kill $pid;     echo 1; else     echo 0; fi; rm /tmp/lab/t2/tmp.ePmRlcjYNy
'' returned non-zero exit status 1.""".splitlines()

RANK_TRACEBACK = """\
Traceback (most recent call last):
  File "/x/reference_train/train.py", line 10, in <module>
    main()
ValueError: global_batch 7 does not divide by 2 ranks""".splitlines()


def feed_all(lines: list[str]) -> list[str]:
    noise = LauncherStopNoise()
    shown = [out for line in lines for out in noise.feed(line)]
    return shown + noise.flush()


def test_the_launchers_stop_traceback_is_dropped_and_everything_else_kept():
    lines = ["step 5 | loss 5.8", *LAUNCHER_STOP_TRACEBACK, "[WARN] Node with rank 2 exited with code 255",
             *RANK_TRACEBACK]
    assert feed_all(lines) == ["step 5 | loss 5.8", "[WARN] Node with rank 2 exited with code 255",
                               *RANK_TRACEBACK]


def test_a_block_that_does_not_end_as_the_launchers_does_is_shown_whole():
    unfinished = LAUNCHER_STOP_TRACEBACK[:6]
    assert feed_all(unfinished) == unfinished
    other_thread = ["Exception in thread Thread-1 (_thread_fn):", "Traceback (most recent call last):",
                    '  File "/x/y.py", line 1, in f', "RuntimeError: returned non-zero exit status 1."]
    assert feed_all(other_thread) == other_thread  # not mlx.launch's code


def test_the_lost_host_is_named_from_the_rank_or_from_mpiruns_message():
    hosts = ["labhost1", "labhost2", "labhost3"]
    assert lost_host(255, 2, hosts, ()) == "labhost3"
    mpi = ("A daemon failed to report back after being spawned.", "  Local host:    vm",
           "  Remote host:   labhost3", "  Daemon exit status: 255")
    assert lost_host(255, None, hosts, mpi) == "labhost3"
    assert lost_host(1, 2, hosts, mpi) is None  # a rank's own failure is not ssh's
    assert lost_host(255, None, hosts, ()) is None


def test_every_rank_carries_the_run_id_and_python_accepts_the_marker():
    run_id = new_run_id()
    program = marked_program(run_id, ["-c", "import sys; print(sys._xoptions['mlxcluster_run'])"])
    assert waits.run([sys.executable, *program]).stdout.strip() == run_id
    script = stop_script(run_id)
    assert run_id not in script and f"[{run_id[0]}]{run_id[1:]}" in script


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_stop_script_stops_every_rank_of_the_run_and_nothing_else(shell, tmp_path):
    """Run in a real shell on this machine: a rank that ignores TERM is
    KILLed, a stopped (SIGSTOP) one too, another run's process is left alone,
    the run's stack dumps go; and with nothing left of the run (a job that
    ended cleanly) the script still succeeds."""
    run_id, other_id = new_run_id(), new_run_id()
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    ranks = [subprocess.Popen([sys.executable, *marked_program(run_id, ["-c", ignore_term])]),
             subprocess.Popen([sys.executable, *marked_program(run_id, ["-c", "import time; time.sleep(120)"])])]
    other = subprocess.Popen([sys.executable, *marked_program(other_id, ["-c", "import time; time.sleep(120)"])])
    stacks = Path(STACKS_ROOT) / run_id
    stacks.mkdir(parents=True)
    (stacks / "rank0.pid").write_text("1 host\n")
    try:
        time.sleep(0.5)  # the TERM handler is installed
        ranks[1].send_signal(signal.SIGSTOP)
        done = waits.run([shell, "-c", stop_script(run_id)])
        assert done.returncode == 0, done.stderr
        assert [r.wait(timeout=10) for r in ranks] == [-signal.SIGKILL, -signal.SIGTERM]
        assert other.poll() is None
        assert not stacks.exists()
        again = waits.run([shell, "-c", stop_script(run_id)])
        assert again.returncode == 0 and again.stderr == ""
        assert other.poll() is None
    finally:
        for proc in (*ranks, other):
            proc.kill()
            proc.wait(timeout=10)


def test_the_sweep_stops_ranks_and_open_mpis_daemons_of_the_run_not_a_command_naming_it():
    """The sweep's pattern (``run_pattern``) in a real shell: a rank
    (``-X mlxcluster_run=RUN_ID``) and a daemon as Open MPI 5 starts it from
    the launcher's environment (``--prtemca mlxcluster_run RUN_ID``, the form
    a real prted carried in the lab: tests/lab/test_run_lab.py) are stopped;
    ``mlxcluster stop RUN_ID`` on the same machine is not."""
    run_id = new_run_id()
    assert launcher_env(run_id) == {"PRTE_MCA_mlxcluster_run": run_id}
    sleep = ["-c", "import time; time.sleep(120)"]
    rank = subprocess.Popen([sys.executable, *marked_program(run_id, sleep)])
    daemon = subprocess.Popen([sys.executable, *sleep, "--prtemca", "mlxcluster_run", run_id])
    naming = subprocess.Popen([sys.executable, *sleep, "stop", run_id])
    try:
        done = waits.run(["sh", "-c", stop_script(run_id, run_pattern(run_id))])
        assert done.returncode == 0, done.stderr
        assert [rank.wait(timeout=10), daemon.wait(timeout=10)] == [-signal.SIGTERM] * 2
        assert naming.poll() is None
    finally:
        for proc in (rank, daemon, naming):
            proc.kill()
            proc.wait(timeout=10)


def test_the_stop_script_survives_another_sweep_of_the_same_process_table():
    """Lab hosts share one process table, as ranks run here do: another
    host's sweep, KILLing whatever carries the run id, once killed this
    sweep's own remover half way (seen in CI: the run's stack folder left).
    Nothing the script starts carries the run id."""
    run_id = new_run_id()
    stacks = Path(STACKS_ROOT) / run_id
    for i in range(200):
        (stacks / f"d{i}").mkdir(parents=True)
        (stacks / f"d{i}" / "rank0.stacks").write_text("x\n")
    other_sweep = subprocess.Popen(
        ["bash", "-c", f"while true; do pkill -KILL -f '{bracketed(run_id)}'; done"])
    try:
        done = waits.run(["sh", "-c", stop_script(run_id)])
        assert done.returncode == 0, done.stderr
        assert not stacks.exists()
    finally:
        other_sweep.kill()
        other_sweep.wait(timeout=10)
        shutil.rmtree(stacks, ignore_errors=True)


def test_the_launchers_ssh_adds_keepalive_batchmode_and_the_inventory_config(tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    record = tmp_path / "argv"
    fake = real_dir / "ssh"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    env = launcher_environment({"PATH": f"{real_dir}:/usr/bin:/bin"}, tmp_path / "bin", "~/.ssh/cluster")
    assert env["PATH"].split(":")[0] == str(tmp_path / "bin")
    # what mlx.launch runs: plain `ssh` from PATH
    subprocess.run(["ssh", "-tt", "-o", "LogLevel=QUIET", "mac1", "echo hi"], env=env, check=True, timeout=30)
    argv = record.read_text().splitlines()
    assert argv == ["-F", os.path.expanduser("~/.ssh/cluster"), "-o", "BatchMode=yes",
                    "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
                    "-o", "ServerAliveCountMax=3", "-tt", "-o", "LogLevel=QUIET", "mac1", "echo hi"]
    # a wrapper first on PATH is never taken for the real ssh (no loop)
    assert WRAPPER_MARK in (tmp_path / "bin" / "ssh").read_text()
    assert real_ssh(env["PATH"]) == str(fake)


@pytest.mark.parametrize("inventory_config", [True, False])
def test_the_launchers_ssh_gives_each_host_its_inventory_port(tmp_path, inventory_config):
    """Neither launcher can say a port: the wrapper's config does, per target
    (the ssh name mlx.launch uses and the data IP an Open MPI hostfile names),
    and the rest of the user's config still applies. Asked of the real
    OpenSSH client (``ssh -G`` prints what it would use, connecting nowhere)."""
    config = tmp_path / "cluster_config"
    config.write_text("Host studio-2 10.0.0.2\n    Port 22\n    User bob\nHost *\n    Compression yes\n")
    env = launcher_environment({"PATH": os.environ["PATH"]}, tmp_path / "bin",
                               str(config) if inventory_config else None,
                               ports={"studio-2": 2222, "10.0.0.2": 2222, "mini-1": 2200})
    wrapper = tmp_path / "bin" / "ssh"

    def resolved(target: str) -> dict[str, str]:
        out = subprocess.run([str(wrapper), "-G", target], env=env, capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)

    assert resolved("admin@studio-2")["port"] == "2222"
    assert resolved("10.0.0.2")["port"] == "2222"
    assert resolved("mini-1")["port"] == "2200"
    assert resolved("studio-1")["port"] == "22"
    if inventory_config:  # the inventory's config is read after the ports
        assert resolved("studio-2")["user"] == "bob"
        assert resolved("studio-1")["compression"] == "yes"
    # without ports, no config is written: the launcher reads what it read before
    launcher_environment({"PATH": os.environ["PATH"]}, tmp_path / "bin2", None)
    assert not (tmp_path / "bin2" / "ssh_config").exists()
