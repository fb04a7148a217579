"""`mlxcluster run`: preflight the cluster, then run your own script or module
on every host, each line tagged with its rank and saved per rank."""

from __future__ import annotations

import os

import click

from mlxcluster.cli.job_launch import EventView, exit_code_of, say_failure, say_refusal
from mlxcluster.cli.params import Duration, ProgramAfterDashDash, launch_flags, launch_options
from mlxcluster.errors import EXIT_STOPPED_WHEN_ASKED, InputError, Interrupted
from mlxcluster.jobs.job import BACKENDS
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.jobs.run_output import open_rank_logs, program_argv
from mlxcluster.launch.job_source import one_source
from mlxcluster.launch.program import program_request, run_program
from mlxcluster.launch.session import launch_session


@click.command("run", cls=ProgramAfterDashDash, program_param="program",
               program="the program", example="mlxcluster run --local 2 -- python script.py --lr 0.1")
@launch_options(BACKENDS)
@click.option("--stall-timeout", type=Duration(1, words=("off",)), default="off",
              show_default=True,
              help="No output line from any rank for this long (20s, 5m...) is a stall: every "
                   "rank's state and stacks are saved and named, the job is stopped, exit 4.")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True,
              help="After a failing rank or a stall, stop every rank, probe the hosts again and "
                   "launch again, up to this many times; the program reads which launch it is "
                   "from MLXCLUSTER_RESTART (0 first) and resumes on its own.")
@click.option("--no-sync-script", is_flag=True,
              help="Do not check the script on every host (by sha256) nor send it where it is "
                   "missing or different; every host then needs it at the same path.")
@click.option("--logs", "logs_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for one log file per rank (default: ./runs/RUN_ID).")
@click.option("--detach", is_flag=True,
              help="Let the job run on without this machine (closed lid, lost network, Ctrl-C): "
                   "no lease, every rank's output kept on its host; 'mlxcluster attach RUN_ID' "
                   "follows it again, 'mlxcluster stop RUN_ID' stops it.")
@click.option("--rank0-only", is_flag=True,
              help="Show only rank 0's lines (and the launcher's); every rank is still logged.")
def command(timeout, stall_timeout, max_restarts, no_sync_script, logs_dir, detach, rank0_only,
            program, **launch):
    """Check the cluster, then run `python SCRIPT ARGS` (or `-m MODULE`) on every host.

    e.g. `mlxcluster run --local 2 -- python train.py --lr 0.1`. Each line is
    shown as `[RANK] text` and saved in the logs folder, one file per rank.
    Exits with the first failing rank's exit code; every rank on every host
    is stopped (docs/run.md).
    """
    flags = launch_flags(**launch)
    one_source("run", flags.source, example="--local 2 -- python script.py")
    argv = program_argv(program)
    if detach and max_restarts:
        raise InputError("--detach and --max-restarts do not go together: restarts are run from "
                         "this machine, and a detached job runs on without it", "leave one out")
    env = dict(os.environ)
    view = EventView("run")
    request = program_request(argv, flags, detached=detach, send_script=not no_sync_script)
    prepared = click.get_current_context().with_resource(launch_session(request, env, view))
    view.mlx_version = prepared.mlx_version
    run_id, n = prepared.run_id, len(prepared.job.hosts)
    logs_path, logs = open_rank_logs(logs_dir, run_id)

    def show(stream: str, line: str) -> None:
        rank, _ = logs.write(line)
        if rank0_only and rank not in (0, None):
            return
        click.echo(line, err=stream == "stderr")

    try:
        done = run_program(prepared.job, Restarts(max_restarts), env, run_id=run_id,
                           logs_dir=logs_path, timeout=timeout,
                           stall_timeout=None if stall_timeout == "off" else stall_timeout,
                           on_line=show, on_event=view)
    except Interrupted:
        if not detach:
            raise
        click.echo(f"left {run_id} running on the hosts: 'mlxcluster attach {run_id}' follows it "
                   f"again; 'mlxcluster stop {run_id}' stops it", err=True)
        return
    finally:
        logs.close()
    job, outcome = done.job, done.outcome
    if outcome.refusal:
        say_refusal("run", job, outcome)
    if outcome.asked_to_stop:  # `mlxcluster stop RUN_ID`: an end, not a failure to restart
        click.echo(f"run stopped when asked ('mlxcluster stop {outcome.run_id}'): every rank "
                   "ended", err=True)
        click.get_current_context().exit(EXIT_STOPPED_WHEN_ASKED)
    if outcome.exit_code != 0:
        say_failure("run", outcome, prepared.mlx_version)
        if rank0_only and outcome.failed_rank not in (None, 0):  # its lines were not shown
            hidden = logs.tail(outcome.failed_rank)
            if hidden:
                click.echo(f"last lines of rank {outcome.failed_rank} "
                           f"({logs_path / f'rank{outcome.failed_rank}.log'}):", err=True)
                for line in hidden:
                    click.echo(f"[{outcome.failed_rank}] {line}", err=True)
        click.echo(f"logs: {logs_path}", err=True)
        click.get_current_context().exit(exit_code_of(outcome))
    again_note = f" after {done.restarts} restart(s)" if done.restarts else ""
    click.echo(f"run finished on {n} rank(s) in {outcome.seconds:.1f} s{again_note}; "
               f"logs: {logs_path}")

