"""`mlxcluster attach RUN_ID`: follow a detached job again, to its end."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlxcluster.cli.job_launch import EventView, exit_code_of, say_failure
from mlxcluster.cli.jobs import host_options
from mlxcluster.cli.params import LocalMeansHere
from mlxcluster.errors import InputError, Interrupted
from mlxcluster.jobs.attach import find_detached, follow_to_end
from mlxcluster.jobs.running import RUN_ID, list_running
from mlxcluster.launch.job_source import JobSource, choose_job, one_source


@click.command("attach", cls=LocalMeansHere)
@host_options
@click.option("--python", "python", default=None,
              help="The hosts' python (default: the inventory's, else this one).")
@click.argument("run_id")
def command(hostfile, inventory_path, local, python, run_id):
    """Follow RUN_ID (a job started with --detach) again: every rank's output
    from its first line, then on to the end, watched for stalls as train is
    (exit 4, every rank stopped). For a training run the record
    at its --out here is made whole from what rank 0's host kept (a relative
    --out is taken from this directory: attach from where you launched).
    Exits as `train` / `run` would have: 0 when every rank ended well."""
    if not RUN_ID.match(run_id):
        raise InputError(f"{run_id!r} is not a run id (mlxtrain-<10 hex digits> or "
                         "mlxrun-<10 hex digits>)", "mlxcluster jobs lists the runs and their ids")
    view = EventView("attach")
    source = JobSource(hostfile, inventory_path, 1 if local else None, python=python)
    one_source("attach", source, example="-i cluster.yaml")
    job, _ = choose_job(source, view)
    env = dict(os.environ)
    run = find_detached(job.hosts, run_id, env)
    if run is None:
        raise InputError(f"no run {run_id} on {', '.join(dict.fromkeys(h.name for h in job.hosts))} "
                         "(a job started with --detach keeps its ranks' output there until "
                         "attach has followed it to its end)",
                         "mlxcluster jobs lists what runs there (with the same -i, --hostfile or "
                         "--local)")
    running = any(j.run_id == run_id for j in list_running(job.hosts, env)[0])
    click.echo(f"attaching to {run_id} ({'running' if running else 'ended'}) on "
               f"{', '.join(h.name for h in run.hosts)}: {' '.join(run.program)}")
    record = None
    if run.is_training and run.out:
        from mlxcluster.launch.record import RunRecord

        record = RunRecord(run.out)
        record.start_launch(f"attached to {run_id}")
        click.echo(f"the run's record: {Path(run.out).resolve()}")

    def show(stream: str, line: str) -> None:
        shown = record.feed(line) if record is not None else line
        if shown is not None:
            click.echo(shown, err=stream == "stderr")

    try:
        outcome = follow_to_end(job, run, env, show, Path(run.out) if run.out else Path("runs"))
    except Interrupted:
        click.echo(f"left {run_id} running: 'mlxcluster attach {run_id}' again, or "
                   f"'mlxcluster stop {run_id}'", err=True)
        return
    finally:
        if record is not None:
            from mlxcluster.launch.trainer import close_record

            for said in close_record(record):
                view(said)
    if outcome.exit_code != 0:
        say_failure("attach", outcome, None)
        click.get_current_context().exit(exit_code_of(outcome))
    click.echo(f"{run_id} finished: every rank ended well")
