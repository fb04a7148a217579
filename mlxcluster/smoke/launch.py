"""Command lines that start one smoke worker per host: the worker's own
arguments around the jobs layer's plans (``mlxcluster.jobs.plan``).

Every rank runs under the jobs layer's rank wrapper, as train's and run's
do (the run id on its command line, SIGUSR1 stacks where ``jobs.stall``
reads them, the ``@@mlxcluster-exit`` line)::

    python -X mlxcluster_run=mlxsmoke-<hex> -m mlxcluster.jobs.rank_wrapper \
        /tmp/mlxsmoke-<hex>/worker.py --backend ring --expect 3 ...

No mlxcluster is needed on the hosts: the worker and the wrapper (standard
library only, with the two ``__init__`` files of its package, which import
nothing) are copied into ``/tmp/<run id>/`` on every host (``staged_files``),
and that folder is the ranks' first ``PYTHONPATH`` entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.hostfile.hostfile import JACCL_BACKENDS
from mlxcluster.jobs import cleanup
from mlxcluster.jobs import plan as job_plan
from mlxcluster.jobs.hosts import RankHost, inventory_ssh_config
from mlxcluster.jobs.job import RANK_WRAPPER_FILES, common_env, package_root, per_rank_env
from mlxcluster.jobs.plan import LaunchPlan

WORKER_SOURCE = Path(__file__).with_name("worker.py")
BACKENDS = ("ring", "mpi", "jaccl", "nccl")
FORWARDED_ENV_PREFIX = "MLXCLUSTER_SMOKE_"  # test hooks travel to every rank


@dataclass(frozen=True)
class WorkerOptions:
    """What the workers are asked to do (passed on their command line)."""

    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16", "int32")
    lo_bytes: int = 1024
    hi_bytes: int = 16 << 20
    bench: bool = False
    check: bool = True
    warmup: int = 5
    iters: int = 20
    ops: tuple[str, ...] = ("all_sum", "all_gather", "send_recv")  # the worker's OPS
    connections_per_ip: int = 1  # ring: mlx.launch --connections-per-ip (one port each)
    soak_s: float = 0.0  # > 0: repeat the checks at random sizes this long (smoke --soak)
    seed: int = 0  # the soak's random sizes


def new_run_id() -> str:
    """A marker unique to one run, safe in a command line and a file name."""
    return cleanup.new_run_id("mlxsmoke")


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    """The test-hook variables of the driver's environment, passed to every rank."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}


def rank_env(hosts: tuple[RankHost, ...], environ: dict[str, str], run_dir: str) -> tuple[str, ...]:
    """"K=V" for every rank: the inventory's env (what differs by host
    through the rank wrapper: jobs.job.per_rank_env), then the test hooks,
    and ``run_dir`` (the staged rank wrapper) first on PYTHONPATH."""
    merged = {**common_env(hosts), **per_rank_env(hosts)}
    merged.update(forwarded_env(environ))
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (run_dir, merged.get("PYTHONPATH")) if p)
    return tuple(f"{k}={v}" for k, v in sorted(merged.items()))


def worker_args(backend: str, n: int, run_id: str, run_dir: str, opts: WorkerOptions) -> list[str]:
    """The worker's own arguments (after the script path)."""
    args = ["--backend", backend, "--expect", str(n), "--run-id", run_id,
            "--dtypes", ",".join(opts.dtypes), "--sizes", f"{opts.lo_bytes}:{opts.hi_bytes}",
            "--warmup", str(opts.warmup), "--iters", str(opts.iters), "--stderr-dir", run_dir,
            "--ops", ",".join(opts.ops)]
    if opts.bench:
        args.append("--bench")
    if not opts.check:
        args.append("--no-check")
    if opts.soak_s > 0:
        args += ["--soak", f"{opts.soak_s:g}", "--seed", str(opts.seed)]
    return args


def run_dir_of(run_id: str) -> str:
    """The run's folder, here and on every host: the worker, its stderr files."""
    return f"/tmp/{run_id}"


