"""The preflight of `mlxcluster run` and `train`: the probe on every host,
doctor's checks, OpenBLAS for Linux ranks, then an all_sum on the job's
backend. Every verdict is reported as it comes (jobs/events.py), nothing is
printed.

Imported only when a preflight runs: its imports (paramiko, the doctor, the
smoke worker's launch) were a third of `run`'s start-up (docs/performance-history.md,
run over bare mlx.launch); `run --no-preflight` never loads them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from mlxcluster.doctor.doctor import run_doctor
from mlxcluster.errors import MlxclusterError
from mlxcluster.jobs.events import Checked, ChecksFailed, OnEvent
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import Job, launcher_name, script_path, split_mpi_args
from mlxcluster.jobs.job_python import MISSING_PYTHON_RE, python_not_found
from mlxcluster.jobs.preflight import check_probes, openblas_env, probe_hosts
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.preflight import unavailable_reason
from mlxcluster.smoke.run import run_backend

SMOKE_TIMEOUT = 90.0  # per phase: the ring backend retries connects for ~30 s before failing
# The preflight only needs the group to form and sum: all_sum of a few float32s.
SMOKE_OPTIONS = WorkerOptions(dtypes=("float32",), lo_bytes=16, hi_bytes=16, ops=("all_sum",))


def preflight(job: Job, env: dict[str, str], on_event: OnEvent, *, no_openblas: bool = False,
              inventory=None) -> tuple[Job, str]:
    """The probe on every host (the job's python, mlx, the job's imports and
    script), the doctor checks for an ``inventory``, OpenBLAS for every rank
    on Linux, then the all_sum smoke on the job's backend. The probe comes
    first: a python that is not there is bad input (InputError, exit 2)
    whatever else the doctor would say; any other probe problem lets doctor's
    checks speak first (they name the check and its fix). Returns (the job,
    with OpenBLAS in its env when chosen; the cluster's mlx version). Raises
    MlxclusterError on a problem, after reporting it."""
    n = len(job.hosts)
    probes = probe_hosts(job, env=env)
    problems = check_probes(job, probes)
    if problems:
        missing = [p for p in probes if p.error and MISSING_PYTHON_RE.search(p.error)]
        if not (missing and len(missing) == len(problems)) and inventory is not None:
            # Anything but a missing python: doctor's checks name the failing
            # check, the host and the fix (it raises when one fails).
            run_doctor_preflight(inventory, job.backend, on_event, job.imports)
        for problem in problems:
            on_event(Checked("fail", problem))
        if missing and len(missing) == len(problems):  # a python path that is not there is bad input
            raise python_not_found(job.python, [p.host.name for p in missing])
        raise MlxclusterError(f"preflight found {len(problems)} problem(s)",
                              "fix the lines above; `mlxcluster doctor` checks more")
    versions = sorted({p.facts["mlx"] for p in probes})
    what = [*(m.split(".")[0] for m in job.imports)] + \
        ([f"{script_path(job)} present"] if script_path(job) else [])
    on_event(Checked("ok", f"{len(probes)} host(s) run {job.python} with mlx {versions[0]}"
                     + (f" and {', '.join(what)}" if what else "")))
    if inventory is not None:
        run_doctor_preflight(inventory, job.backend, on_event, job.imports)
    blas = {} if no_openblas else openblas_env(job, probes)
    if blas:
        job = replace(job, env={**job.env, **blas})
        on_event(Checked("ok", f"preloading OpenBLAS on every rank: LD_PRELOAD={blas['LD_PRELOAD']} "
                               f"OPENBLAS_NUM_THREADS={blas['OPENBLAS_NUM_THREADS']}"))
    elif any(str(p.facts.get("platform", "")).startswith("linux") for p in probes):
        on_event(Checked("warn", "no OpenBLAS at one path on every Linux host: mlx uses its "
                                 "reference BLAS, ~15x slower (apt install libopenblas0-pthread)"))
    if n == 1:
        # Nothing to sum across; mlx.launch's one-host ring launch cannot
        # start a strict ring either (rank_wrapper.drop_blank_hostfile).
        on_event(Checked("ok", "smoke: one rank, no collective to try"))
        return job, versions[0]
    ok, detail = smoke_all_sum(job, env=env)
    if not ok:
        on_event(Checked("fail", f"smoke: {detail}"))
        raise MlxclusterError(f"the {job.backend} backend does not work across {n} rank(s)",
                              "run `mlxcluster smoke` / `mlxcluster doctor` for details")
    on_event(Checked("ok", f"smoke: {detail}"))
    return job, versions[0]


def run_doctor_preflight(inventory, backend: str, on_event: OnEvent, imports: tuple[str, ...] = ()) -> None:
    """The doctor checks without the data-path listeners and connects (the
    slow part); ``imports``: the job's (trainer-deps judges what it names)."""
    report = run_doctor(inventory, backend=backend, data_path=False, command_timeout=30.0,
                        trainer_modules=imports)
    failed = report.failed()
    if failed:
        on_event(ChecksFailed(tuple(failed)))
        raise MlxclusterError(f"doctor found {len(failed)} failing check(s) on this cluster",
                              "fix them (details: mlxcluster doctor -i INVENTORY), or "
                              "pass --no-preflight")
    warned = len(report.warned())
    on_event(Checked("ok", f"doctor: {len(report.results)} checks, none failed"
                           + (f", {warned} warning(s) (mlxcluster doctor shows them)" if warned else "")
                           + f" ({report.seconds:.1f} s)"))


def smoke_ranks(job: Job) -> tuple[RankHost, ...]:
    """The job's ranks as the smoke all_sum runs them: the job's python, its
    environment (OpenBLAS included) and (jaccl) its rdma rows."""
    rows = [e.rdma for e in job.mlx_hostfile.hosts] if job.mlx_hostfile else [()] * len(job.hosts)
    return tuple(replace(h, python=job.python, env=tuple(sorted(job.env.items())), rdma=row)
                 for h, row in zip(job.hosts, rows, strict=True))


def smoke_all_sum(job: Job, env: dict[str, str] | None = None,
                  timeout: float = SMOKE_TIMEOUT) -> tuple[bool, str]:
    """The smoke worker, all_sum only (float32, a few elements), across every rank
    on the job's backend: strict init, group size and sums checked on every rank,
    a deadline per phase, nothing left running. Returns (ok, one-line detail)."""
    n = len(job.hosts)
    try:
        # jaccl: plan_jaccl_job already judged every host from its topology; the login
        # shells: the job's own probe asked them (jobs.preflight.check_probes).
        judged = ((lambda backend, ranks: None) if job.mlx_hostfile is not None
                  else partial(unavailable_reason, shells=False))
        report = run_backend(job.backend, smoke_ranks(job), SMOKE_OPTIONS, timeout_s=timeout,
                             environ=env, mpi_args=split_mpi_args(job), reason_unavailable=judged)
    except MlxclusterError as e:
        return False, str(e)
    if report.passed:
        return True, f"all_sum over {n} ranks on {job.backend} = {n} ({report.duration_s:.1f} s)"
    why = launcher_error(report.launcher_stderr.splitlines()) if report.ranks else None
    if why:  # e.g. a bad --mpi-arg: no rank ran, so none is to blame
        return False, f"{launcher_name(job)} did not start the ranks: {why}"
    # Every rank's verdict, the one that failed first leading (unavailable: no ranks ran).
    verdicts = "; ".join(f"rank {r.rank} on {r.host} {r.status}" + (f": {r.detail}" if r.detail else "")
                         for r in report.failed_ranks)
    return False, verdicts or report.reason or report.status
