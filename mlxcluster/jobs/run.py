"""One job, start to end: plan, start, watch, stop, sweep.

``run_job`` is the path of ``mlxcluster train`` and ``mlxcluster run``; smoke
starts, reads and sweeps through the same modules (``smoke/run.py``).

Every rank runs under mlxcluster.jobs.rank_wrapper (its Python stacks on
SIGUSR1) and prints heartbeat lines (MLXCLUSTER_HEARTBEAT=1); the watch hides
those and feeds them to a stall.StallWatch. A job with no progress for its
stall timeout is diagnosed (each rank's state and stacks, stall.py), stopped
on every rank and reported as stall.Stalled (exit code 4).

When ranks fail: mlx.launch (ring) terminates the other ranks over SSH once one
exits non-zero; mpirun (MPI) aborts the whole job. Either way the run ends with
nothing left running, and ``RunOutcome.exit_code`` is the failing rank's code.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mlxcluster import interrupts
from mlxcluster.errors import Interrupted, MlxclusterError
from mlxcluster.jobs import process, stall
from mlxcluster.jobs.cleanup import SSH_LOST, lost_host, new_run_id, sweep, unstopped_hint
from mlxcluster.jobs.hosts import for_each_host, run_script
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.lease import Lease, leased_job
from mlxcluster.jobs.plan import plan_job
from mlxcluster.jobs.watch import RunOutcome, watch_launcher

AUTO = "auto"  # run_job's default stall timeout: 10 x the median step, >= 60 s


def run_job(job: Job, on_line: Callable[[str, str], None],
            env: dict[str, str] | None = None,
            timeout: float | None = None,
            stall_timeout: float | str | None = AUTO,
            report_dir: Path | None = None, run_id: str | None = None,
            any_line_progress: bool = False,
            watch: stall.StallWatch | None = None) -> RunOutcome:
    """Run the job's program (``job.program``) on every rank and wait for the end.

    The launcher reaches the hosts through launcher_ssh's ssh (keepalive,
    BatchMode, the inventory's ssh_config): a host that dies mid-run ends that
    rank within ~15 s instead of leaving the job waiting forever. However the
    job ends (also timed out or interrupted), every host is then swept for
    ranks of it (mlxcluster.jobs.cleanup).

    ``stall_timeout``: seconds without a heartbeat that make a stall, AUTO
    (stall.StallWatch's default), or None (not watched). On a stall, the
    report (summary and every rank's stacks) goes to
    ``report_dir``/stall-RUN_ID (default: ./runs, where `run` keeps its logs), every rank
    is stopped, and stall.Stalled is raised. ``any_line_progress``: every
    output line counts as progress, not only heartbeats (`mlxcluster run`:
    a program of its own prints none). ``watch``: a stall watch of the
    caller's own instead (serve's probe). ``run_id``: default a new one.

    Unless ``job.detached``, every rank watches the lease this process keeps
    renewed on its host (jobs.lease): if this process is killed or cut off,
    the ranks stop on their own."""
    run_id = run_id or new_run_id()
    base_env = dict(os.environ if env is None else env)
    if not job.detached:
        job = leased_job(job, base_env)
    if watch is None and stall_timeout is not None:
        limit = None if stall_timeout == AUTO else float(stall_timeout)
        watch = stall.LineWatch(limit) if any_line_progress else stall.StallWatch(limit)

    def on_stall() -> MlxclusterError:
        return stop_stalled(job, run_id, watch, Path(report_dir or "runs"), base_env)

    try:
        with tempfile.TemporaryDirectory(prefix="mlxcluster-job.") as tmp:
            plan = plan_job(job, run_id, tmp, base_env)
            started = time.monotonic()
            with contextlib.nullcontext() if job.detached else Lease(job, run_id, base_env):
                outcome = watch_launcher(process.start_plan(plan), on_line, started,
                                         timeout=timeout, watch=watch, on_stall=on_stall)
    except (MlxclusterError, Interrupted) as err:  # timed out or interrupted: sweep, then say so
        if job.detached and isinstance(err, Interrupted):
            raise  # Ctrl-C, a closed terminal: a detached job runs on (attach, stop)
        with interrupts.deferred():
            hint = unstopped_hint(sweep(job.hosts, run_id, base_env), run_id)
        if hint:
            err.hint = f"{err.hint}; {hint}" if err.hint else hint
        raise
    except BaseException:  # anything else (a closed stdout): no rank may be left running
        with interrupts.deferred():
            sweep(job.hosts, run_id, base_env)
        raise
    lost_contact = job.detached and outcome.exit_code == SSH_LOST
    with interrupts.deferred():  # a detached job cut off from here runs on: no sweep
        swept = [] if lost_contact else sweep(job.hosts, run_id, base_env)
    lost = lost_host(outcome.exit_code, outcome.failed_rank, [h.name for h in job.hosts], outcome.lines)
    signalled = None
    if lost and any(r.ok and r.host == lost for r in swept):
        # ssh ends 255 for a remote command ended by a signal too (SIGKILL, out of memory,
        # a crash): the host answered the sweep just now, so its connection was not lost
        lost, signalled = None, lost
    return replace(outcome, run_id=run_id, lost_host=lost, signalled_host=signalled,
                   unstopped=unstopped_hint(swept, run_id),
                   started=None if watch is None else watch.started_work())


def stop_stalled(job: Job, run_id: str, watch: stall.StallWatch, report_root: Path,
                 env: dict[str, str]) -> stall.Stalled:
    """A stalled job: every rank's state and stacks, the diagnosis, the report
    saved, then every rank stopped (a SIGSTOPped one too: the sweep sends
    CONT and KILL). Returns the error to raise."""
    states = stall.collect_states(
        list(job.hosts), run_id,
        run_script=lambda h, script: run_script(h, script, env=env),
        for_each_host=for_each_host)
    summary = stall.diagnose(states)
    steps = ", ".join(f"rank {r} {s}" for r, s in sorted(watch.steps.items()))
    header = f"run {run_id}: {watch.why()}; last step seen: {steps or 'none'}"
    folder: Path | None = report_root / f"stall-{run_id}"
    try:
        stall.save_report(folder, summary, states, header)
    except OSError:
        folder = None
    sweep(job.hosts, run_id, env)  # stop every rank now; run_job sweeps once more
    where = f"every rank's state and Python stacks: {folder}" if folder else \
        "the stacks could not be saved"
    return stall.Stalled(
        f"{job.title} stalled: {watch.why(detailed=False)}: {summary}\n" + "\n".join(f"  {line}" for line in stall.rank_lines(states)),
        f"{where}; every rank was stopped. Look at the named rank's host (swapped out, "
        f"stopped, a hung collective){job.then}", report_dir=folder,
        hosts=tuple(sorted({s.host for s in states if s.is_odd_by_state})), run_id=run_id)
