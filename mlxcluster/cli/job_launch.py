"""What `mlxcluster run` and `mlxcluster train` share on the command line:
the job from the launch flags (``choose_job``), the backend's plan
(``plan_backend``), the preflight or the python check (``prepare_job``), the
launch path's events rendered (``EventView``), and how a failed job is said
(``say_refusal``, ``say_failure``).

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
from mlxcluster.hostfile.tuned import tuned_job
from mlxcluster.jobs.connections import shared_connections
from mlxcluster.jobs.events import (
    Checked,
    ChecksFailed,
    LaunchFailed,
    Note,
    Restarting,
    SendEnded,
    Sending,
    SendProgress,
    StallFailed,
    Warned,
)
from mlxcluster.jobs.hosts import remote_hosts
from mlxcluster.jobs.job import (
    job_from_hostfile,
    job_from_inventory,
    job_local,
    launcher_name,
    plan_jaccl_job,
)
from mlxcluster.jobs.job_python import require_job_python


def one_source(command: str, hostfile, inventory_path, local_ranks, *, example: str) -> None:
    """InputError unless at most one of --hostfile, -i, --local is given."""
    if len([s for s in (hostfile, inventory_path, local_ranks) if s]) > 1:
        raise InputError("give one of --hostfile FILE, -i INVENTORY or --local N, not several",
                         f"with none of them {command} uses the default inventory "
                         f"(./cluster.yaml...); e.g. mlxcluster {command} {example}")


def choose_job(hostfile, inventory_path, local_ranks, backend, python, mpi_args,
               connections_per_ip: int | None = None):
    """The job of `run` or `train` from the launch flags (``launch_options``):
    a hostfile (with the settings tune recorded beside it), --local N, else
    the inventory (-i or the default one). Returns (the job, the inventory or None)."""
    py = python or sys.executable
    inventory = None
    if hostfile:
        job = job_from_hostfile(hostfile, backend, py, tuple(mpi_args))
    elif local_ranks:
        job = job_local(local_ranks, backend or "ring", py, tuple(mpi_args))
    else:
        inventory = load_chosen_inventory(inventory_path,
                                          other_sources="--hostfile FILE or --local N")
        job = job_from_inventory(inventory, backend or "ring", tuple(mpi_args))
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


def prepare_job(job, inventory, env: dict[str, str], view: EventView, *, no_preflight: bool,
                no_openblas: bool, no_sync_code: bool = False, check=None):
    """Before the launch: the python looked for on every host (a missing one
    is exit 2), ``check(job)`` (train: the same run not running there), what
    ranks import of this project sent to every remote host that lacks this
    version (launch/code.py; not with ``no_sync_code``: the ranks then import
    from this checkout's path), then the preflight unless ``no_preflight``.
    Returns (the job, the cluster's mlx version or None)."""
    require_job_python(job, env)
    if check is not None:
        check(job)
    if remote_hosts(job.hosts) and not no_sync_code:
        from mlxcluster.launch.code import sync_code  # remote jobs only: see the module docstring

        job = sync_code(job, env, view)
    if no_preflight:
        return job, None
    from mlxcluster.launch.preflight import preflight  # heavy: see the module docstring

    job, view.mlx_version = preflight(job, env, view, no_openblas=no_openblas, inventory=inventory)
    return job, view.mlx_version


class EventView:
    """Renders the launch path's events (jobs/events.py) as `run` and
    `train` print them; a transfer's progress bar on stderr."""

    def __init__(self, command: str, mlx_version: str | None = None):
        self.command = command
        self.mlx_version = mlx_version  # the cluster's, once the preflight knows it
        self._bar = None

    def __call__(self, event: object) -> None:
        if isinstance(event, Note):
            click.echo(event.text)
        elif isinstance(event, Warned):
            click.secho(f"warning: {event.text}", fg="yellow", err=True)
        elif isinstance(event, Checked):
            self._checked(event)
        elif isinstance(event, ChecksFailed):
            from mlxcluster.cli.doctor import render_check  # preflight only: see the docstring

            for result in event.results:
                for text, colour in render_check(result, verbose=False):
                    click.secho(text, fg=colour, err=True)
        elif isinstance(event, LaunchFailed):
            say_failure(self.command, event.outcome, self.mlx_version)
        elif isinstance(event, StallFailed):
            click.secho(f"error: {event.error}", fg="red", err=True)
        elif isinstance(event, Restarting):
            click.echo(f"restart {event.done}/{event.max_restarts} after: {event.cause}; every "
                       "rank was stopped; probing the hosts again")
        elif isinstance(event, Sending) and sys.stderr.isatty():
            # A bar is for a person watching; in a log it is only its label, alone on a
            # line ("  to labhost1"), after the "sent ..." line has said it all.
            self._bar = click.progressbar(length=max(event.total, 1), label=f"  to {event.host}",
                                          file=sys.stderr)
            self._bar.__enter__()
        elif isinstance(event, SendProgress) and self._bar is not None:
            self._bar.update(event.done - self._bar.pos)
        elif isinstance(event, SendEnded) and self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    @staticmethod
    def _checked(event: Checked) -> None:
        if event.mark == "ok":
            click.echo(f"[✓] {event.text}")
        elif event.mark == "warn":
            click.secho(f"[!] {event.text}", fg="yellow")
        else:
            click.secho(f"[✗] {event.text}", fg="red", err=True)


def say_refusal(command: str, job, outcome) -> None:
    """The launcher refused to start the job (no rank ran, none is to
    blame): say so with its own message and exit 1."""
    click.secho(f"{command} failed: {launcher_name(job)} did not start the job, no rank ran: "
                f"{outcome.refusal}", fg="red", err=True)
    click.echo("fix: check the --mpi-arg values and the hostfile (the launcher's message "
               "is above)" if job.backend == "mpi" else
               "fix: the launcher's message is above", err=True)
    click.get_current_context().exit(EXIT_FAILED)


def say_failure(command: str, outcome, mlx_version: str | None, *, then: str = "") -> str:
    """Who failed and how (a host lost to ssh named, with its fix and
    ``then``), and the cause and fix of any known message in the output
    (docs/errors.md). Returns who failed ("rank 1", or "a rank")."""
    who = outcome.who
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


def exit_code_of(outcome) -> int:
    """The command's exit code for a failed job: the failing rank's, else 1."""
    return outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED
