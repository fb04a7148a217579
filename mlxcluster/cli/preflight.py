"""The preflight of `mlxcluster run` and `train`: the probe on every host,
doctor's checks, OpenBLAS for Linux ranks, then an all_sum on the job's
backend. Imported only when a preflight runs (cli/job_launch.py)."""

from __future__ import annotations

from dataclasses import replace

import click

from mlxcluster.cli.doctor import render_check
from mlxcluster.doctor.doctor import run_doctor
from mlxcluster.errors import MlxclusterError
from mlxcluster.jobs.job import script_path
from mlxcluster.jobs.job_python import MISSING_PYTHON_RE, python_not_found
from mlxcluster.jobs.preflight import check_probes, openblas_env, probe_hosts
from mlxcluster.train import smoke_all_sum


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
