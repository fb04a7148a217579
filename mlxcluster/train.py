"""Hand-off to the reference trainer: what is trainer-specific about a job.

``mlxcluster train`` builds a ``jobs.Job`` (no program: the trainer), checks
the trainer's own flags here before anything starts on the hosts
(``validate_trainer_args``, ``check_batch_split``, ``check_out_here``), runs
the job's preflight (``jobs.preflight``) and the smoke worker's all_sum on
its backend (``smoke_all_sum``), then runs it through the one job path
(``jobs.run.run_job``). ``mlxcluster run`` shares all of it but the trainer's
flags.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import Job, launcher_name, split_mpi_args
from mlxcluster.jobs.watch import launcher_error
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.preflight import unavailable_reason
from mlxcluster.smoke.run import run_backend

if TYPE_CHECKING:
    from reference_train.train import TrainConfig

SMOKE_TIMEOUT = 90.0  # per phase: the ring backend retries connects for ~30 s before failing
# The train preflight only needs the group to form and sum: all_sum of a few float32s.
SMOKE_OPTIONS = WorkerOptions(dtypes=("float32",), lo_bytes=16, hi_bytes=16, ops=("all_sum",))


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


def trainer_help(args: tuple[str, ...]) -> str | None:
    """The trainer's own help text when ``args`` ask for it (``-- --help``), else None."""
    from reference_train.train import build_config

    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(io.StringIO()):
            build_config(list(args))
    except SystemExit as done:  # argparse exits 0 after printing the help
        return shown.getvalue() if done.code in (0, None) else None
    except ValueError:  # validate_trainer_args reports it
        return None
    return None


def validate_trainer_args(args: tuple[str, ...]) -> TrainConfig:
    """Parse the trainer's own flags here, before anything starts on the hosts:
    a typo must not cost a launch on every host to find out. Returns the
    config every rank will build."""
    from reference_train.train import build_config  # same code the ranks run

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(captured):
            return build_config(list(args))
    except SystemExit:  # argparse: unknown flag or missing value (--help: see trainer_help)
        said = [ln for ln in captured.getvalue().splitlines() if ln.strip()]
        raise InputError(f"trainer arguments rejected: {said[-1] if said else ' '.join(args)}",
                         "python -m reference_train.train --help lists every --field") from None
    except ValueError as err:  # a config file's problem, a type or a value out of range
        raise InputError(f"trainer arguments rejected: {err}",
                         "configs are tiny, demo, blog or a YAML file; docs/training.md lists "
                         "every field, its type and its allowed values") from None


def trainer_flag(args: tuple[str, ...], flag: str, default):
    """The value the trainer takes for ``flag`` from ``args`` (the last one
    given, as argparse takes it), else ``default``."""
    value = default
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def without_flag(args: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """``args`` without ``flag VALUE`` and ``flag=VALUE`` (a flag that takes a value)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return tuple(kept)


def check_batch_split(cfg: TrainConfig, ranks: int) -> None:
    """InputError when the global batch does not split over ``ranks`` x
    ``grad_accum`` micro-batches. The ranks check this too (reference_train
    split_batch), but only after a launch on every host, and then every rank
    dies with the same error; the number of ranks is known here before that."""
    unit = ranks * cfg.grad_accum
    rest = cfg.global_batch % unit
    if not rest:
        return
    over = f"{ranks} ranks" if cfg.grad_accum == 1 else \
        f"{ranks} ranks x grad_accum {cfg.grad_accum} = {unit} micro-batches"
    below, above = cfg.global_batch - rest, cfg.global_batch - rest + unit
    choices = f"{below} or {above}" if below else f"{above}"
    divisors = [n for n in range(1, cfg.global_batch + 1)
                if cfg.global_batch % (n * cfg.grad_accum) == 0]
    raise InputError(
        f"global_batch {cfg.global_batch} does not split over {over} "
        f"({cfg.global_batch} % {unit} = {rest}): use --global_batch {choices}",
        f"pass it to the trainer after '--' (e.g. -- --global_batch {above}) or set it in the "
        f"config; or run on a number of ranks it splits over: "
        f"{', '.join(map(str, divisors[:8]))}{', ...' if len(divisors) > 8 else ''}")


def check_out_here(out: str) -> None:
    """For ranks on this machine: rank 0 writes the run to the trainer's
    ``--out``, so it must be a directory here or creatable here (checked by
    creating and removing a directory beside where it will be made)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InputError(f"trainer --out {out} exists and is not a directory",
                         "give --out a directory path (new or existing), e.g. -- --out runs/mine")
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise InputError(f"trainer --out {out} cannot be created: {base} is not a directory",
                         "give --out a path under a directory, e.g. -- --out runs/mine")
    try:
        probe = tempfile.mkdtemp(prefix=".mlxcluster-out-probe.", dir=base)
    except OSError as err:
        raise InputError(f"trainer --out {out} cannot be created: {err.strerror} in {base}",
                         "give --out a path in a directory you can write to") from None
    os.rmdir(probe)


# With restarts on and no checkpoint_every, a checkpoint every steps/20 steps: a
# restart redoes at most 5% of the run. Its cost: docs/performance.md.
RESTART_CHECKPOINTS_PER_RUN = 20


def restart_checkpoint_every(steps: int) -> int:
    """The checkpoint interval `train --max-restarts` gives a trainer that set none."""
    return max(1, -(-steps // RESTART_CHECKPOINTS_PER_RUN))
