"""Launching a job again after it failed (`train`/`run --max-restarts N`),
and going on without a host that is lost (`train --elastic`).

A launch fails with a ``Failure``: its cause in words and the hosts it
points at (the rank that exited, the host whose ssh connection was lost, the
rank a stall names). ``Restarts`` keeps the count and, for elastic jobs,
which hosts to drop before the next launch: those unreachable now
(``unreachable_hosts``: one ssh round trip each), and those whose rank
failed in two launches in a row. ``without_hosts`` is the job on the rest.

Data-parallel training keeps its math on fewer ranks when the global batch
stays the same: ``accumulation_for`` finds the smallest gradient
accumulation that splits it over the ranks left in micro-batches no larger
than before, so every rank's memory still fits (the trainer's losses then
equal the uninterrupted run's, docs/training-cluster.md).

``launch_until_done`` is the loop itself, for `train`, `run` and `serve`
alike (through launch/supervisor.py ``supervise``): what changes between
launches (the trainer's resume, `run`'s MLXCLUSTER_RESTART, a dropped host's
batch) is the caller's ``again`` and ``drop``; every step is reported as an
event (jobs/events.py), never printed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mlxcluster import interrupts
from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.jobs.cleanup import sweep, unstopped_hint
from mlxcluster.jobs.events import (
    LaunchFailed,
    Note,
    OnEvent,
    Restarting,
    StallFailed,
    Warned,
)
from mlxcluster.jobs.hosts import RankHost, remote_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.job_python import CHECK_TIMEOUT_S, python_answers, require_job_python
from mlxcluster.jobs.running import asked_to_stop
from mlxcluster.jobs.stall import Stalled
from mlxcluster.jobs.watch import RunOutcome

UNREACHABLE = 255  # what ssh exits with when it cannot connect


@dataclass(frozen=True)
class Failure:
    """Why a launch ended badly, the hosts it points at, and its run id."""

    cause: str
    hosts: tuple[str, ...] = ()
    run_id: str = ""


def failure_of_outcome(job: Job, outcome: RunOutcome) -> Failure:
    """The failure of a launch that ended with a non-zero exit."""
    cause = f"{outcome.who} exited with code {outcome.exit_code}"
    if outcome.lost_host:
        return Failure(f"{cause} (lost the ssh connection to {outcome.lost_host})",
                       (outcome.lost_host,), outcome.run_id)
    hosts = ()
    if outcome.failed_rank is not None and outcome.failed_rank < len(job.hosts):
        hosts = (job.hosts[outcome.failed_rank].name,)
        cause += f" (on {hosts[0]})"
    return Failure(cause, hosts, outcome.run_id)


def failure_of_stall(err: Stalled) -> Failure:
    return Failure(str(err).splitlines()[0], err.hosts, err.run_id)


def unreachable_hosts(job: Job, env: dict[str, str] | None = None,
                      timeout: float = CHECK_TIMEOUT_S) -> list[str]:
    """The job's remote hosts that do not answer ssh now (no connection
    within the connect timeout, or no answer at all within ``timeout``)."""
    return [h.name for h, answer in python_answers(job, env, timeout)
            if answer is None or answer.exit_status == UNREACHABLE]


def without_hosts(job: Job, names: set[str]) -> Job:
    """The job with every rank on ``names`` taken out (ranks renumbered in order)."""
    if job.mlx_hostfile is not None:  # jaccl: the RDMA matrix and its cabling change too
        raise MlxclusterError(f"{job.backend} jobs cannot go on without a host yet: its RDMA "
                              "rows name every pair of Macs",
                              "leave out --elastic for jaccl, or use --backend ring")
    return replace(job, hosts=tuple(h for h in job.hosts if h.name not in names))


def accumulation_for(global_batch: int, ranks: int, micro_batch: int) -> int:
    """The gradient accumulation for ``ranks`` that keeps the global batch and
    no rank's micro-batch larger than ``micro_batch`` (what every rank held
    before: its memory fits that): the smallest ``a`` with global_batch =
    ranks x a x m, m <= micro_batch. InputError with the arithmetic when the
    global batch does not split over ``ranks`` at all."""
    if global_batch % ranks:
        raise InputError(f"global_batch {global_batch} does not split over the {ranks} rank(s) "
                         f"left ({global_batch} % {ranks} = {global_batch % ranks}): the run cannot "
                         "go on with the same training math",
                         "bring the lost host back and rerun with '-- --resume auto', or start "
                         f"with a global batch every host count splits (e.g. {ranks * 6})")
    per_rank = global_batch // ranks
    return next(a for a in range(-(-per_rank // micro_batch), per_rank + 1) if per_rank % a == 0)


@dataclass
class Dropped:
    host: str
    reason: str


@dataclass
class Restarts:
    """The restart budget and, with ``elastic``, which hosts to leave out."""

    max_restarts: int
    elastic: bool = False
    min_hosts: int = 2
    done: int = 0
    streaks: dict[str, int] = field(default_factory=dict)  # host -> failed launches in a row

    def can_restart(self) -> bool:
        return self.done < self.max_restarts

    def failed(self, job: Job, failure: Failure) -> None:
        """A launch of ``job`` failed: count it, for the restart and per host."""
        self.done += 1
        for h in {h.name for h in job.hosts}:
            self.streaks[h] = self.streaks.get(h, 0) + 1 if h in failure.hosts else 0

    def to_drop(self, job: Job, unreachable: list[str]) -> list[Dropped]:
        """The hosts to leave out of the next launch (elastic only), with why."""
        if not self.elastic:
            return []
        drop = [Dropped(h, "unreachable over ssh") for h in unreachable]
        drop += [Dropped(h, f"its rank failed in {n} launches in a row")
                 for h, n in sorted(self.streaks.items()) if n >= 2 and h not in unreachable]
        left = len({h.name for h in job.hosts} - {d.host for d in drop})
        if drop and left < self.min_hosts:
            raise MlxclusterError(
                f"only {left} host(s) left after dropping "
                f"{', '.join(f'{d.host} ({d.reason})' for d in drop)}: fewer than --min-hosts "
                f"{self.min_hosts}",
                "bring the hosts back and rerun with '-- --resume auto', or lower --min-hosts")
        return drop


# What changes for the next launch: the job for restart k, or the job
# without the dropped hosts; each with the notes to show.
Again = Callable[[Job, int], tuple[Job, list[str]]]
Drop = Callable[[Job, list[Dropped]], tuple[Job, list[str]]]


def launch_until_done(job: Job, launch: Callable[[Job], RunOutcome], restarts: Restarts,
                      env: dict[str, str], *, again: Again, on_event: OnEvent,
                      drop: Drop | None = None) -> tuple[Job, RunOutcome]:
    """Launch ``job`` until it ends well, the launcher refuses it, the
    program refuses its arguments at start (``RunOutcome.refused_at_start``),
    ``mlxcluster stop`` ends it, or ``restarts`` are spent; return the last job launched and its outcome (a
    stall past the budget is raised).

    After a failure: the hosts are asked again over ssh; with ``drop``
    (elastic) the ones ``restarts`` leaves out go, else an unreachable host
    ends the run; the job's python is looked for on every host; then
    ``again(job, k)`` gives restart k's job. Dropped hosts are swept again at
    the end (the first sweep could not reach them)."""
    left_behind: list[tuple[RankHost, str]] = []  # a dropped host, the run id of its ranks
    try:
        return _launch_until_done(job, launch, restarts, env, again, drop, on_event, left_behind)
    finally:
        with interrupts.deferred():
            for host, run_id in left_behind:  # stop what it still runs, now that it may answer
                hint = unstopped_hint(sweep((host,), run_id, env), run_id)
                if hint:
                    on_event(Warned(hint))


def _launch_until_done(job, launch, restarts, env, again, drop, on_event, left_behind):
    while True:
        try:
            outcome = launch(job)
        except Stalled as err:
            if not restarts.can_restart():
                raise
            on_event(StallFailed(err))
            failure = failure_of_stall(err)
        else:
            if outcome.unstopped:
                on_event(Warned(outcome.unstopped))
            if outcome.exit_code and not outcome.refusal:  # its stop mark read (and removed)
                answering = [h for h in job.hosts if h.name != outcome.lost_host]  # no wait on it
                asked = asked_to_stop(answering, outcome.run_id, env)
                outcome = replace(outcome, asked_to_stop=outcome.asked_to_stop or asked)
            # A usage error at start would be refused again: no restart mends it.
            if outcome.exit_code == 0 or outcome.refusal or outcome.asked_to_stop \
                    or outcome.refused_at_start or not restarts.can_restart():
                return job, outcome
            on_event(LaunchFailed(outcome))
            failure = failure_of_outcome(job, outcome)
        restarts.failed(job, failure)
        on_event(Restarting(restarts.done, restarts.max_restarts, failure.cause))
        unreachable = unreachable_hosts(job, env)
        dropping = restarts.to_drop(job, unreachable)
        if dropping and drop is not None:
            gone = {d.host for d in dropping}
            left_behind += [(h, failure.run_id) for h in remote_hosts(job.hosts) if h.name in gone]
            job = _said(drop(job, dropping), on_event)
        elif unreachable:
            raise MlxclusterError(f"cannot launch again: {', '.join(unreachable)} does not answer "
                                  "over ssh", "bring the host back and rerun (train: with "
                                  "'-- --resume auto'); `train --elastic` goes on without it")
        require_job_python(job, env)  # a host whose python is gone ends the run here, named
        job = _said(again(job, restarts.done), on_event)


def _said(changed: tuple[Job, list[str]], on_event: OnEvent) -> Job:
    job, notes = changed
    for note in notes:
        on_event(Note(note))
    return job
