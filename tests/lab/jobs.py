"""Running jobs on the lab the way users do, and looking for what is left
of them on every host afterwards."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from tests import waits

REPO = Path(__file__).resolve().parents[2]
# The env a healthy lab's inventory gives every rank, as doctor advises:
# the libmpi MLX must load (else each MPI rank runs alone) and, on Linux,
# OpenBLAS preloaded (doctor's reference-blas check).
LIBMPI = Path(sys.executable).parent.parent / "lib" / "libmpi.so.40"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
MPI_ENV = {"MLX_MPI_LIBNAME": str(LIBMPI)}
OPENBLAS_ENV = {"LD_PRELOAD": OPENBLAS}


def training_setup(lab, tmp_path: Path, hosts=None) -> tuple[Path, dict[str, str]]:
    """A lab inventory (of ``hosts``, else every host) and environment for
    `mlxcluster train`: the inventory names the libmpi MLX must load, as doctor
    advises (the launcher passes the inventory's env to every rank); PYTHONPATH
    finds reference_train."""
    inventory = lab.write_inventory(tmp_path / "inventory.yaml", hosts=hosts, env=MPI_ENV)
    env = lab.env()
    env["PYTHONPATH"] = str(REPO)
    env.pop("LD_PRELOAD", None)
    return inventory, env


def start_training(lab, lab_data: Path, tmp_path: Path, backend: str,
                   *flags: str) -> tuple[subprocess.Popen, Path]:
    """`mlxcluster train -i <lab inventory> --backend B --config tiny
    --no-preflight FLAGS` on the lab, training on and on (100000 steps), as a
    user starts it, in its own session, every host on its own disk: the data
    is on this machine's (train sends it to the hosts), the run's --out is
    on each host's and its record on this machine's. Returns (the process,
    the run's metrics.jsonl here)."""
    inventory, env = training_setup(lab, tmp_path)
    out = lab.disk / f"run-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--backend", backend,
         "--config", "tiny", "--no-preflight", *flags, "--", "--steps", "100000",
         "--global_batch", "6", "--data", str(data_here(lab, lab_data)), "--out", str(out),
         "--sample_tokens", "0"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    return proc, out / "metrics.jsonl"


def run_train(lab, tmp_path, data, backend, *extra, steps=3):
    """mlxcluster train -i <lab inventory>; returns (process, the run's unique out dir),
    the out dir on every host's own disk and this machine's (lab.disk). Waits while
    the job advances (tests.waits.run)."""
    inventory, env = training_setup(lab, tmp_path)
    out = lab.disk / f"run-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--backend",
           backend, "--config", "tiny", *extra, "--", "--steps", str(steps), "--global_batch", "6", "--data", str(data),
           "--out", str(out), "--sample_tokens", "0"]
    proc = waits.run(cmd, f"train on the lab ({backend})", paths=[out], env=env,
                     cwd=tmp_path)
    return proc, out


def data_here(lab, data: Path) -> Path:
    """``data`` on this machine's own disk in the lab (copied once), from
    where `mlxcluster train --data` sends it to every host."""
    here = lab.disk / data.name
    if not here.exists():
        shutil.copytree(data, here)
    return here


def wait_for_losses(proc: subprocess.Popen, metrics: Path, count: int = 1) -> None:
    """Until the trainer has logged ``count`` losses (it trains); fails if the job
    ends, or once it stops advancing (tests.waits.wait_for: its record, MLX's kernels,
    the CPU of its processes and the lab's), with the job's output. No fixed limit: the first
    job on a new lab did not reach its third loss within 180 s at load 45, nor within
    pytest's 300 s, while it compiled and trained."""
    def logged() -> bool:
        assert proc.poll() is None, proc.communicate()
        return metrics.exists() and metrics.read_text().count('"loss"') >= count

    try:
        waits.wait_for(logged, f"{count} losses in {metrics}",
                       waits.Progress([metrics.parent]))
    except AssertionError as missed:
        if proc.poll() is not None:
            raise
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{missed}:\n{out[-2000:]}\n{err[-2000:]}") from None


def left_on_hosts(lab, pattern: str, paths: str = "") -> dict[str, str]:
    """What each host still has of a run, asked over ssh as a user would:
    live processes matching ``pattern`` (a bracketed regex, so pgrep does not
    match its own shell) and ``paths``. An exited process its sshd session has
    not reaped yet (``<defunct>``, for a moment) runs no more and is not counted."""
    found = {}
    for h in lab.hosts:
        check = f"pgrep -af '{pattern}'; " + (f"ls -d {paths} 2>/dev/null; " if paths else "") + "true"
        out = lab.ssh(h, check).stdout
        live = [ln for ln in out.splitlines() if ln.strip() and not ln.endswith("<defunct>")]
        if live:
            found[h.name] = "\n".join(live)
    return found


def bracketed(marker: str) -> str:
    """A pgrep/pkill pattern matching ``marker`` whose own text does not."""
    return f"[{marker[0]}]{marker[1:]}"


def our_prted(lab) -> list[int]:
    """Open MPI daemons started on this lab's hosts. The lab's hosts share this
    machine's process table with other labs (other test runs may run MPI
    jobs at the same time), so a daemon is ours when the ssh session that
    started it reached one of our hosts' addresses (its SSH_CONNECTION)."""
    ips = [h.ip.encode() for h in lab.hosts]
    found = subprocess.run(["pgrep", "-x", "prted"], capture_output=True, text=True).stdout.split()
    ours = []
    for pid in map(int, found):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        conn = next((e for e in env if e.startswith(b"SSH_CONNECTION=")), b"").split()
        if len(conn) >= 3 and conn[2] in ips:
            ours.append(pid)
    return ours


def end_our_prted(lab, grace_s: float = 5.0) -> None:
    """Give this lab's Open MPI daemons ``grace_s`` to end on their own, then
    end them: for a raw mpirun a test runs and expects to fail (Open MPI's
    leftover, not mlxcluster's, which its own tests assert gone)."""
    deadline = time.monotonic() + grace_s
    while our_prted(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in our_prted(lab):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def assert_nothing_left(lab, run: dict) -> None:
    """Nothing of a smoke run (its JSON ``run``) is left here or on any host."""
    run_id = run["run_id"]
    assert run_id and run["cleanup_problems"] == []
    # The lab's hosts share this machine's process table: look here, and ask
    # every host over ssh too (the way a real cluster would be checked).
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(run_id in part for part in (p.info["cmdline"] or []))]
    assert left == []
    pattern = f"[{run_id[0]}]{run_id[1:]}"
    for host in lab.hosts:
        out = lab.ssh(host, f"pgrep -af '{pattern}'; ls -d /tmp/{pattern} "
                            f"{STACKS_ROOT}/{pattern} 2>/dev/null; true")
        assert out.stdout.strip() == "", (host.name, out.stdout)


def on_host(lab, host: int, path: Path) -> Path:
    """Where `path` (under lab.disk) of host `host` lies, seen from this machine."""
    return lab.host_disk(lab.hosts[host]) / path.relative_to(lab.disk)


def records(metrics) -> list[dict]:
    """The records of a run's metrics.jsonl (none when it is not there yet)."""
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def rank_process(lab, host, out) -> tuple[int, str]:
    """(pid, run id) of this run's rank on ``host``, found as a user would:
    over ssh on that host, by the wrapper's pid file of the run id read from
    the rank's command line."""
    cmdline = lab.ssh(host, f"pgrep -af '[r]ank_wrapper.*--out {out}' || true").stdout
    found = re.search(r"mlxcluster_run=(mlxtrain-[0-9a-f]+)", cmdline)
    assert found, cmdline
    run_id = found.group(1)
    rank = lab.hosts.index(host)
    pid_file = lab.ssh(host, f"cat /tmp/mlxcluster-stacks/{run_id}/rank{rank}.pid").stdout.split()
    assert pid_file[1] == host.name, pid_file  # the rank runs on that host
    return int(pid_file[0]), run_id


def run_job(cmd: list[str], lab) -> list[tuple[int, int, int, str]]:
    """Run a launcher command line of allsum.py on the lab: its RESULT rows
    (rank, size, all_sum, host), sorted."""
    proc = waits.run(cmd, f"{Path(cmd[0]).name} on the lab", env=lab.env())
    rows = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert rows, f"no result (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return sorted((int(r), int(s), int(v), host) for r, s, v, host in rows)


# Programs `mlxcluster run` sends to the hosts: an all_sum that prints
# where it ran, and one whose rank 1 exits 3 once every rank is ready.
ALLSUM = """
import socket, sys
import mlx.core as mx
g = mx.distributed.init(strict=True, backend="any")
total = mx.distributed.all_sum(mx.array([1.0])).item()
print(f"rank {g.rank()} of {g.size()} on {socket.gethostname()}: all_sum {total:.0f} {sys.argv[1:]}")
"""

FAILS = """
import sys, time
import mlx.core as mx
g = mx.distributed.init(strict=True, backend="any")
mx.eval(mx.distributed.all_sum(mx.array([1.0])))
print(f"rank {g.rank()} ready", flush=True)
# Every rank has printed before rank 1 leaves (mpirun drops output still in flight when
# it aborts the job: rank 0's "ready" line was lost once).
mx.eval(mx.distributed.all_sum(mx.array([1.0])))
if g.rank() == 1:
    time.sleep(1)
    sys.exit(3)
time.sleep(300)
"""


def mlx_launch_trainer(lab, tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """The trainer on the lab's 3 hosts under a plain `mlx.launch --hostfile`
    (ring, no mlxcluster), as users who launch it themselves run it."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": h.ip, "ips": [h.ip]} for h in lab.hosts]}))
    cmd = [str(Path(sys.executable).parent / "mlx.launch"), "--hostfile", str(hostfile),
           "--backend", "ring", "--python", lab.python, "--env", f"PYTHONPATH={REPO}",
           "--env", "OPENBLAS_NUM_THREADS=1", "--", "-m", "reference_train.train", *args]
    return waits.run(cmd, "the trainer under mlx.launch on the lab", env=lab.env(),
                     cwd=tmp_path)


def lose_link_at_step(lab, job: subprocess.Popen, metrics: Path, step: int,
                      victim) -> tuple[str, str]:
    """Cut ``victim``'s link once the run's record (``metrics``, here) holds the
    loss of ``step``, then wait for the job to end: its (stdout, stderr). Both
    waits last while the job advances (tests.waits). The job is killed if it has
    not ended, and the host healed, whatever happened."""
    def reached() -> bool:
        assert job.poll() is None, job.communicate()
        return max((r["step"] for r in records(metrics) if "loss" in r), default=0) >= step

    try:
        waits.wait_for(reached, f"step {step}'s loss in {metrics}",
                       waits.Progress([metrics]), interval=0.1)
        lab.link_down(victim)
        return waits.communicate(job, f"the job after {victim}'s link went down",
                                 paths=[metrics])
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        lab.heal(victim)
