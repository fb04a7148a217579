"""`mlxcluster train`: preflight the cluster, then run the reference trainer on every host."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import click

from mlxcluster.cli.job_launch import (
    choose_job,
    one_source,
    plan_backend,
    prepare_job,
    say_failure,
    share_connections,
)
from mlxcluster.cli.params import Duration, launch_options
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.cli.restarts import launch_until_done
from mlxcluster.errors import EXIT_FAILED, InputError
from mlxcluster.jobs.job import BACKENDS, program_command
from mlxcluster.jobs.restarts import Restarts, accumulation_for, without_hosts
from mlxcluster.jobs.run import run_job
from mlxcluster.report import Report
from mlxcluster.train import (
    check_batch_split,
    check_out_here,
    restart_checkpoint_every,
    trainer_flag,
    trainer_help,
    validate_trainer_args,
    without_flag,
)
from mlxcluster.train_record import RECORD_ENV, RunRecord


@click.command("train", context_settings={"ignore_unknown_options": True})
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
@html_option("the run's loss, tokens/s and memory at its end (from --out's metrics.jsonl)")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def command(hostfile, inventory_path, local_ranks, backend, python, mpi_args, connections_per_ip,
            no_preflight, no_openblas, timeout, config, stall_timeout, max_restarts, no_sync_data,
            elastic, min_hosts, html_path,
            trainer_args):
    """Check the cluster, then run `python -m reference_train.train` on every host.

    Arguments after `--` go to the trainer, e.g.
    `mlxcluster train --local 2 --config tiny -- --steps 5 --out runs/t`.
    Exits with the failing rank's exit code when a rank fails, 4 when the job
    stalled (no progress for --stall-timeout; see docs/training.md).
    """
    args = ("--config", config, *trainer_args)
    shown = trainer_help(args)
    if shown is not None:  # `-- --help`: the trainer's help, nothing launched
        click.echo(shown, nl=False)
        return
    one_source("train", hostfile, inventory_path, local_ranks, example="--local 2 --config tiny")
    cfg = validate_trainer_args(args)
    if elastic and not max_restarts:
        raise InputError("--elastic goes on without a lost host when the job is launched again: "
                         "it needs --max-restarts N", "add --max-restarts 2 (or more)")
    if max_restarts and not cfg.checkpoint_every:  # a restart then loses at most 1/20 of the run
        args = (*args, "--checkpoint_every", str(restart_checkpoint_every(cfg.steps)))
    check_out_here(cfg.out)  # the run's record is kept here, at --out (train_record.py)
    check_html_path(html_path)
    job, inventory = choose_job(hostfile, inventory_path, local_ranks, backend, python, mpi_args,
                                connections_per_ip, trainer_args=args)
    check_batch_split(cfg, len(job.hosts))  # before any preflight or launch: ranks are known
    job = dataclasses.replace(job, env={**job.env, RECORD_ENV: "1"})
    env = dict(os.environ)
    job = share_connections(plan_backend(job, inventory, env), env)
    # mlx_version: the cluster's, when the preflight asked (known errors name the fixing release)
    job, mlx_version = prepare_job(job, inventory, env, no_preflight=no_preflight,
                                   no_openblas=no_openblas)
    if (cfg.data or cfg.init_from) and not no_sync_data:  # every Mac has its own disk
        from mlxcluster.cli.data_sync import sync_data, sync_model

        if cfg.init_from:
            sync_model(job, cfg.init_from, env)
        if cfg.data:
            sync_data(job, cfg.data, env)

    record = RunRecord(cfg.out)

    def show(stream: str, line: str) -> None:
        shown = record.feed(line)
        if shown is not None:
            click.echo(shown, err=stream == "stderr")

    stall = None if stall_timeout == "off" else stall_timeout  # "auto" or seconds
    micro_batch = cfg.global_batch // (len(job.hosts) * cfg.grad_accum)  # what each rank holds now
    restarts = Restarts(max_restarts, elastic=elastic, min_hosts=min_hosts)

    def launch(job):
        said = f"launching {len(job.hosts)} rank(s) on {job.backend}: {program_command(job)}"
        click.echo(said)
        record.start_launch(said)
        return run_job(job, show, env=env, timeout=timeout, stall_timeout=stall,
                       report_dir=Path(cfg.out))

    def resume(job, k: int):
        bound = record.resume_bound(cfg.log_every, cfg.eval_every)
        click.echo(f"resuming from the newest checkpoint every host has before step {bound} "
                   "(the steps after it are not all in the record yet)")
        args = without_flag(job.trainer_args, "--resume_before")
        if k == 1:
            args = (*args, "--resume", "auto")
        return dataclasses.replace(job, trainer_args=(*args, "--resume_before", str(bound)))

    def drop(job, dropping):
        job = without_hosts(job, {d.host for d in dropping})
        ranks = len(job.hosts)
        accum = int(trainer_flag(job.trainer_args, "--grad_accum", cfg.grad_accum))
        new_accum = accumulation_for(cfg.global_batch, ranks, micro_batch)
        for d in dropping:
            record.add({"event": "host_dropped", "host": d.host, "reason": d.reason, "ranks": ranks,
                        "grad_accum": new_accum})
            click.echo(f"dropped {d.host} ({d.reason}): going on with {ranks} rank(s) on "
                       f"{', '.join(dict.fromkeys(h.name for h in job.hosts))}")
        if new_accum != accum:
            click.echo(f"grad_accum {accum} -> {new_accum}: the global batch stays "
                       f"{cfg.global_batch} = {ranks} ranks x {new_accum} accum x "
                       f"{cfg.global_batch // (ranks * new_accum)}")
            job = dataclasses.replace(job, trainer_args=(*job.trainer_args, "--grad_accum",
                                                         str(new_accum)))
        return job

    started = time.monotonic()
    try:
        job, outcome = launch_until_done("train", job, launch, restarts, env, mlx_version,
                                         again=resume, record=record.add, drop=drop)
    finally:
        record.close()
        draw_loss(record)
    n = len(job.hosts)
    if outcome.exit_code != 0:
        who = say_failure("train", outcome, mlx_version, then=", then rerun with '-- --resume auto' "
                                                             "to continue from the last checkpoint")
        if html_path:  # what the run logged before it stopped
            write_run_page(cfg.out, html_path, failed=f"{who} exited with code {outcome.exit_code}")
        click.get_current_context().exit(
            outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED)
    again = f" after {restarts.done} restart(s)" if restarts.done else ""
    took = outcome.seconds if not restarts.done else time.monotonic() - started
    click.echo(f"train finished on {n} rank(s) in {took:.1f} s{again}")
    if html_path:
        write_run_page(cfg.out, html_path)


def draw_loss(record: RunRecord) -> None:
    """loss.png beside the record, here (the trainer leaves it to us when we keep the record)."""
    if record.metrics.is_file():
        from reference_train.train import plot_metrics

        click.echo(plot_metrics(record.metrics, record.out / "loss.png"))


def write_run_page(out, html_path: str, failed: str | None = None) -> None:
    """The run's page from the record kept here (``failed``: why the run
    stopped early, shown on the page)."""
    if not (Path(out) / "metrics.jsonl").is_file():
        click.secho(f"warning: the run logged no metrics before it stopped (no {out}/metrics.jsonl):"
                    " no HTML page written", fg="yellow", err=True)
        return
    emit_page(Report(runs=[out], failed_runs={str(out): failed} if failed else {}), html_path)
