"""`mlxcluster run`: preflight the cluster, then run your own script or module
on every host, each line tagged with its rank and saved per rank."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import click

from mlxcluster.cli.params import Duration, inventory_option, load_chosen_inventory
from mlxcluster.cli.train import pick_up_tuned, plan_backend, preflight, run_doctor_preflight
from mlxcluster.errors import EXIT_FAILED, InputError
from mlxcluster.jobs.cleanup import new_run_id
from mlxcluster.jobs.job import (
    BACKENDS,
    job_from_hostfile,
    job_from_inventory,
    job_local,
    launcher_name,
    program_command,
    script_path,
)
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.run_output import RankLogs, program_argv
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.known_errors import diagnose
from mlxcluster.tuned import MAX_CONNECTIONS

RUN_PREFIX = "mlxrun"


@click.command("run", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False),
              help="An mlx.launch hostfile (JSON).")
@inventory_option("An mlxcluster inventory (YAML). Used when no --hostfile or --local is given; "
                  "default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                  "~/.config/mlxcluster/cluster.yaml.")
@click.option("--local", "local_ranks", type=click.IntRange(1, 64),
              help="Run N ranks on this machine instead.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Distributed backend (default: the hostfile's, else ring).")
@click.option("--python", "python", default=None,
              help="Python on every host for --hostfile/--local (default: this one).")
@click.option("--mpi-arg", "mpi_args", multiple=True, metavar="ARG",
              help="Extra mpirun argument (repeatable; use --mpi-arg=--flag).")
@click.option("--connections-per-ip", type=click.IntRange(1, MAX_CONNECTIONS), default=None,
              help="ring: mlx.launch --connections-per-ip (default: the hostfile's .args, "
                   "as 'mlxcluster tune' wrote it, else 1).")
@click.option("--no-preflight", is_flag=True,
              help="Skip the doctor checks (-i), the host probe and the all_sum smoke.")
@click.option("--no-openblas", is_flag=True, help="Do not preload OpenBLAS on Linux hosts.")
@click.option("--timeout", type=Duration(1), default=None,
              help="Stop every rank after this long (90, 90s, 30m, 2h).")
@click.option("--stall-timeout", type=Duration(1, words=("off",)), default="off",
              show_default=True,
              help="No output line from any rank for this long (20s, 5m...) is a stall: every "
                   "rank's state and stacks are saved and named, the job is stopped, exit 4.")
@click.option("--logs", "logs_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for one log file per rank (default: ./runs/RUN_ID).")
@click.option("--rank0-only", is_flag=True,
              help="Show only rank 0's lines (and the launcher's); every rank is still logged.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def command(hostfile, inventory_path, local_ranks, backend, python, mpi_args, connections_per_ip, no_preflight,
            no_openblas, timeout, stall_timeout, logs_dir, rank0_only, program):
    """Check the cluster, then run `python SCRIPT ARGS` (or `-m MODULE`) on every host.

    e.g. `mlxcluster run --local 2 -- python train.py --lr 0.1`. Each line is
    shown as `[RANK] text` and saved in the logs folder, one file per rank.
    Exits with the first failing rank's exit code; every rank on every host
    is stopped (docs/run.md).
    """
    sources = [s for s in (hostfile, inventory_path, local_ranks) if s]
    if len(sources) > 1:
        raise InputError("give one of --hostfile FILE, -i INVENTORY or --local N, not several",
                         "with none of them run uses the default inventory (./cluster.yaml...); "
                         "e.g. mlxcluster run --local 2 -- python script.py")
    argv = program_argv(program)
    py = python or sys.executable
    inventory = None
    if not hostfile and not local_ranks:
        inventory = load_chosen_inventory(inventory_path, other_sources="--hostfile FILE or --local N")
    if inventory is not None:
        job = job_from_inventory(inventory, backend or "ring", mpi_args=tuple(mpi_args))
    elif hostfile:
        job = job_from_hostfile(hostfile, backend, py, mpi_args=tuple(mpi_args))
    else:
        job = job_local(local_ranks, backend or "ring", py, mpi_args=tuple(mpi_args))
    job = pick_up_tuned(job, hostfile, connections_per_ip)
    job = replace(job, program=argv, tag_output=True)
    script = script_path(job)
    if script and all(h.is_local for h in job.hosts) and not os.path.isfile(script):
        raise InputError(f"no such script: {script}",
                         "give the path of a Python file (relative to this directory, or absolute)")
    env = dict(os.environ)
    job = plan_backend(job, inventory, env)
    run_id = new_run_id(RUN_PREFIX)
    logs_path = Path(logs_dir) if logs_dir else Path("runs") / run_id
    n = len(job.hosts)

    mlx_version = None
    if not no_preflight:
        if inventory is not None:
            run_doctor_preflight(inventory, job.backend)
        job, mlx_version = preflight(job, env, no_openblas=no_openblas)
    try:
        logs = RankLogs(logs_path)
    except OSError as err:
        raise InputError(f"cannot create the logs folder {logs_path}: {err.strerror}",
                         "give --logs a folder you can write to") from None
    try:
        click.echo(f"launching {n} rank(s) on {job.backend}, run {run_id}: {program_command(job)}")
        click.echo(f"logs: {logs_path}/rank<R>.log")

        def show(stream: str, line: str) -> None:
            rank, _ = logs.write(line)
            if rank0_only and rank not in (0, None):
                return
            click.echo(line, err=stream == "stderr")

        stall = None if stall_timeout == "off" else stall_timeout
        outcome = run_job(job, show, env=env, timeout=timeout, stall_timeout=stall,
                                  report_dir=logs_path, run_id=run_id, any_line_progress=True)
    finally:
        logs.close()
    if outcome.unstopped:
        click.secho(f"warning: {outcome.unstopped}", fg="yellow", err=True)
    refused = outcome.exit_code and outcome.failed_rank is None and not outcome.lost_host
    why = launcher_error(outcome.lines) if refused else None
    if why:  # the launcher refused to start: no rank ran, none is to blame
        click.secho(f"run failed: {launcher_name(job)} did not start the job, no rank ran: {why}",
                    fg="red", err=True)
        click.get_current_context().exit(EXIT_FAILED)
    if outcome.exit_code != 0:
        who = f"rank {outcome.failed_rank}" if outcome.failed_rank is not None else "a rank"
        if outcome.lost_host:
            click.secho(f"run failed: the ssh connection to {outcome.lost_host} failed or was lost "
                        f"({who} exited with ssh's code 255); every other rank was stopped",
                        fg="red", err=True)
        else:
            click.secho(f"run failed: {who} exited with code {outcome.exit_code}; every rank "
                        "was stopped", fg="red", err=True)
        if rank0_only and outcome.failed_rank not in (None, 0):  # its lines were not shown
            hidden = logs.tail(outcome.failed_rank)
            if hidden:
                click.echo(f"last lines of rank {outcome.failed_rank} "
                           f"({logs_path / f'rank{outcome.failed_rank}.log'}):", err=True)
                for line in hidden:
                    click.echo(f"[{outcome.failed_rank}] {line}", err=True)
        for known in diagnose(outcome.lines):
            click.echo(f"known error: {known.text(mlx_version)}", err=True)
        click.echo(f"logs: {logs_path}", err=True)
        click.get_current_context().exit(
            outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED)
    click.echo(f"run finished on {n} rank(s) in {outcome.seconds:.1f} s; logs: {logs_path}")
