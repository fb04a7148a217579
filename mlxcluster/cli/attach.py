"""`mlxcluster attach RUN_ID`: follow a detached job again, to its end."""

from __future__ import annotations

import os

import click

from mlxcluster.cli.job_launch import EventView, render_ending
from mlxcluster.cli.jobs import host_options, known_run_kinds
from mlxcluster.cli.params import LocalMeansHere
from mlxcluster.jobs.running import check_run_id
from mlxcluster.launch.attach import find_to_attach, follow_attached
from mlxcluster.launch.job_source import JobSource, choose_job, one_source
from mlxcluster.launch.supervisor import ending


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
    known_run_kinds()
    check_run_id(run_id, detachable=True)
    view = EventView("attach")
    source = JobSource(hostfile, inventory_path, 1 if local else None, python=python)
    one_source("attach", source, example="-i cluster.yaml")
    job, _ = choose_job(source, view)
    env = dict(os.environ)
    run = find_to_attach(job, run_id, env, view)

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    render_ending(ending(follow_attached(job, run, env, show, view)))
