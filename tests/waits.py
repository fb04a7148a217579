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
"""

from __future__ import annotations

import time
from collections.abc import Callable

# How often a test looks again for what it waits for.
POLL_S = 0.2

# ---- stalls: `train` / `run` --stall-timeout and the watch's detection --------------
# `train --stall-timeout` in the lab's stall tests: a step of the tiny config
# takes well under a second, but 3 ranks sharing 2 cores with a parallel run
# beside them have gone 10+ s between heartbeats; 20 s never fired falsely.
LAB_STALL_TIMEOUT_S = 20
# After the stall timeout: up to 1 s until the watch looks, ~1 s of SIGUSR1 and
# state collection over ssh, the sweep (0.5 s + ssh), the launcher's stop and a
# final sweep. Measured on the lab: 5.5-10.6 s over 7 runs (docs/training.md).
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
# `smoke --soak --timeout` on the lab: a loaded 2-core machine starts 3 ranks
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
# docs/performance.md) or a local touch: a loaded machine does not miss six.
LEASE_TEST_S = 6
# From the controller's end until no process of the job is left: the lease,
# the watchdog's poll (<= 1 s), the step the ranks agree to stop at (the
# tiny config logs every step) and its checkpoint, and the launcher's end.
CONTROLLER_GONE_BOUND_S = LEASE_TEST_S + 30
# A training job's first losses: MLX compiles its kernels on each host first
# (seen: the first job on a new lab did not reach its third loss within 180
# s with the load average at 45).
TRAINING_START_S = 180

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
# (3 runs each, alternating, load average 47; bench/doctor_hops_cost.py).
TWELVE_MPI_BUDGET_S = 45.0

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
