"""`mlxcluster train`: preflight the cluster, then run the reference trainer on every host."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlxcluster.cli.job_launch import EventView, render_ending
from mlxcluster.cli.params import Duration, ProgramAfterDashDash, launch_flags, launch_options
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.errors import InputError
from mlxcluster.jobs.job import BACKENDS
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.launch.job_source import one_source
from mlxcluster.launch.on_hosts import held_on_hosts
from mlxcluster.launch.session import launch_session
from mlxcluster.launch.supervisor import ending, refuse_detached_restarts
from mlxcluster.launch.trainer import (
    RESUME_AFTER_DETACHED,
    TrainerHelp,
    check_out_here,
    model_to_download,
    parse_trainer_args,
    run_trainer,
    sends_stage_files,
    training_request,
    with_model,
    with_restart_checkpoints,
    with_stage_split,
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
@click.option("--download-on", "download_on", metavar="HOST",
              help="The trainer's --init_from is a Hugging Face id that HOST downloads into its "
                   "own cache; the other hosts take it from HOST over the hosts' link, and this "
                   "machine reads only its config, tokenizer and weight headers (no copy here).")
@html_option("the run's loss, tokens/s and memory at its end (from --out's metrics.jsonl)")
def command(timeout, config, stall_timeout, max_restarts, no_sync_data, elastic, min_hosts, detach,
            download_on, html_path, trainer_args, **launch):
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
    refuse_detached_restarts(detach, max_restarts, then=RESUME_AFTER_DETACHED)
    cfg = parsed.config
    check_out_here(cfg.out)  # the run's record is kept here, at --out (launch/record.py)
    check_html_path(html_path)
    env = dict(os.environ)
    view = EventView("train")
    ctx = click.get_current_context()
    held = ctx.with_resource(held_on_hosts(flags.source, model_to_download(parsed), download_on,
                                           env, view)) if download_on else None
    args = with_stage_split(with_restart_checkpoints(with_model(parsed, held), max_restarts))
    request = training_request(args, flags, detached=detach, send_folders=not no_sync_data)
    prepared = ctx.with_resource(launch_session(request, env, view))
    view.mlx_version = prepared.mlx_version  # known errors name the release that fixes them

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    done = run_trainer(prepared.job, args, Restarts(max_restarts, elastic=elastic,
                                                    min_hosts=min_hosts), env,
                       timeout=timeout, stall_timeout=None if stall_timeout == "off" else stall_timeout,
                       on_line=show, on_event=view, run_id=prepared.run_id,
                       stage_files=sends_stage_files(request))

    def page(end) -> None:  # what the run logged, also when it stopped early
        if html_path and end.kind in ("stopped", "failed", "finished"):
            write_run_page(cfg.out, html_path, failed=end.why)

    render_ending(ending(done, prepared.mlx_version), then=page)


def write_run_page(out, html_path: str, failed: str | None = None) -> None:
    """The run's page from the record kept here (``failed``: why the run
    stopped early, shown on the page)."""
    if not (Path(out) / "metrics.jsonl").is_file():
        click.secho(f"warning: the run logged no metrics before it stopped (no {out}/metrics.jsonl):"
                    " no HTML page written", fg="yellow", err=True)
        return
    emit_page(Report(runs=[out], failed_runs={str(out): failed} if failed else {}), html_path)
