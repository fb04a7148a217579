"""`mlxcluster train`: preflight the cluster, then run the reference trainer on every host."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import click

from mlxcluster.cli.doctor import render_check
from mlxcluster.cli.params import Duration, launch_options, load_chosen_inventory
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.doctor.doctor import run_doctor
from mlxcluster.doctor.known_errors import diagnose
from mlxcluster.errors import EXIT_FAILED, InputError, MlxclusterError
from mlxcluster.hostfile.jaccl_plan import fast_synch_warning
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
from mlxcluster.jobs.job_python import MISSING_PYTHON_RE, python_not_found, require_job_python
from mlxcluster.jobs.preflight import check_probes, openblas_env, probe_hosts
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.report import Report
from mlxcluster.train import (
    check_batch_split,
    check_out_here,
    smoke_all_sum,
    trainer_help,
    validate_trainer_args,
)
from mlxcluster.tuned import tuned_job


@click.command("train", context_settings={"ignore_unknown_options": True})
@launch_options(BACKENDS)
@click.option("--config", default="demo", show_default=True,
              help="Trainer config: tiny, demo, blog or a YAML path.")
@click.option("--stall-timeout", type=Duration(1, words=("auto", "off")), default="auto",
              show_default=True,
              help="A job with no training progress for this long (20s, 5m...) is stalled: every "
                   "rank's state and stacks are saved and named, the job is stopped, exit 4. "
                   "auto: 10 x the median step time, at least 60 s; off: not watched.")
@html_option("the run's loss, tokens/s and memory at its end (from --out's metrics.jsonl)")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def command(hostfile, inventory_path, local_ranks, backend, python, mpi_args, connections_per_ip,
            no_preflight, no_openblas, timeout, config, stall_timeout, html_path, trainer_args):
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
    if local_ranks:  # remote hosts: rank 0 reports a bad --out itself, in one line
        check_out_here(cfg.out)
    check_html_path(html_path)
    job, inventory = choose_job(hostfile, inventory_path, local_ranks, backend, python, mpi_args,
                                connections_per_ip, trainer_args=args)
    check_batch_split(cfg, len(job.hosts))  # before any preflight or launch: ranks are known
    env = dict(os.environ)
    job = plan_backend(job, inventory, env)
    n = len(job.hosts)
    # mlx_version: the cluster's, when the preflight asked (known errors name the fixing release)
    job, mlx_version = prepare_job(job, inventory, env, no_preflight=no_preflight,
                                   no_openblas=no_openblas)

    click.echo(f"launching {n} rank(s) on {job.backend}: {program_command(job)}")

    def show(stream: str, line: str) -> None:
        click.echo(line, err=stream == "stderr")

    stall = None if stall_timeout == "off" else stall_timeout  # "auto" or seconds
    outcome = run_job(job, show, env=env, timeout=timeout, stall_timeout=stall,
                              report_dir=Path(cfg.out))
    if outcome.unstopped:
        click.secho(f"warning: {outcome.unstopped}", fg="yellow", err=True)
    end_if_refused("train", job, outcome)
    if outcome.exit_code != 0:
        who = say_failure("train", outcome, mlx_version, then=", then rerun with '-- --resume auto' "
                                                             "to continue from the last checkpoint")
        if html_path:  # what the run logged before it stopped
            write_run_page(cfg.out, html_path, failed=f"{who} exited with code {outcome.exit_code}")
        click.get_current_context().exit(
            outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED)
    click.echo(f"train finished on {n} rank(s) in {outcome.seconds:.1f} s")
    if html_path:
        write_run_page(cfg.out, html_path)


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


def prepare_job(job, inventory, env: dict[str, str], *, no_preflight: bool, no_openblas: bool):
    """Before the launch: the preflight, or with ``no_preflight`` only the
    python looked for on every host (a missing one is exit 2, both ways).
    Returns (the job, the cluster's mlx version or None)."""
    if no_preflight:
        require_job_python(job, env)
        return job, None
    return preflight(job, env, no_openblas=no_openblas, inventory=inventory)


def preflight(job, env: dict[str, str], *, no_openblas: bool = False, inventory=None):
    """The probe on every host (the job's python, mlx, and the trainer or the
    `run` script), the doctor checks for an ``inventory``, OpenBLAS for every
    rank on Linux, then the all_sum smoke on the job's backend. The probe
    comes first: a python that is not there is bad input (InputError, exit 2)
    whatever else the doctor would say; any other probe problem lets doctor's
    checks speak first (they name the check and its fix). Returns (the job, with OpenBLAS in
    its env when chosen; the cluster's mlx version). Raises MlxclusterError
    on a problem."""
    n = len(job.hosts)
    probes = probe_hosts(job, env=env)
    problems = check_probes(job, probes)
    if problems:
        missing = [p for p in probes if p.error and MISSING_PYTHON_RE.search(p.error)]
        if not (missing and len(missing) == len(problems)) and inventory is not None:
            # Anything but a missing python: doctor's checks name the failing
            # check, the host and the fix (it raises when one fails).
            run_doctor_preflight(inventory, job.backend)
        for p in problems:
            click.secho(f"[✗] {p}", fg="red", err=True)
        if missing and len(missing) == len(problems):  # a python path that is not there is bad input
            raise python_not_found(job.python, [p.host.name for p in missing])
        raise MlxclusterError(f"preflight found {len(problems)} problem(s)",
                              "fix the lines above; `mlxcluster doctor` checks more")
    versions = sorted({p.facts["mlx"] for p in probes})
    what = "reference_train" if job.program is None else \
        (f"{script_path(job)} present" if script_path(job) else None)
    click.echo(f"[✓] {len(probes)} host(s) run {job.python} with mlx {versions[0]}"
               + (f" and {what}" if what else ""))
    if inventory is not None:
        run_doctor_preflight(inventory, job.backend)
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
