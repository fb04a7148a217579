"""`mlxcluster train`: preflight the cluster, then run the reference trainer on every host."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlxcluster.cli.job_launch import EventView, exit_code_of, say_failure, say_refusal
from mlxcluster.cli.params import Duration, ProgramAfterDashDash, launch_flags, launch_options
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.errors import EXIT_STOPPED_WHEN_ASKED, InputError, Interrupted
from mlxcluster.jobs.job import BACKENDS
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.launch.job_source import one_source
from mlxcluster.launch.session import launch_session
from mlxcluster.launch.trainer import (
    RESUME_THEN,
    TrainerHelp,
    check_out_here,
    parse_trainer_args,
    run_trainer,
    training_request,
    with_restart_checkpoints,
)
from mlxcluster.report import Report
from reference_train.config import field_types


@click.command("train", cls=ProgramAfterDashDash, program_param="trainer_args",
               program="the trainer", example="mlxcluster train --local 2 -- --steps 5",
               program_flags=lambda: {f"--{name}" for name in field_types()})
@launch_options(BACKENDS)
@click.option("--config", default="demo", show_default=True,
              help="Trainer config: tiny, demo, blog or a YAML path.")
@click.option("--stall-timeout", type=Duration(1, words=("auto", "off")), default="auto",
              show_default=True,
              help="A job with no training progress for this long (20s, 5m...) is stalled: every "
                   "rank's state and stacks are saved and named, the job is stopped, exit 4. "
                   "auto: 10 x the median step time, at least 60 s; off: not watched.")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True,
              help="After a failing rank or a stall, stop every rank, probe the hosts again and "
                   "launch again from the newest checkpoint, up to this many times. Without "
                   "checkpoint_every, the trainer then checkpoints every steps/20 steps.")
@click.option("--no-sync-data", is_flag=True,
              help="Do not check the trainer's --data DIR (by the sha256 in its meta.json) and "
                   "--init_from DIR on every host, nor send them where missing or different.")
@click.option("--elastic", is_flag=True,
              help="With --max-restarts: a host unreachable when the job is launched again, or "
                   "whose rank failed in two launches in a row, is dropped and training goes on "
                   "with the rest, the same global batch (grad_accum raised where needed).")
@click.option("--min-hosts", type=click.IntRange(1), default=2, show_default=True,
              help="With --elastic: never go on with fewer hosts than this.")
@click.option("--detach", is_flag=True,
              help="Let the job run on without this machine (closed lid, lost network, Ctrl-C): "
                   "no lease, every rank's output kept on its host; 'mlxcluster attach RUN_ID' "
                   "follows it again and makes the record here whole, 'mlxcluster stop RUN_ID' "
                   "stops it.")
@html_option("the run's loss, tokens/s and memory at its end (from --out's metrics.jsonl)")
def command(timeout, config, stall_timeout, max_restarts, no_sync_data, elastic, min_hosts, detach,
            html_path, trainer_args, **launch):
    """Check the cluster, then run `python -m reference_train.train` on every host.

    Arguments after `--` go to the trainer, e.g.
    `mlxcluster train --local 2 --config tiny -- --steps 5 --out runs/t`.
    Exits with the failing rank's exit code when a rank fails, 4 when the job
    stalled (no progress for --stall-timeout; see docs/training-cluster.md).
    """
    # A --config after `--` is the trainer's own and wins (as it did when it came last);
    # ours is then left out so the launch line shows the one config the ranks build.
    given = any(a == "--config" or a.startswith("--config=") for a in trainer_args)
    parsed = parse_trainer_args(trainer_args if given else ("--config", config, *trainer_args))
    if isinstance(parsed, TrainerHelp):  # `-- --help`: the trainer's help, nothing launched
        click.echo(parsed.text, nl=False)
        return
    flags = launch_flags(**launch)
    one_source("train", flags.source, example="--local 2 --config tiny")
    if elastic and not max_restarts:
        raise InputError("--elastic goes on without a lost host when the job is launched again: "
                         "it needs --max-restarts N", "add --max-restarts 2 (or more)")
    if detach and max_restarts:
        raise InputError("--detach and --max-restarts do not go together: restarts are run from "
                         "this machine, and a detached job runs on without it",
                         "leave one out (a detached job that fails: rerun with -- --resume auto)")
    args = with_restart_checkpoints(parsed, max_restarts)
    cfg = args.config
    check_out_here(cfg.out)  # the run's record is kept here, at --out (launch/record.py)
    check_html_path(html_path)
    env = dict(os.environ)
    view = EventView("train")
    request = training_request(args, flags, detached=detach, send_folders=not no_sync_data)
    prepared = click.get_current_context().with_resource(launch_session(request, env, view))
    view.mlx_version = prepared.mlx_version  # known errors name the release that fixes them

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    restarts = Restarts(max_restarts, elastic=elastic, min_hosts=min_hosts)
    run_id = prepared.run_id
    try:
        done = run_trainer(prepared.job, args, restarts, env, timeout=timeout,
                           stall_timeout=None if stall_timeout == "off" else stall_timeout,
                           on_line=show, on_event=view, run_id=run_id)
    except Interrupted:
        if not detach:
            raise
        click.echo(f"left {run_id} running on the hosts: 'mlxcluster attach {run_id}' follows it "
                   f"again and makes the record at {cfg.out} whole; 'mlxcluster stop {run_id}' "
                   "stops it", err=True)
        return
    outcome = done.outcome
    if detach and outcome.lost_host:  # cut off from a host: a detached job may run on there
        click.echo(f"lost the ssh connection to {outcome.lost_host}: {done.job.title} of run "
                   f"{outcome.run_id} may go on there ('mlxcluster jobs' shows it, 'mlxcluster "
                   f"attach {outcome.run_id}' follows it again when the host answers)", err=True)
    if outcome.refusal:
        say_refusal("train", done.job, outcome)
    if outcome.asked_to_stop:
        at = f" at step {done.stopped_at}" if done.stopped_at is not None else ""
        said = f"stopped{at} when asked"
        click.echo(f"train {said} (mlxcluster stop, or the lease of the machine running "
                   "mlxcluster ran out): every rank wrote its checkpoint at that step; go on "
                   "with '-- --resume auto'", err=True)
        if html_path:
            write_run_page(cfg.out, html_path, failed=said)
        click.get_current_context().exit(EXIT_STOPPED_WHEN_ASKED)
    if outcome.exit_code != 0:
        who = say_failure("train", outcome, prepared.mlx_version, then=RESUME_THEN)
        if html_path:  # what the run logged before it stopped
            write_run_page(cfg.out, html_path, failed=f"{who} exited with code {outcome.exit_code}")
        click.get_current_context().exit(exit_code_of(outcome))
    again = f" after {done.restarts} restart(s)" if done.restarts else ""
    click.echo(f"train finished on {len(done.job.hosts)} rank(s) in {done.seconds:.1f} s{again}")
    if html_path:
        write_run_page(cfg.out, html_path)


def write_run_page(out, html_path: str, failed: str | None = None) -> None:
    """The run's page from the record kept here (``failed``: why the run
    stopped early, shown on the page)."""
    if not (Path(out) / "metrics.jsonl").is_file():
        click.secho(f"warning: the run logged no metrics before it stopped (no {out}/metrics.jsonl):"
                    " no HTML page written", fg="yellow", err=True)
        return
    emit_page(Report(runs=[out], failed_runs={str(out): failed} if failed else {}), html_path)
