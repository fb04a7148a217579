"""A hung rank across three real lab hosts: one rank's process is stopped with
SIGSTOP (as a hung or swapped-out process looks) in the middle of training.
The job is found stalled within its --stall-timeout plus a small bound, the
diagnosis names the rank, its host and 'stopped', every rank's stacks are
saved, the exit code is 4, and nothing of the job is left on any host, the
stopped process included.

Before stall detection this job printed nothing more and waited until killed
from outside (seen: 5+ minutes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxcluster.errors import EXIT_STALLED
from mlxcluster.jobs.stall import AUTO_FLOOR_S
from tests.lab.jobs import (
    bracketed,
    left_on_hosts,
    our_prted,
    rank_process,
    start_training,
    wait_for_losses,
)
from tests.waits import FLOOR_DETECTION_BOUND_S, LAB_STALL_TIMEOUT_S, STALL_DETECTION_BOUND_S

pytestmark = pytest.mark.lab


def stop_rank_1_mid_training(lab, proc, metrics, wait_s: float,
                             losses: int = 3) -> tuple[str, str, float, str]:
    """Once the trainer has logged ``losses`` losses, stop rank 1's process (SIGSTOP,
    on labhost2) and wait up to ``wait_s`` for the job to end. Returns
    (stdout, stderr, seconds from the SIGSTOP to the end, run id). The job
    and the stopped process are killed whatever happens."""
    stopped_pid = None
    try:
        wait_for_losses(proc, metrics, losses)
        victim = lab.hosts[1]
        stopped_pid, run_id = rank_process(lab, victim, metrics.parent)
        lab.ssh(victim, f"kill -STOP {stopped_pid}")
        stopped_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=wait_s)
        return stdout, stderr, time.monotonic() - stopped_at, run_id
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if stopped_pid is not None:  # never leave a stopped process behind, even on failure
            subprocess.run(["kill", "-CONT", str(stopped_pid)], capture_output=True)
            subprocess.run(["kill", "-KILL", str(stopped_pid)], capture_output=True)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_a_stopped_rank_is_found_named_and_stopped(lab3, lab_data, tmp_path, backend):
    proc, metrics = start_training(lab3, lab_data, tmp_path, backend,
                                   "--stall-timeout", f"{LAB_STALL_TIMEOUT_S}s")
    out = metrics.parent
    stdout, stderr, ended_after, run_id = stop_rank_1_mid_training(
        lab3, proc, metrics, LAB_STALL_TIMEOUT_S + STALL_DETECTION_BOUND_S + 60)
    print(f"{backend}: ended {ended_after:.1f} s after SIGSTOP (stall timeout {LAB_STALL_TIMEOUT_S} s)")
    assert proc.returncode == EXIT_STALLED, stdout[-2000:] + stderr[-3000:]
    assert ended_after < LAB_STALL_TIMEOUT_S + STALL_DETECTION_BOUND_S, (ended_after, stderr[-2000:])
    assert "Traceback" not in stdout + stderr
    said = re.search(r"error: training stalled: no progress for (\d+) s \(stall timeout 20 s\): "
                     r"rank 1 on labhost2 is stopped \(state T[^,]*, CPU time not advancing\); "
                     r"ranks 0 and 2 wait (.*)", stderr)
    assert said, stderr[-3000:]
    # Both wait on rank 1: in one place, or (MPI, rank 1 stopped mid
    # all-reduce) rank 0 already in the next collective: each is placed.
    # (stopping.py: the ranks' per-log-step agreement on a stop, their next collective; loop.py:
    # the training loop the Trainer hands its parts, data_parallel.py: its step)
    where = r"(\S+) at ((?:train|loop|data_parallel|stopping)\.py:(\d+))(?: \(in (\S+)\))?"
    together = re.fullmatch(f"in {where}", said.group(2).strip())
    apart = re.fullmatch(f"at different places: rank 0 in {where}, rank 2 in {where}",
                         said.group(2).strip())
    assert together or apart, said.group(2)
    places = [together.groups()] * 2 if together else [apart.groups()[:4], apart.groups()[4:]]
    assert "rank 0 on labhost1: pid" in stderr and "rank 2 on labhost3: pid" in stderr
    # Every rank's state and stacks, saved in the run's folder.
    report = out / f"stall-{run_id}"
    assert f"every rank's state and Python stacks: {report}" in stderr
    assert "rank 1 on labhost2 is stopped" in (report / "summary.txt").read_text()
    for rank, (named, _, line, within) in zip((0, 2), places, strict=True):
        stacks = (report / f"rank{rank}.txt").read_text()
        function = within or named  # 'all_sum at train.py:479 (in run)'
        assert f'line {line} in {function}' in stacks
        assert "reference_train/train.py" in stacks and "rank_wrapper.py" in stacks
    assert "no stack" in (report / "rank1.txt").read_text()
    # Nothing of the job on any host: not the stopped rank, not the others, no dumps.
    time.sleep(1)
    assert left_on_hosts(lab3, bracketed(run_id), f"/tmp/mlxcluster-stacks/{bracketed(run_id)}") == {}
    assert our_prted(lab3) == []  # no Open MPI daemon of this lab either
    steps = metrics.read_text()
    time.sleep(2)  # an absence to prove: a rank still training would log a step (well under 1 s each) meanwhile
    assert metrics.read_text() == steps  # nobody trains on


def test_the_automatic_stall_timeout_stops_a_stopped_rank_at_its_floor(lab3, lab_data, tmp_path):
    """`train` without --stall-timeout (auto: 10 x the median step, at least
    60 s), ranks over ssh on their own disks, rank 1 stopped right after the
    first logged step (issue 21: the remote heartbeats must have armed the
    watch by then, or the 300 s start-up grace would apply). The tiny
    config's steps take well under a second here, so the limit is the 60 s
    floor: the job ends 60 s after rank 1's last heartbeat plus the
    detection bound, naming rank 1 and labhost2. The product's floor is
    measured as it is: no knob lowers it for the test."""
    proc, metrics = start_training(lab3, lab_data, tmp_path, "ring")
    stdout, stderr, ended_after, run_id = stop_rank_1_mid_training(
        lab3, proc, metrics, AUTO_FLOOR_S + FLOOR_DETECTION_BOUND_S + 60, losses=1)
    print(f"auto: ended {ended_after:.1f} s after SIGSTOP (floor {AUTO_FLOOR_S:.0f} s)")
    assert proc.returncode == EXIT_STALLED, stdout[-2000:] + stderr[-3000:]
    # The last heartbeat came a step (well under a second) before the SIGSTOP.
    assert AUTO_FLOOR_S - 5 < ended_after < AUTO_FLOOR_S + FLOOR_DETECTION_BOUND_S, \
        (ended_after, stderr[-2000:])
    said = re.search(r"error: training stalled: no progress for (\d+) s \(stall timeout 60 s\): "
                     r"rank 1 on labhost2 is stopped \(state T", stderr)
    assert said and int(said.group(1)) >= 60, stderr[-3000:]
    report = metrics.parent / f"stall-{run_id}"
    summary = (report / "summary.txt").read_text()
    assert "(stall timeout 60 s, automatic: 10 x the median step, >= 60 s)" in summary, summary
    time.sleep(1)
    assert left_on_hosts(lab3, bracketed(run_id), f"/tmp/mlxcluster-stacks/{bracketed(run_id)}") == {}


def test_a_rank_that_sleeps_before_its_all_sum_is_named_where_it_is(lab3, tmp_path):
    """A tiny script under mlx.launch on the lab hosts, every rank under the
    rank wrapper: rank 1 sleeps before its all_sum. The collection (ssh,
    ps, SIGUSR1 stacks from ranks blocked inside the collective's C code)
    and the diagnosis name rank 1, its host and its function; the others
    wait at the all_sum line. The sweep then leaves nothing."""
    from mlxcluster.inventory.inventory import load_inventory
    from mlxcluster.jobs import hosts as remote
    from mlxcluster.jobs.cleanup import marked_program, new_run_id, sweep
    from mlxcluster.jobs.hosts import hosts_from_inventory
    from mlxcluster.jobs.stall import collect_states, diagnose
    from tests.lab.jobs import REPO

    script = REPO / "tests" / "lab" / "sleepy_allsum.py"
    all_sum_line = next(i for i, line in enumerate(script.read_text().splitlines(), 1)
                        if "ALL_SUM_LINE" in line)
    hosts = hosts_from_inventory(load_inventory(lab3.write_inventory(tmp_path / "lab.yaml")))
    env = lab3.env()
    run_id = new_run_id()
    program = marked_program(run_id, ["-m", "mlxcluster.jobs.rank_wrapper", str(script), "ring"])
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlx.launch"), "--hosts", ",".join(h.ip for h in lab3.hosts),
         "--backend", "ring", "--python", lab3.python, f"--env=PYTHONPATH={REPO}", "--", *program],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        waiting: set[str] = set()
        deadline = time.monotonic() + 120
        while waiting != {"0", "2"}:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, f"the job ended: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "ranks 0 and 2 never reached the all_sum"
            if line.startswith("WAITING "):
                waiting.add(line.split()[1])
        time.sleep(1.0)  # inside the all_sum now
        started = time.monotonic()
        states = collect_states(list(hosts), run_id,
                                run_script=lambda h, s: remote.run_script(h, s, env=env),
                                for_each_host=remote.for_each_host)
        took = time.monotonic() - started
        text = diagnose(states)
    finally:
        sweep(hosts, run_id, env)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
    print(f"collection took {took:.1f} s: {text}")
    assert "RESULT" not in output
    assert [(s.rank, s.host) for s in states] == [(0, "labhost1"), (1, "labhost2"), (2, "labhost3")]
    assert text.startswith("rank 1 on labhost2 is in before_all_sum at sleepy_allsum.py:10 (sleeping)"), text
    assert text.endswith(f"ranks 0 and 2 wait in <module> at sleepy_allsum.py:{all_sum_line}"), text
    assert took < 10
    time.sleep(1)
    assert left_on_hosts(lab3, bracketed(run_id), f"/tmp/mlxcluster-stacks/{bracketed(run_id)}") == {}
