"""Every wait the tests choose, in one place: the timeouts they give the
commands they run (stall timeouts, per-iteration deadlines, connect
timeouts), the bounds they allow for a fault to be found, and how they poll.

Each value is the smallest that still proves its behaviour on the 2-core
machine CI runs on, with a whole parallel test run beside it (`make test`
runs 4 workers): a timeout shorter than a loaded host's slowest healthy
step or connect makes a healthy run look hung. Why each is what it is, and
what was measured, is said beside it. A bound (``..._BOUND_S``,
``..._BUDGET_S``) costs nothing when the behaviour holds: it is how long a
test waits before it calls the behaviour broken.

A test that waits for an event polls for it (``poll_until``), every
``POLL_S``; a fixed sleep longer than a second says why in a comment.

A test that waits for a job (a training, a launch, a serve) waits while the
job advances, not for a fixed time (issue 50: every failure of a busy run was
a fixed wait running out while the job went on): ``wait_for``, ``communicate``
and ``run`` below fail once nothing advanced for ``QUIET_S``, or at their
ceiling, saying what was seen last.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

# How often a test looks again for what it waits for.
POLL_S = 0.2

# ---- stalls: `train` / `run` --stall-timeout and the watch's detection --------------
# `train --stall-timeout` in the lab's stall tests: a step of the tiny config
# takes well under a second, but 3 ranks sharing 2 cores with a parallel run
# beside them have gone 10+ s between heartbeats; 20 s never fired falsely.
LAB_STALL_TIMEOUT_S = 20
# After the stall timeout: up to 1 s until the watch looks, ~1 s of SIGUSR1 and
# state collection over ssh, the sweep (0.5 s + ssh), the launcher's stop and a
# final sweep. Measured on the lab: 5.5-10.6 s over 7 runs (docs/training-cluster.md).
STALL_DETECTION_BOUND_S = 25
# The same after the automatic limit's 60 s floor, which the test measures as
# the product has it (no knob lowers it): 5.7 s over the floor with a full test
# run beside it; earlier 12.0 and 25.9 s with the load average at 40-45.
FLOOR_DETECTION_BOUND_S = 20
# `train --elastic --stall-timeout`: a lost host's ranks are found by ssh's
# keepalive (~15 s) before this fires; it bounds a rank that hangs instead.
ELASTIC_STALL_TIMEOUT_S = 30
# Local runs (`--local N`, one machine): the silent program and the stalled
# rank of the restart test are found after this much silence.
LOCAL_STALL_TIMEOUT_S = 8

# ---- smoke: per-iteration deadlines ---------------------------------------------------
# `smoke --soak --phase-timeout` on the lab: a loaded 2-core machine starts 3 ranks
# slowly, and init has this deadline too.
SOAK_ITERATION_TIMEOUT_S = 20
# After the per-iteration deadline: up to ~1 s until the last soak event
# (they come once a second), the port probes or the state collection over
# ssh (SIGUSR1, 1 s, stacks), the launcher's stop and the sweep of every
# host. Measured on the lab under load (docs/smoke.md): 9.9-15.1 s.
SOAK_DETECTION_BOUND_S = 25

# ---- faults: how long a job may take to end once one is injected ----------------------
# A rank that exits non-zero: the failure seen, every rank stopped, the
# sweep. Measured: 13 s ring, 9 s mpi.
FAILED_RANK_BUDGET_S = 60
# A host whose link goes down mid-training: ~15 s of ssh keepalive, the
# launcher's stop, and the sweep's 5 s connect timeout to the dead host; well
# under the 90 s the job used to wait before it was stopped by hand.
DEAD_HOST_BUDGET_S = 60
# smoke --backend jaccl on hosts without RDMA: the topology probe of three
# hosts (doctor's), then the verdict.
JACCL_UNAVAILABLE_BUDGET_S = 60

# ---- the controller goes away: the lease (mlxcluster.jobs.lease) ---------------------
# MLXCLUSTER_LEASE_S in the tests that kill or cut off the controller: short,
# so that the test waits little, and 6 renewals per lease, each one ssh call
# on the job's shared connection (0.03-0.06 s on the lab at load 8,
# docs/performance-history.md) or a local touch: a loaded machine does not miss six.
LEASE_TEST_S = 6
# From the controller's end until no process of the job is left: the lease,
# the watchdog's poll (<= 1 s), the step the ranks agree to stop at (the
# tiny config logs every step) and its checkpoint, and the launcher's end.
CONTROLLER_GONE_BOUND_S = LEASE_TEST_S + 30
# A training job's first losses have no fixed limit: MLX compiles its kernels on
# each host first, and the first job on a new lab did not reach its third loss
# within 180 s at load 45 (issue 50). Tests wait for them with ``wait_for`` below.

# ---- doctor on the lab ----------------------------------------------------------------
# paramiko's connect, banner, auth and channel waits each: 2 s once timed out
# on a live host while the 2-core CI machine was busy (2026-11-24); a dead host
# still costs one of these, not one per test that tries it.
DOCTOR_CONNECT_TIMEOUT_S = 4.0
# Anything near this bound is a hang (a dead host costs one connect timeout).
DOCTOR_BUDGET_S = 20.0
# --backend mpi on 12 hosts judges every pair: 132 ssh logins, which on a Mac
# cluster run on 12 machines but here share this machine's 2 cores: doctor
# took 18.1-18.8 s against 5.7-6.5 s with the first host's 11 hops only
# (3 runs each, alternating, load average 47; bench/doctor_hops_cost.py). In a
# cold CI run (load 17) logins took over the 19 s BatchMode limit that a 4 s
# connect timeout gives (connect + 15 s): that test gives 15 s (a 30 s limit).
TWELVE_CONNECT_TIMEOUT_S = 15.0

# ---- shared storage -------------------------------------------------------------------
# One launch of tests/lab/test_shared_storage_lab.py: 150 steps of the tiny
# config on 3 lab hosts with a checkpoint every step (or the one-process
# reference's 300). Measured: see docs/testing.md's table; this bounds a hang.
SHARED_STORAGE_TRAIN_TIMEOUT_S = 300

# ---- the shared labs ------------------------------------------------------------------
# How long a shared lab may take to settle after a test (an ssh session
# closing, a rank's process reaped) before what is left counts as left.
LAB_SETTLE_S = 10.0

# serve: how often its probe asks and how long an answer may take. The tiny
# model answers a one-token completion in ~0.05 s alone; at a load of 20-40
# (CI's 4 workers on 2 cores) a few seconds: 10 s is a hang, not a slow answer.
SERVE_PROBE_EVERY_S = 2
SERVE_PROBE_TIMEOUT_S = 10
# From `mlxcluster serve` started to its "serving" line: the preflight, the
# model sent, both ranks loading mlx-lm (measured alone: 15-25 s on the lab).
SERVE_UP_S = 240
# From a fault (a rank stopped or killed) to "serving ... again": the probe's
# timeout, the stacks collected, every rank stopped, the launch and load again.
SERVE_AGAIN_S = 180
# Ctrl-C to serve's exit: mlx-lm's rank 0 does not stop on SIGINT (it calls
# httpd.shutdown() from the thread serving): the launcher's 20 s grace, then the sweep.
SERVE_STOP_S = 90


def poll_until(condition: Callable[[], object], timeout: float, what: str,
               interval: float = POLL_S) -> object:
    """``condition()``'s first true value, asked every ``interval`` s; fails
    the test naming ``what`` once ``timeout`` s passed without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