def worker_path(plan: LaunchPlan) -> str:
    return f"{plan.run_dir}/worker.py"


def rank_program(run_id: str, run_dir: str, worker_arguments: list[str]) -> list[str]:
    """What every rank's python runs: the rank wrapper (as ``jobs.plan.plan_job``
    runs train's and run's ranks), then the worker with its arguments."""
    return cleanup.marked_program(run_id, [*job_plan.RANK_WRAPPER, f"{run_dir}/worker.py",
                                           *worker_arguments])


def staged_files(plan: LaunchPlan, worker: str) -> dict[str, str]:
    """Path on every host -> content: the worker and the rank wrapper's package files."""
    files = {worker_path(plan): worker}
    files.update({f"{plan.run_dir}/{name}": (package_root() / name).read_text()
                  for name in RANK_WRAPPER_FILES})
    return files


def stderr_path(plan: LaunchPlan, rank: int) -> str:
    return f"{plan.run_dir}/{plan.run_id}.rank{rank}.err"


def plan_mlx_launch(backend: str, hosts: tuple[RankHost, ...], opts: WorkerOptions,
                    environ: dict[str, str], run_id: str | None = None,
                    port: int | None = None) -> LaunchPlan:
    """``mlx.launch --hostfile H --backend B --python P -- worker.py ...``."""
    run_id = run_id or new_run_id()
    run_dir = run_dir_of(run_id)
    # jaccl-ring is jaccl inside the ranks (mlx.launch sets MLX_JACCL_RING=1)
    worker_backend = "jaccl" if backend in JACCL_BACKENDS else backend
    program = rank_program(run_id, run_dir,
                           worker_args(worker_backend, len(hosts), run_id, run_dir, opts))
    env_vars = dict(e.split("=", 1) for e in rank_env(hosts, environ, run_dir))
    return job_plan.plan_mlx_launch(backend, hosts, program, env_vars, environ, run_id, run_dir,
                                    port=port, connections_per_ip=opts.connections_per_ip,
                                    cwd="/tmp", ssh_config=inventory_ssh_config(hosts))


def plan_mpirun(hosts: tuple[RankHost, ...], opts: WorkerOptions, environ: dict[str, str],
                run_id: str | None = None, mpirun: str | None = None,
                is_root: bool | None = None, tcp_links: int = 4,
                mpi_args: tuple[str, ...] = ()) -> LaunchPlan:
    """``mpirun --hostfile H -np N --mca btl tcp,self ... python worker.py ...``;
    ``mpi_args`` (already split) come last before the program, as the user gave them."""
    run_id = run_id or new_run_id()
    run_dir = run_dir_of(run_id)
    program = rank_program(run_id, run_dir, worker_args("mpi", len(hosts), run_id, run_dir, opts))
    return job_plan.plan_mpirun(hosts, program, rank_env(hosts, environ, run_dir), environ, run_id,
                                run_dir,
                                mpirun=mpirun, is_root=is_root, tcp_links=tcp_links,
                                mpi_args=mpi_args, ssh_config=inventory_ssh_config(hosts))


def plan_launch(backend: str, hosts: tuple[RankHost, ...], opts: WorkerOptions,
                environ: dict[str, str] | None = None, run_id: str | None = None,
                mpi_args: tuple[str, ...] = ()) -> LaunchPlan:
    """The launch plan for ``backend`` (mpirun for mpi, with ``mpi_args``; mlx.launch otherwise)."""
    environ = dict(os.environ if environ is None else environ)
    if backend not in (*BACKENDS, "jaccl-ring"):  # jaccl-ring: train's preflight, not smoke's menu
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    if backend == "mpi":
        return plan_mpirun(hosts, opts, environ, run_id, mpi_args=mpi_args)
    return plan_mlx_launch(backend, hosts, opts, environ, run_id)


def worker_source() -> str:
    """The worker script, copied to every host's run directory before launch."""
    return WORKER_SOURCE.read_text()
