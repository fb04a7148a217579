"""`mlxcluster train`: preflight the cluster, then run the reference trainer on every host."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import click

from mlxcluster.cli.doctor import render_check
from mlxcluster.cli.params import Duration, inventory_option, load_chosen_inventory
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.doctor import run_doctor
from mlxcluster.errors import EXIT_FAILED, InputError, MlxclusterError
from mlxcluster.jaccl_plan import fast_synch_warning
from mlxcluster.jobs.job import (
    BACKENDS,
    job_from_hostfile,
    job_from_inventory,
    job_local,
    launcher_name,
    plan_jaccl_job,
    program_command,
    script_path,
)
from mlxcluster.jobs.preflight import check_probes, openblas_env, probe_hosts
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.known_errors import diagnose
from mlxcluster.report import Report
from mlxcluster.train import (
    check_batch_split,
    check_out_here,
    smoke_all_sum,
    trainer_help,
    validate_trainer_args,
)
from mlxcluster.tuned import MAX_CONNECTIONS, tuned_job


@click.command("train", context_settings={"ignore_unknown_options": True})
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False),
              help="An mlx.launch hostfile (JSON).")
@inventory_option("An mlxcluster inventory (YAML). Used when no --hostfile or --local is given; "
                  "default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                  "~/.config/mlxcluster/cluster.yaml.")
@click.option("--local", "local_ranks", type=click.IntRange(1, 64),
              help="Run N ranks on this machine instead.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Distributed backend (default: the hostfile's, else ring).")
@click.option("--config", default="demo", show_default=True,
              help="Trainer config: tiny, demo, blog or a YAML path.")
@click.option("--python", "python", default=None,
              help="Python on every host for --hostfile/--local (default: this one).")
@click.option("--mpi-arg", "mpi_args", multiple=True, metavar="ARG",
              help="Extra mpirun argument (repeatable; use --mpi-arg=--flag).")
@click.option("--connections-per-ip", type=click.IntRange(1, MAX_CONNECTIONS), default=None,
              help="ring: mlx.launch --connections-per-ip (default: the hostfile's .args, "
                   "as 'mlxcluster tune' wrote it, else 1).")
@click.option("--no-preflight", is_flag=True, help="Skip the host probe and all_sum smoke.")
@click.option("--no-openblas", is_flag=True, help="Do not preload OpenBLAS on Linux hosts.")
@click.option("--timeout", type=Duration(1), default=None,
              help="Stop every rank after this long (90, 90s, 30m, 2h).")
@click.option("--stall-timeout", type=Duration(1, words=("auto", "off")), default="auto",
              show_default=True,
              help="A job with no training progress for this long (20s, 5m...) is stalled: every "
                   "rank's state and stacks are saved and named, the job is stopped, exit 4. "
                   "auto: 10 x the median step time, at least 60 s; off: not watched.")
@html_option("the run's loss, tokens/s and memory at its end (from --out's metrics.jsonl)")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def command(hostfile, inventory_path, local_ranks, backend, config, python, mpi_args, connections_per_ip,
            no_preflight, no_openblas, timeout, stall_timeout, html_path, trainer_args):
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
    sources = [s for s in (hostfile, inventory_path, local_ranks) if s]
    if len(sources) > 1:
        raise InputError("give one of --hostfile FILE, -i INVENTORY or --local N, not several",
                         "with none of them train uses the default inventory (./cluster.yaml...); "
                         "e.g. mlxcluster train --local 2 --config tiny")
    cfg = validate_trainer_args(args)
    if local_ranks:  # remote hosts: rank 0 reports a bad --out itself, in one line
        check_out_here(cfg.out)
    check_html_path(html_path)
    py = python or sys.executable
    inventory = None
    if not hostfile and not local_ranks:
        inventory = load_chosen_inventory(inventory_path, other_sources="--hostfile FILE or --local N")
    if inventory is not None:
        job = job_from_inventory(inventory, backend or "ring", args, tuple(mpi_args))
    elif hostfile:
        job = job_from_hostfile(hostfile, backend, py, args, tuple(mpi_args))
    else:
        job = job_local(local_ranks, backend or "ring", py, args, tuple(mpi_args))
    job = pick_up_tuned(job, hostfile, connections_per_ip)
    check_batch_split(cfg, len(job.hosts))  # before any preflight or launch: ranks are known
    env = dict(os.environ)
    job = plan_backend(job, inventory, env)
    n = len(job.hosts)

    mlx_version = None  # the cluster's, when the preflight asked (known errors name the fixing release)
    if inventory is not None and not no_preflight:
        run_doctor_preflight(inventory, job.backend)
    if not no_preflight:
        job, mlx_version = preflight(job, env, no_openblas=no_openblas)

    click.echo(f"launching {n} rank(s) on {job.backend}: {program_command(job)}")

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    stall = None if stall_timeout == "off" else stall_timeout  # "auto" or seconds
    outcome = run_job(job, show, env=env, timeout=timeout, stall_timeout=stall,
                              report_dir=Path(cfg.out))
    if outcome.unstopped:
        click.secho(f"warning: {outcome.unstopped}", fg="yellow", err=True)
    # A host lost to ssh comes first: mpirun frames that in the same kind of
    # message as an option it refuses, but ranks did run.
    refused = outcome.exit_code and outcome.failed_rank is None and not outcome.lost_host
    why = launcher_error(outcome.lines) if refused else None
    if why:  # the launcher refused to start: no rank ran, none is to blame
        click.secho(f"train failed: {launcher_name(job)} did not start the job, no rank ran: {why}",
                    fg="red", err=True)
        click.echo("fix: check the --mpi-arg values and the hostfile (the launcher's message "
                   "is above)" if job.backend == "mpi" else
                   "fix: the launcher's message is above", err=True)
        click.get_current_context().exit(EXIT_FAILED)
    if outcome.exit_code != 0:
        who = f"rank {outcome.failed_rank}" if outcome.failed_rank is not None else "a rank"
        if outcome.lost_host:
            click.secho(f"train failed: the ssh connection to {outcome.lost_host} failed or was lost "
                        f"({who} exited with ssh's code 255: the host stopped answering, went to "
                        "sleep or lost its link); every other rank was stopped", fg="red", err=True)
            click.echo(f"fix: bring {outcome.lost_host} back (mlxcluster doctor checks every host), "
                       "then rerun with '-- --resume auto' to continue from the last checkpoint",
                       err=True)
        else:
            click.secho(f"train failed: {who} exited with code {outcome.exit_code}; "
                        "every rank was stopped", fg="red", err=True)
        for known in diagnose(outcome.lines):  # cause and fix of a known message (docs/errors.md)
            click.echo(f"known error: {known.text(mlx_version)}", err=True)
        if html_path:  # what the run logged before it stopped
            write_run_page(cfg.out, html_path, failed=f"{who} exited with code {outcome.exit_code}")
        click.get_current_context().exit(
            outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED)
    click.echo(f"train finished on {n} rank(s) in {outcome.seconds:.1f} s")
    if html_path:
        write_run_page(cfg.out, html_path)


def write_run_page(out, html_path: str, failed: str | None = None) -> None:
    """The run's page from its metrics.jsonl, when rank 0 wrote it on this
    machine (``failed``: why the run stopped early, shown on the page)."""
    if not (Path(out) / "metrics.jsonl").is_file():
        click.secho(f"warning: no {out}/metrics.jsonl on this machine (rank 0 writes it on its host): "
                    "no HTML page written", fg="yellow", err=True)
        click.echo(f"fix: copy {out} here, then: mlxcluster report --run {out} -o {html_path}", err=True)
        return
    emit_page(Report(runs=[out], failed_runs={str(out): failed} if failed else {}), html_path)


def plan_backend(job, inventory, env: dict[str, str]):
    """jaccl / jaccl-ring: the rdma rows and env (from the hosts' live
    topology with -i; exit 3 naming every host that cannot take part), and
    the MLX_METAL_FAST_SYNCH warning. Other backends: the job unchanged."""
    job = plan_jaccl_job(job, inventory, env)
    warning = fast_synch_warning(job.env) if job.mlx_hostfile is not None else None
    if warning:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    return job


def pick_up_tuned(job, hostfile: str | None, connections_per_ip: int | None):
    """The job with the settings ``mlxcluster tune`` recorded beside the
    hostfile (HOSTFILE.args), the command line's flags winning; says on
    stderr what it picked up and from where (stdout stays the job's)."""
    job, notes = tuned_job(job, hostfile, connections_per_ip)
    for note in notes:
        click.echo(note, err=True)
    return job


def run_doctor_preflight(inventory, backend: str) -> None:
    """The doctor checks without the data-path listeners and connects (the slow part)."""
    report = run_doctor(inventory, backend=backend, data_path=False, command_timeout=30.0)
    failed = report.failed()
    for result in failed:
        for text, colour in render_check(result, verbose=False):
            click.secho(text, fg=colour, err=True)
    if failed:
        raise MlxclusterError(f"doctor found {len(failed)} failing check(s) on this cluster",
                              "fix them (details: mlxcluster doctor -i INVENTORY), or "
                              "pass --no-preflight")
    warned = len(report.warned())
    click.echo(f"[✓] doctor: {len(report.results)} checks, none failed"
               + (f", {warned} warning(s) (mlxcluster doctor shows them)" if warned else "")
               + f" ({report.seconds:.1f} s)")


MISSING_PYTHON_RE = re.compile(r"No such file or directory|not found|exit code 127")


def preflight(job, env: dict[str, str], *, no_openblas: bool = False):
    """The probe on every host (the job's python, mlx, and the trainer or the
    `run` script), OpenBLAS for every rank on Linux, then the all_sum smoke
    on the job's backend. Returns (the job, with OpenBLAS in its env when
    chosen; the cluster's mlx version). Raises MlxclusterError on a problem."""
    n = len(job.hosts)
    probes = probe_hosts(job, env=env)
    problems = check_probes(job, probes)
    if problems:
        for p in problems:
            click.secho(f"[✗] {p}", fg="red", err=True)
        missing = [p for p in probes if p.error and MISSING_PYTHON_RE.search(p.error)]
        if missing and len(missing) == len(problems):  # a python path that is not there is bad input
            raise InputError(f"python not found: {job.python} on "
                             f"{', '.join(p.host.name for p in missing)}",
                             "install the same venv at that path on every host, or give the "
                             "python every host has (inventory python:, or --python)")
        raise MlxclusterError(f"preflight found {len(problems)} problem(s)",
                              "fix the lines above; `mlxcluster doctor` checks more")
    versions = sorted({p.facts["mlx"] for p in probes})
    what = "reference_train" if job.program is None else \
        (f"{script_path(job)} present" if script_path(job) else None)
    click.echo(f"[✓] {len(probes)} host(s) run {job.python} with mlx {versions[0]}"
               + (f" and {what}" if what else ""))
    blas = {} if no_openblas else openblas_env(job, probes)
    if blas:
        job = replace(job, env={**job.env, **blas})
        click.echo(f"[✓] preloading OpenBLAS on every rank: LD_PRELOAD={blas['LD_PRELOAD']} "
                   f"OPENBLAS_NUM_THREADS={blas['OPENBLAS_NUM_THREADS']}")
    elif any(str(p.facts.get("platform", "")).startswith("linux") for p in probes):
        click.secho("[!] no OpenBLAS at one path on every Linux host: mlx uses its "
                    "reference BLAS, ~15x slower (apt install libopenblas0-pthread)",
                    fg="yellow")
    ok, detail = smoke_all_sum(job, env=env)
    if not ok:
        click.secho(f"[✗] smoke: {detail}", fg="red", err=True)
        raise MlxclusterError(f"the {job.backend} backend does not work across {n} rank(s)",
                              "run `mlxcluster smoke` / `mlxcluster doctor` for details")
    click.echo(f"[✓] smoke: {detail}")
    return job, versions[0]
