"""`mlxcluster run`: preflight the cluster, then run your own script or module
on every host, each line tagged with its rank and saved per rank."""

from __future__ import annotations

import os

import click

from mlxcluster.cli.job_launch import EventView, render_ending
from mlxcluster.cli.params import Duration, ProgramAfterDashDash, launch_flags, launch_options
from mlxcluster.jobs.job import BACKENDS
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.jobs.run_output import program_argv
from mlxcluster.launch.job_source import one_source
from mlxcluster.launch.program import program_request, run_program
from mlxcluster.launch.session import launch_session
from mlxcluster.launch.supervisor import ending, refuse_detached_restarts


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
    refuse_detached_restarts(detach, max_restarts)
    env = dict(os.environ)
    view = EventView("run")
    request = program_request(argv, flags, detached=detach, send_script=not no_sync_script)
    prepared = click.get_current_context().with_resource(launch_session(request, env, view))
    view.mlx_version = prepared.mlx_version

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    done = run_program(prepared.job, Restarts(max_restarts), env, run_id=prepared.run_id,
                       logs_dir=logs_dir, timeout=timeout,
                       stall_timeout=None if stall_timeout == "off" else stall_timeout,
                       rank0_only=rank0_only, on_line=show, on_event=view)
    render_ending(ending(done, prepared.mlx_version))
