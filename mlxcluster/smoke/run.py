"""Drive one smoke run: launch the workers, watch every rank, stop on the
first failure or hang, and return a typed report.

The launcher's exit code is not trusted (``mlx.launch`` exits 0 when a rank
fails): a run passes only when every rank reported ``done`` with every check
passing.  Each rank has a per-phase deadline (init, correctness, bench): a
rank that stays longer than ``timeout_s`` in one phase is a hang.  On any
failure every process of the run is stopped on every host (the launcher's
process group here, ``pkill -f <run id>`` over ssh on the others).

A hang is diagnosed as a stalled training is (``stall``): every rank's
process state, CPU time and Python stacks, one line naming the rank that is
not where the others are, and the whole of it saved in ``STALL_DIR/stall-RUN_ID``
(the smoke command's --stall-dir, default ``runs``, where run keeps its logs).
A soak (``WorkerOptions.soak_s``) keeps one phase for its whole duration;
each iteration it reports restarts the deadline (``watch.Watch``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster import interrupts
from mlxcluster.doctor.known_errors import Diagnosis, diagnose
from mlxcluster.errors import EXIT_FAILED, EXIT_OK, EXIT_STALLED, EXIT_UNAVAILABLE, Interrupted
from mlxcluster.jobs import process, stall
from mlxcluster.jobs.cleanup import kill_local_group, leftover_advice
from mlxcluster.jobs.hosts import HostResult, RankHost, for_each_host, run_script
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.smoke import preflight, remote
from mlxcluster.smoke.launch import WorkerOptions, plan_launch, worker_source
from mlxcluster.smoke.soak import SoakSummary
from mlxcluster.smoke.stats import BenchRow, OpFit, fit_ops
from mlxcluster.smoke.watch import RankOutcome, Watch, bench_rows, blame_hang, outcomes

FAILURE_GRACE_S = 0.5  # keep reading this long after the first failure
EXIT_WAIT_S = 10.0  # for the launcher to exit once every rank is done
PROGRESS_EVERY_S = 10.0  # a soak's progress line, this often


@dataclass
class SmokeReport:
    """The result of one backend's smoke run."""

    backend: str
    status: str  # passed | failed | unavailable
    reason: str = ""
    ranks: list[RankOutcome] = field(default_factory=list)
    checks: int = 0
    bench: list[BenchRow] = field(default_factory=list)
    fits: list[OpFit] = field(default_factory=list)
    duration_s: float = 0.0
    run_id: str = ""
    command: list[str] = field(default_factory=list)
    cleanup_problems: list[str] = field(default_factory=list)
    launcher_stderr: str = ""
    host_reasons: dict[str, str] = field(default_factory=dict)  # unavailable: host -> why
    hint: str = ""  # unavailable: what to do about it
    stall: str = ""  # a hang's diagnosis (stall.diagnose): the rank and host that stand out
    stall_dir: str = ""  # where every rank's state and Python stacks were saved
    soak: SoakSummary | None = None  # smoke --soak: iterations, slowest, wrong results

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def stalled(self) -> bool:
        """A hang found by the deadline was the cause: a rank made no progress
        within its phase's deadline (a soak: one iteration's), and no rank
        failed, exited or gave a wrong result before that (those are failures)."""
        return self.status == "failed" and any(r.status == "hung" and r.cause for r in self.ranks)

    @property
    def failed_ranks(self) -> list[RankOutcome]:
        """Ranks that did not pass, the ones that caused the failure first."""
        order = {"failed": 0, "exited": 1, "hung": 2, "stopped": 3}
        return sorted((r for r in self.ranks if r.status != "passed"),
                      key=lambda r: (not r.cause, order.get(r.status, 4), r.rank))

    def known_errors(self) -> list[Diagnosis]:
        """The messages of the failed ranks (and the launcher's) whose cause
        is known (docs/errors.md), each once, for the failure to say."""
        output = [o.detail for o in self.failed_ranks] + [
            line for o in self.failed_ranks for line in o.stderr_tail.splitlines()]
        return diagnose(output + self.launcher_stderr.splitlines())


