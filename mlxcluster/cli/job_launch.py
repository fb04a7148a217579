"""What `mlxcluster run` and `mlxcluster train` share on the command line:
the job from the launch flags (``choose_job``), the backend's plan
(``plan_backend``), the preflight or the python check (``prepare_job``), and
how a failed job is said (``end_if_refused``, ``say_failure``).

Kept light on purpose: `run --no-preflight` imports only this, the jobs
layer and the inventory. The preflight (doctor's checks, the smoke all_sum,
their reports) is imported when it runs: those imports (paramiko, the
doctor, jinja2's report) were a third of run's start-up
(docs/performance.md, run over bare mlx.launch).
"""

from __future__ import annotations

import sys

import click

from mlxcluster.cli.params import load_chosen_inventory
from mlxcluster.doctor.known_errors import diagnose
from mlxcluster.errors import EXIT_FAILED, InputError
from mlxcluster.hostfile.jaccl_plan import fast_synch_warning
from mlxcluster.jobs.connections import shared_connections
from mlxcluster.jobs.job import (
    job_from_hostfile,
    job_from_inventory,
    job_local,
    launcher_name,
    plan_jaccl_job,
)
from mlxcluster.jobs.job_python import require_job_python
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.hostfile.tuned import tuned_job


def one_source(command: str, hostfile, inventory_path, local_ranks, *, example: str) -> None:
    """InputError unless at most one of --hostfile, -i, --local is given."""
    if len([s for s in (hostfile, inventory_path, local_ranks) if s]) > 1:
        raise InputError("give one of --hostfile FILE, -i INVENTORY or --local N, not several",
                         f"with none of them {command} uses the default inventory "
                         f"(./cluster.yaml...); e.g. mlxcluster {command} {example}")


def choose_job(hostfile, inventory_path, local_ranks, backend, python, mpi_args,
               connections_per_ip: int | None = None, trainer_args: tuple[str, ...] = ()):
    """The job of `run` or `train` from the launch flags (``launch_options``):
    a hostfile (with the settings tune recorded beside it), --local N, else
    the inventory (-i or the default one). Returns (the job, the inventory or None)."""
    py = python or sys.executable
    inventory = None
    if hostfile:
        job = job_from_hostfile(hostfile, backend, py, trainer_args, tuple(mpi_args))
    elif local_ranks:
        job = job_local(local_ranks, backend or "ring", py, trainer_args, tuple(mpi_args))
    else:
        inventory = load_chosen_inventory(inventory_path,
                                          other_sources="--hostfile FILE or --local N")
        job = job_from_inventory(inventory, backend or "ring", trainer_args, tuple(mpi_args))
    return pick_up_tuned(job, hostfile, connections_per_ip), inventory


def pick_up_tuned(job, hostfile: str | None, connections_per_ip: int | None):
    """The job with the settings ``mlxcluster tune`` recorded beside the
    hostfile (HOSTFILE.args), the command line's flags winning; says on
    stderr what it picked up and from where (stdout stays the job's)."""
    job, notes = tuned_job(job, hostfile, connections_per_ip)
    for note in notes:
        click.echo(note, err=True)
    return job


def plan_backend(job, inventory, env: dict[str, str]):
    """jaccl / jaccl-ring: the rdma rows and env (from the hosts' live
    topology with -i; exit 3 naming every host that cannot take part), and
    the MLX_METAL_FAST_SYNCH warning. Other backends: the job unchanged."""
    job = plan_jaccl_job(job, inventory, env)
    warning = fast_synch_warning(job.env) if job.mlx_hostfile is not None else None
    if warning:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    return job


def share_connections(job, env: dict[str, str]):
    """The job with one shared ssh connection per host (jobs.connections)
    until the command ends, however it ends: its python check or probe,
    launch, sweep and stall calls then log in once per host, not once per
    call (docs/performance.md, run over bare mlx.launch)."""
    return click.get_current_context().with_resource(shared_connections(job, env))


def prepare_job(job, inventory, env: dict[str, str], *, no_preflight: bool, no_openblas: bool):
    """Before the launch: the preflight, or with ``no_preflight`` only the
    python looked for on every host (a missing one is exit 2, both ways).
    Returns (the job, the cluster's mlx version or None)."""
    if no_preflight:
        require_job_python(job, env)
        return job, None
    from mlxcluster.cli.preflight import preflight  # heavy: see the module docstring

    return preflight(job, env, no_openblas=no_openblas, inventory=inventory)


def end_if_refused(command: str, job, outcome) -> None:
    """When the launcher refused to start the job (no rank ran, none is to
    blame): say so with its own message and exit 1."""
    # A host lost to ssh comes first: mpirun frames that in the same kind of
    # message as an option it refuses, but ranks did run.
    refused = outcome.exit_code and outcome.failed_rank is None and not outcome.lost_host
    why = launcher_error(outcome.lines) if refused else None
    if not why:
        return
    click.secho(f"{command} failed: {launcher_name(job)} did not start the job, no rank ran: {why}",
                fg="red", err=True)
    click.echo("fix: check the --mpi-arg values and the hostfile (the launcher's message "
               "is above)" if job.backend == "mpi" else
               "fix: the launcher's message is above", err=True)
    click.get_current_context().exit(EXIT_FAILED)


def say_failure(command: str, outcome, mlx_version: str | None, *, then: str = "") -> str:
    """Who failed and how (a host lost to ssh named, with its fix and
    ``then``), and the cause and fix of any known message in the output
    (docs/errors.md). Returns who failed ("rank 1", or "a rank")."""
    who = f"rank {outcome.failed_rank}" if outcome.failed_rank is not None else "a rank"
    if outcome.lost_host:
        click.secho(f"{command} failed: the ssh connection to {outcome.lost_host} failed or was lost "
                    f"({who} exited with ssh's code 255: the host stopped answering, went to "
                    "sleep or lost its link); every other rank was stopped", fg="red", err=True)
        click.echo(f"fix: bring {outcome.lost_host} back (mlxcluster doctor checks every host)"
                   f"{then}", err=True)
    else:
        click.secho(f"{command} failed: {who} exited with code {outcome.exit_code}; "
                    "every rank was stopped", fg="red", err=True)
    for known in diagnose(outcome.lines):
        click.echo(f"known error: {known.text(mlx_version)}", err=True)
    return who
