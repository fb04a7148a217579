"""`--max-restarts N` for `train` and `run` (and `train --elastic`): launch,
and after a failing rank or a stall launch again, saying why, until the job
ends well or the restarts are spent (mlxcluster.jobs.restarts decides; this
says it)."""

from __future__ import annotations

from collections.abc import Callable

import click

from mlxcluster import interrupts
from mlxcluster.cli.job_launch import end_if_refused, say_failure
from mlxcluster.errors import MlxclusterError
from mlxcluster.jobs.cleanup import sweep, unstopped_hint
from mlxcluster.jobs.hosts import RankHost, remote_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.job_python import require_job_python
from mlxcluster.jobs.restarts import (
    Dropped,
    Restarts,
    failure_of_outcome,
    failure_of_stall,
    unreachable_hosts,
)
from mlxcluster.jobs.stall import Stalled
from mlxcluster.jobs.watch import RunOutcome


def launch_until_done(command: str, job: Job, launch: Callable[[Job], RunOutcome],
                      restarts: Restarts, env: dict[str, str], mlx_version: str | None, *,
                      again: Callable[[Job, int], Job], record: Callable[[dict], None],
                      drop: Callable[[Job, list[Dropped]], Job] | None = None
                      ) -> tuple[Job, RunOutcome]:
    """Launch ``job`` until it ends well or ``restarts`` are spent; return
    the last job launched and its outcome (a stall past the budget is raised).

    ``again(job, k)``: the job for restart k (resume, MLXCLUSTER_RESTART...);
    ``record(event)``: a restart event for the run's record; ``drop(job,
    hosts)``: the job without those hosts (elastic), saying so. Dropped
    hosts are swept again at the end (the first sweep could not reach them)."""
    left_behind: list[tuple[RankHost, str]] = []  # a dropped host, the run id of its ranks
    try:
        return _launch_until_done(command, job, launch, restarts, env, mlx_version, again, record,
                                  drop, left_behind)
    finally:
        with interrupts.deferred():
            sweep_left_behind(left_behind, env)


def sweep_left_behind(left_behind: list[tuple[RankHost, str]], env: dict[str, str]) -> None:
    """Stop what a dropped host still runs, now that it may answer again."""
    for host, run_id in left_behind:
        hint = unstopped_hint(sweep((host,), run_id, env), run_id)
        if hint:
            click.secho(f"warning: {hint}", fg="yellow", err=True)


def _launch_until_done(command, job, launch, restarts, env, mlx_version, again, record, drop,
                       left_behind):
    while True:
        try:
            outcome = launch(job)
        except Stalled as err:
            if not restarts.can_restart():
                raise
            click.secho(f"error: {err}", fg="red", err=True)
            failure = failure_of_stall(err)
        else:
            if outcome.unstopped:
                click.secho(f"warning: {outcome.unstopped}", fg="yellow", err=True)
            end_if_refused(command, job, outcome)
            if outcome.exit_code == 0 or not restarts.can_restart():
                return job, outcome
            failure = failure_of_outcome(job, outcome, say_failure(command, outcome, mlx_version))
        restarts.failed(job, failure)
        record({"event": "restart", "restart": restarts.done, "max_restarts": restarts.max_restarts,
                "cause": failure.cause})
        click.echo(f"restart {restarts.done}/{restarts.max_restarts} after: {failure.cause}; every "
                   "rank was stopped; probing the hosts again")
        unreachable = unreachable_hosts(job, env)
        dropping = restarts.to_drop(job, unreachable)
        if dropping and drop is not None:
            gone = {d.host for d in dropping}
            left_behind += [(h, failure.run_id) for h in remote_hosts(job.hosts) if h.name in gone]
            job = drop(job, dropping)
        elif unreachable:
            raise MlxclusterError(f"cannot launch again: {', '.join(unreachable)} does not answer "
                                  "over ssh", "bring the host back and rerun (train: with "
                                  "'-- --resume auto'); `train --elastic` goes on without it")
        require_job_python(job, env)  # a host whose python is gone ends the run here, named
        job = again(job, restarts.done)