# ---- waits tied to progress -----------------------------------------------------------
# What counts as a job advancing (``Progress``): its output grows, a file or folder it
# writes changes, MLX builds a kernel (a cold host compiles for a minute or two before
# its first step and prints nothing meanwhile), or the processes this test process
# started used PROGRESS_CPU_S of CPU since the last sign: the job and its local ranks,
# and the lab's hosts, whose sshd stays this process's child (tests/lab) with every
# session and rank it starts under it. A controller that only polls uses ~1% of a
# core, so a job whose ranks are all stuck shows no sign for QUIET_S; a job that
# works, on a machine at load 45, shows one every few seconds.
QUIET_S = 120.0
PROGRESS_CPU_S = 2.0
# A wait's ceiling: far above what the job takes, even at load (the longest job the
# lab tests run took 332 s at load, issue 50), below pytest's per-test ceiling
# (pyproject.toml's `timeout`), so that the wait, not pytest, says what it saw.
CEILING_S = 900.0
# Where MLX keeps its compiled CPU kernels, for this machine and every lab host
# (tests/lab: Lab.shares_kernels).
KERNELS = Path(tempfile.gettempdir()) / "mlx"


def _folder_state(path: Path) -> tuple[int, int, float]:
    """(files, bytes, newest mtime) of ``path``, a file or a folder (its files, bounded)."""
    try:
        if path.is_file():
            st = path.stat()
            return 1, st.st_size, st.st_mtime
        files = size = 0
        newest = 0.0
        for n, entry in enumerate(path.rglob("*")):
            if n > 5000:
                break
            with_stat = entry.stat() if entry.is_file() else None
            if with_stat:
                files, size = files + 1, size + with_stat.st_size
                newest = max(newest, with_stat.st_mtime)
        return files, size, newest
    except OSError:  # appearing or going meanwhile
        return 0, 0, 0.0


def _descendants_cpu_s() -> float:
    """CPU seconds used so far by every living process this one started (not itself:
    its own polling is no sign of the job)."""
    total = 0.0
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