def run_plan(plan: LaunchPlan, timeout_s: float = 60.0,
             clock: Callable[[], float] = time.monotonic, source: str | None = None,
             opts: WorkerOptions | None = None, stall_root: Path | None = None,
             on_soak_progress: Callable[[SoakSummary], None] | None = None) -> SmokeReport:
    """Stage, launch and watch one run; always leaves nothing of it running.

    ``source`` replaces the worker script (bench/ stages a bare timing loop
    that speaks the same protocol). ``opts``: the workers' options (a soak's
    seed and duration for its summary). A hang's report goes to
    ``stall_root``/stall-RUN_ID (None: diagnosed, not saved; the smoke
    command passes --stall-dir, other callers such as tune leave no folders).
    ``on_soak_progress`` hears the soak's summary so far every
    ``PROGRESS_EVERY_S``. Interrupted (Ctrl-C, SIGTERM, SIGHUP), it stops the
    run on every host first, then raises ``errors.Interrupted`` (its
    ``partial``: a soak's summary so far)."""
    started = clock()
    report = SmokeReport(plan.backend, "failed", run_id=plan.run_id, command=list(plan.argv))
    watch = Watch(plan, clock)
    soaking = opts is not None and opts.soak_s > 0

    def soak_summary() -> SoakSummary | None:
        if not soaking:
            return None
        failures = [f for s in watch.ranks for f in s.failures]
        return watch.soak.summary(opts.seed, opts.soak_s, failures)

    progress = (lambda: on_soak_progress(soak_summary())) if soaking and on_soak_progress else None
    launched: process.Running | None = None
    blamed: list[RankOutcome] = []
    stopped_by: KeyboardInterrupt | None = None
    try:
        staged = remote.stage(plan, source or worker_source(), env=plan.env)
        bad_stage = [r for r in staged if not r.ok]
        if bad_stage:
            report.reason = "could not copy the worker to " + ", ".join(
                f"{r.host} ({r.error})" for r in bad_stage)
        else:
            launched = process.start_plan(plan)
            blamed = watch_run(launched, watch, plan, timeout_s, clock, progress)
            if blamed:  # while the hung ranks still run: where are they?
                report.stall, report.stall_dir = diagnose_hang(plan, blamed, timeout_s, stall_root)
    except KeyboardInterrupt as stop:
        stopped_by = stop
    with interrupts.deferred():
        tails, cleaned = stop_run(plan, launched, watch)
    if stopped_by is not None:
        error = interrupted(plan, stopped_by, cleaned)
        error.partial = soak_summary()
        raise error
    report.duration_s = clock() - started
    report.soak = soak_summary()
    if launched is None:  # the worker never reached every host: nothing ran
        return report
    report.cleanup_problems = [f"{r.host}: {r.error}; when it answers again: "
                               + leftover_advice(plan.run_id).replace("HOST", r.host)
                               for r in cleaned if not r.ok]
    report.launcher_stderr = "\n".join(watch.stderr_lines[-20:])
    report.ranks = outcomes(watch, blamed, tails)
    report.checks = sum(s.checks for s in watch.ranks)
    if all(r.status == "passed" for r in report.ranks):
        report.status = "passed"
        report.bench = bench_rows(watch)
        report.fits = fit_ops(report.bench)
    else:
        first = report.failed_ranks[0]  # the cause comes first
        report.reason = f"rank {first.rank} on {first.host}: {first.detail}"
    return report


def diagnose_hang(plan: LaunchPlan, blamed: list[RankOutcome], timeout_s: float,
                  stall_root: Path | None) -> tuple[str, str]:
    """The diagnosis of a hang and the folder of its evidence, as for a
    stalled training (stall.examine): every rank runs under the rank wrapper,
    which leaves its pid file and dumps its stacks on SIGUSR1 where
    stall reads them. Each hung rank's verdict
    gets its process state and place ('its process is stopped (state T,
    ...)', 'sleeping (...), in run_rank at worker.py:425')."""
    header = (f"smoke {plan.backend} run {plan.run_id}: no progress for {timeout_s:g} s "
              f"(--phase-timeout); blamed: " + ", ".join(f"rank {o.rank} on {o.host}" for o in blamed))
    found = stall.examine(
        list(plan.hosts), plan.run_id,
        run_script=lambda h, script: run_script(h, script, env=plan.env),
        for_each_host=for_each_host,
        report_dir=stall_root / f"stall-{plan.run_id}" if stall_root else None, header=header)
    states = {s.rank: s for s in found.states}
    for outcome in blamed:
        state = states.get(outcome.rank)
        if state is None or state.pid is None:
            continue
        where = state.where
        outcome.detail += f"; its process is {state.describe()[3:]}" + \
            (f", in {where.short}" if where else "")
    return found.summary, str(found.directory or "")


