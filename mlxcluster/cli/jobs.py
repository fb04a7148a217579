"""`mlxcluster jobs`: what runs on the hosts now (train, run and serve jobs, by run id;
a serve run of this machine with its address, requests and tokens)."""

from __future__ import annotations

import importlib

import click
from tabulate import tabulate

from mlxcluster.cli.job_launch import EventView
from mlxcluster.cli.params import LocalMeansHere, inventory_option
from mlxcluster.jobs.running import RunningJob, list_running
from mlxcluster.launch.job_source import JobSource, choose_job, one_source
from mlxcluster.serve.announce import Announced, announced


def host_options(command):
    """Where to look: the usual -i / --hostfile / --local of `run` and `train`."""
    command = click.option("--local", "local", is_flag=True,
                           help="Look on this machine (jobs started with --local N; N may be given).")(command)
    command = inventory_option("An mlxcluster inventory (YAML); default: $MLXCLUSTER_INVENTORY, "
                               "else ./cluster.yaml, else ~/.config/mlxcluster/cluster.yaml.")(command)
    return click.option("--hostfile", type=click.Path(exists=True, dir_okay=False),
                        help="An mlx.launch hostfile (JSON) or an MPI one.")(command)


# The commands whose runs `jobs`, `stop` and `attach` know: each registers its
# run ids' prefix when its module is imported (jobs/running.py RUN_KINDS).
LAUNCHING_MODULES = ("mlxcluster.launch.program", "mlxcluster.launch.trainer",
                     "mlxcluster.serve.serving")


def known_run_kinds() -> None:
    """Every launching command's run ids known (its module imported)."""
    for module in LAUNCHING_MODULES:
        importlib.import_module(module)


def chosen_hosts(name: str, hostfile, inventory_path, local):
    source = JobSource(hostfile, inventory_path, 1 if local else None)
    one_source(name, source, example="-i cluster.yaml")
    job, _ = choose_job(source, EventView(name))
    return job.hosts


def job_rows(jobs: list[RunningJob], serving: dict[str, Announced] | None = None) -> list[list[str]]:
    """One row per job; a serve run of this machine says its address, requests and tokens."""
    serving = serving or {}
    return [[j.run_id, j.started.strftime("%Y-%m-%d %H:%M:%S") if j.started else "?",
             f"{len(j.ranks)} on {', '.join(j.hosts)}",
             j.command + (f"\n{serving[j.run_id].line()}" if j.run_id in serving else "")]
            for j in jobs]


@click.command("jobs", cls=LocalMeansHere)
@host_options
def command(hostfile, inventory_path, local):
    """List the train, run and serve jobs running on the hosts: run id, since when,
    the ranks alive and where, and the command. Exit 0; 1 when a host did
    not answer (named)."""
    known_run_kinds()
    hosts = chosen_hosts("jobs", hostfile, inventory_path, local)
    jobs, unanswered = list_running(hosts)
    if jobs:
        click.echo(tabulate(job_rows(jobs, announced()),
                            headers=["run id", "since", "ranks alive", "command"]))
    else:
        click.echo(f"no job runs on {', '.join(dict.fromkeys(h.name for h in hosts))}")
    for result in unanswered:
        click.secho(f"warning: {result.host} did not answer: {result.error.splitlines()[-1] if result.error else 'failed'}",
                    fg="yellow", err=True)
    if unanswered:
        click.get_current_context().exit(1)