class Progress:
    """Signs that a job advances: ``advanced()`` names the newest since the last call."""

    def __init__(self, paths: Sequence[Path] = (), output: Callable[[], int] | None = None):
        self.paths = [Path(p) for p in paths]
        self.output = output
        self.last = "nothing yet"
        self._seen = self._signs()
        self._cpu_mark = _descendants_cpu_s()

    def _signs(self) -> dict[str, object]:
        signs: dict[str, object] = {str(p): _folder_state(p) for p in self.paths}
        signs["MLX kernels built"] = len(list(KERNELS.glob("*/cpu/*")))
        if self.output is not None:
            signs["output"] = self.output()
        return signs

    def advanced(self) -> str | None:
        now = self._signs()
        changed = [name for name, value in now.items() if value != self._seen.get(name)]
        self._seen = now
        cpu = _descendants_cpu_s()
        # A process that ended takes its CPU seconds with it: start again from here.
        if cpu - self._cpu_mark >= PROGRESS_CPU_S:
            changed.append(f"{cpu - self._cpu_mark:.1f} CPU-s used")
            self._cpu_mark = cpu
        elif cpu < self._cpu_mark:
            self._cpu_mark = cpu
        if changed:
            self.last = ", ".join(changed)
            return self.last
        return None


def wait_for(condition: Callable[[], object], what: str, progress: Progress, *,
             quiet_s: float = QUIET_S, ceiling_s: float = CEILING_S,
             interval: float = POLL_S) -> object:
    """``condition()``'s first true value, asked every ``interval`` s for as long as
    ``progress`` shows signs at least every ``quiet_s`` (and at most ``ceiling_s``);
    fails the test naming ``what`` and the last sign seen."""
    start = last_sign = time.monotonic()
    last_check = 0.0
    while True:
        value = condition()
        if value:
            return value
        now = time.monotonic()
        if now - last_check >= 1.0:  # the signs cost a walk of folders and processes
            last_check = now
            if progress.advanced():
                last_sign = now
        if now - last_sign > quiet_s:
            raise AssertionError(f"{what}: nothing advanced for {quiet_s:.0f} s "
                                 f"(last seen: {progress.last}, {now - start:.0f} s in)")
        if now - start > ceiling_s:
            raise AssertionError(f"{what}: not within {ceiling_s:.0f} s although it went on "
                                 f"(last seen: {progress.last})")
        time.sleep(interval)


class _Drain:
    """Reads a pipe to its end in a thread, counting what came (its growth is a sign)."""

    def __init__(self, pipe) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.fd = pipe.fileno() if pipe is not None else None
        self.thread = threading.Thread(target=self._read, daemon=True)
        if self.fd is not None:
            self.thread.start()

    def _read(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.chunks.append(chunk)
            self.size += len(chunk)

    def data(self) -> bytes | None:
        if self.fd is None:
            return None
        self.thread.join(timeout=10)
        return b"".join(self.chunks)


def _kill(proc: subprocess.Popen) -> None:
    """The process and, when it leads its own session, everything it started."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def communicate(proc: subprocess.Popen, what: str, *, paths: Sequence[Path] = (),
                quiet_s: float = QUIET_S, ceiling_s: float = CEILING_S):
    """``proc.communicate()`` for a job that may take long on a busy machine: waits while
    it advances (its output, ``paths``, MLX kernels, the CPU of what this process started);
    else kills it (its session too, when it leads one) and fails naming ``what``, the
    last sign and the output's tails."""
    text = any(isinstance(pipe, io.TextIOWrapper) for pipe in (proc.stdout, proc.stderr))
    drains = [_Drain(proc.stdout), _Drain(proc.stderr)]
    progress = Progress(paths, output=lambda: sum(d.size for d in drains))
    try:
        wait_for(lambda: proc.poll() is not None, what, progress,
                 quiet_s=quiet_s, ceiling_s=ceiling_s)
    except AssertionError as missed:
        _kill(proc)
        proc.wait()
        out, err = (_decoded(d.data(), text) for d in drains)
        raise AssertionError(f"{missed}\n--- stdout (end) ---\n{(out or '')[-3000:]}"
                             f"\n--- stderr (end) ---\n{(err or '')[-3000:]}") from None
    out, err = (_decoded(d.data(), text) for d in drains)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return out, err


def _decoded(data: bytes | None, text: bool):
    if data is None or not text:
        return data
    return data.decode("utf-8", errors="replace")


def run(cmd: Sequence[str], what: str | None = None, *, paths: Sequence[Path] = (),
        quiet_s: float = QUIET_S, ceiling_s: float = CEILING_S, check: bool = False,
        **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` whose limit is the
    job's progress (``communicate``), in a session of its own so that a miss ends
    everything it started."""
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen_kwargs)
    out, err = communicate(proc, what or " ".join(map(str, cmd[:6])), paths=paths,
                           quiet_s=quiet_s, ceiling_s=ceiling_s)
    done = subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