def watch_run(launched: process.Running, watch: Watch, plan: LaunchPlan, timeout_s: float,
              clock: Callable[[], float], progress: Callable[[], None] | None = None
              ) -> list[RankOutcome]:
    """Feed the launcher's lines to ``watch`` until every rank is done, one
    failed, the launcher is gone or a rank hangs; the ranks blamed for a hang.
    ``progress`` is called every PROGRESS_EVERY_S."""
    proc = launched.proc
    stop_at: float | None = None
    done_at: float | None = None
    next_progress = clock() + PROGRESS_EVERY_S
    while True:
        if progress is not None and clock() >= next_progress:
            progress()
            next_progress = clock() + PROGRESS_EVERY_S
        got = launched.next_line(0.1)
        if got is not None:
            (watch.on_stdout if got[0] == "stdout" else watch.on_stderr)(got[1])
        elif launched.drained():
            time.sleep(0.1)  # the streams ended; the launcher may not have yet
        if stop_at is None and watch.first_failure():
            # The launcher's stderr can tell of a rank's exit before its
            # stdout lines arrive: keep reading briefly before stopping.
            stop_at = clock() + FAILURE_GRACE_S
        if stop_at is not None and (clock() >= stop_at or launched.drained()):
            return []
        if watch.all_done():
            done_at = done_at or clock()
            if launched.drained() or proc.poll() is not None or clock() - done_at > EXIT_WAIT_S:
                return []
        if launched.drained() and proc.poll() is not None:
            return []  # the launcher is gone; ranks without 'done' failed
        if watch.overdue(timeout_s):
            return blame_hang(watch, plan, timeout_s)


def stop_run(plan: LaunchPlan, launched: process.Running | None, watch: Watch
             ) -> tuple[dict[int, str], list[HostResult]]:
    """Stop the launcher's process group, read its last lines into ``watch``,
    then stop what is left of the run on every host and remove its files."""
    if launched is not None:
        kill_local_group(launched.proc.pid)
        launched.proc.wait(timeout=10)
        launched.join(timeout=2)
        for name, line in launched.rest():  # late lines: exit codes, last verdicts
            (watch.on_stdout if name == "stdout" else watch.on_stderr)(line)
    return remote.finish(plan, kill=True, env=plan.env)


def interrupted(plan: LaunchPlan, stop: BaseException,
                cleaned: list[HostResult]) -> Interrupted:
    """The error for a run stopped by a signal, naming any host that may
    still hold processes of the run."""
    signum = interrupts.signum_of(stop)
    left = [r for r in cleaned if not r.ok]
    message = (f"interrupted ({interrupts.signal_name(signum)}): smoke {plan.backend} run "
               f"{plan.run_id} stopped")
    if not left:
        return Interrupted(signum, message + " on every host")
    return Interrupted(
        signum, message + "; cleanup failed on " + ", ".join(f"{r.host} ({r.error})" for r in left),
        f"processes of the run may be left there: ssh HOST pkill -f {plan.run_id}")


def run_backend(backend: str, hosts: tuple[RankHost, ...], opts: WorkerOptions,
                timeout_s: float = 60.0, environ: dict[str, str] | None = None,
                reason_unavailable: Callable[[str, tuple[RankHost, ...]], str | None] | None = None,
                mpi_args: tuple[str, ...] = (), stall_root: Path | None = None,
                on_soak_progress: Callable[[SoakSummary], None] | None = None) -> SmokeReport:
    """Preflight ``backend`` on ``hosts``; run the smoke workers when it can run
    (``mpi_args``: extra mpirun arguments, for the mpi backend; the rest as
    ``run_plan``)."""
    check = reason_unavailable or preflight.unavailable_reason
    reason = check(backend, hosts)
    if reason:
        return SmokeReport(backend, "unavailable", reason=reason)
    plan = plan_launch(backend, hosts, opts, environ, mpi_args=mpi_args)
    return run_plan(plan, timeout_s, opts=opts, stall_root=stall_root,
                    on_soak_progress=on_soak_progress)


def exit_code_for(reports: list[SmokeReport], single_backend: bool) -> int:
    """0 when every backend that ran passed; 1 when one failed (a wrong
    result, an error, a rank that exited); 4 when every backend that did not
    pass stalled (``SmokeReport.stalled``: a hung rank found by the deadline,
    as train and run exit on a stall); 3 when the one backend asked for
    cannot run here. Trying every backend, an unavailable one is a row of the
    summary, not a failure."""
    failed = [r for r in reports if r.status == "failed"]
    if failed:
        return EXIT_STALLED if all(r.stalled for r in failed) else EXIT_FAILED
    if single_backend and reports and reports[0].status == "unavailable":
        return EXIT_UNAVAILABLE
    if not any(r.status == "passed" for r in reports):
        return EXIT_UNAVAILABLE
    return EXIT_OK
