"""The controller's lease: a rank whose lease is not renewed is stopped on
its host (SIGUSR2, then SIGKILL after the grace), one whose lease is renewed
runs on, and the watchdog never outlives its rank. Real processes under the
real rank wrapper; the lease file touched as the controller's Lease does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.lease import DEFAULT_LEASE_S, Lease, lease_path, lease_seconds, leased_job
from mlxcluster.jobs.rank_wrapper import LEASE_GRACE_VAR, LEASE_VAR, lease_expired, lease_settings
from tests.waits import POLL_S, poll_until

REPO = Path(__file__).resolve().parents[1]

# A program that says when it is asked to stop (SIGUSR2), as the trainer
# does, or that shrugs it off (IGNORE=1), as a stuck rank would.
PROGRAM = """
import os, signal, sys, time
def asked(signum, frame):
    print("asked to stop", flush=True)
    sys.exit(7)
signal.signal(signal.SIGUSR2, signal.SIG_IGN if os.environ.get("IGNORE") else asked)
print("ready", flush=True)
time.sleep(120)
"""
LEASE_S = 1.5
# From the last touch: the lease, up to one poll of the watchdog (<= 1 s),
# and a loaded 2-core machine's scheduling.
STOP_BOUND_S = LEASE_S + 6


def start_rank(tmp_path: Path, **extra: str) -> tuple[subprocess.Popen, Path, float]:
    """The rank, its lease file, and when it was started (its watch starts after)."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    stacks = tmp_path / "stacks"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLX_RANK": "1",
           "MLXCLUSTER_STACKS_DIR": str(stacks), LEASE_VAR: str(LEASE_S), **extra}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-X", "mlxcluster_run=mlxtrain-leasetest", "-m",
                             "mlxcluster.jobs.rank_wrapper", str(script)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, stacks / "lease", started


def watchdogs_of(proc: subprocess.Popen) -> list[psutil.Process]:
    """The rank's forks whose stdout is /dev/null: the watchdog's (the line helper,
    the other fork, writes to the rank's stdout)."""
    return [c for c in psutil.Process(proc.pid).children()
            if "rank_wrapper" in " ".join(c.cmdline()) and os.readlink(f"/proc/{c.pid}/fd/1") == os.devnull]


def test_a_rank_whose_lease_is_not_renewed_is_asked_to_stop_and_its_folder_removed(tmp_path):
    proc, lease, started = start_rank(tmp_path)
    try:
        out, err = proc.communicate(timeout=STOP_BOUND_S)
    finally:
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 7 and "asked to stop" in out  # the program's own handler ran
    assert LEASE_S <= took < STOP_BOUND_S
    assert f"no word from the machine running mlxcluster for {LEASE_S:.0f} s" in err
    assert str(lease) in err
    poll_until(lambda: not lease.parent.exists(), 5, "the run's stacks folder removed")


def test_a_renewed_lease_keeps_the_rank_and_a_lapse_stops_it(tmp_path):
    proc, lease, _ = start_rank(tmp_path)
    try:
        renew_until = time.monotonic() + 3 * LEASE_S
        while time.monotonic() < renew_until:  # as Lease does, every limit / 6
            lease.parent.mkdir(parents=True, exist_ok=True)
            lease.touch()
            last_touch = time.monotonic()
            assert proc.poll() is None, proc.communicate()
            time.sleep(LEASE_S / 6)
        out, _ = proc.communicate(timeout=STOP_BOUND_S)
        assert proc.returncode == 7 and "asked to stop" in out
        assert time.monotonic() - last_touch >= LEASE_S
    finally:
        proc.kill()


def test_a_rank_that_ignores_the_stop_is_killed_after_the_grace(tmp_path):
    proc, _, _ = start_rank(tmp_path, IGNORE="1", **{LEASE_GRACE_VAR: "1"})
    try:
        proc.communicate(timeout=STOP_BOUND_S + 1)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL


def test_the_watchdog_ends_with_its_rank(tmp_path):
    proc, lease, _ = start_rank(tmp_path)
    dogs = watchdogs_of(proc)
    assert len(dogs) == 1
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(dogs, timeout=5)
    assert alive == [] and len(gone) == 1


def test_without_a_lease_no_watchdog_is_started(tmp_path):
    proc, _, _ = start_rank(tmp_path, **{LEASE_VAR: ""})
    try:
        assert watchdogs_of(proc) == []
        time.sleep(LEASE_S + 1.5)  # proves an absence: past the lease it runs on
        assert proc.poll() is None
    finally:
        proc.kill()


def test_lease_expiry_counts_from_the_last_renewal_or_the_start():
    assert not lease_expired(None, started=100.0, now=101.0, limit=2)
    assert lease_expired(None, started=100.0, now=102.5, limit=2)
    assert not lease_expired(110.0, started=100.0, now=111.0, limit=2)
    assert lease_expired(110.0, started=100.0, now=112.5, limit=2)
    assert not lease_expired(50.0, started=100.0, now=101.0, limit=2)  # an old file: from the start


def test_lease_settings_and_the_controllers_limit():
    assert lease_settings({}) is None and lease_settings({LEASE_VAR: "x"}) is None
    assert lease_settings({LEASE_VAR: "30"}) == (30.0, 60.0)
    assert lease_settings({LEASE_VAR: "30", LEASE_GRACE_VAR: "5"}) == (30.0, 5.0)
    assert lease_seconds({}) == DEFAULT_LEASE_S
    assert lease_seconds({LEASE_VAR: "12"}) == 12.0
    for bad in ("0.5", "soon"):
        with pytest.raises(InputError, match=LEASE_VAR):
            lease_seconds({LEASE_VAR: bad})


def test_the_controllers_lease_touches_the_file_every_rank_watches(tmp_path):
    job = Job(hosts=local_hosts(2), backend="ring", python=sys.executable,
              env={"MLXCLUSTER_STACKS_DIR": str(tmp_path / "stacks")})
    job = leased_job(job, {LEASE_VAR: "3", LEASE_GRACE_VAR: "9"})
    assert job.env[LEASE_VAR] == "3" and job.env[LEASE_GRACE_VAR] == "9"
    path = Path(lease_path(job, "mlxtrain-x"))
    assert path == tmp_path / "stacks" / "lease"
    with Lease(job, "mlxtrain-x") as lease:
        assert lease.every == 0.5
        poll_until(path.exists, 5, "the lease file")
        first = path.stat().st_mtime
        poll_until(lambda: path.stat().st_mtime > first, 5, "a renewal")
    renewed = path.stat().st_mtime
    time.sleep(1.0 + POLL_S)  # proves an absence: two renewal periods with none
    assert path.stat().st_mtime == renewed
