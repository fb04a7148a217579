"""A job: one program on every rank, and how to build one from what the user gave.

``Job.program`` is what every rank's python runs: `mlxcluster run`'s script or
module, or the reference trainer as the hand-off builds it
(``mlxcluster.launch.trainer``); this layer knows no program in particular.
Every rank runs under ``mlxcluster.jobs.rank_wrapper`` with the run id on its
command line.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxcluster.errors import BackendUnavailable, InputError
from mlxcluster.hostfile import jaccl_plan
from mlxcluster.hostfile.hostfile import BACKENDS as MLX_BACKENDS
from mlxcluster.hostfile.hostfile import MlxHostfile, load_launch_hostfile
from mlxcluster.inventory.inventory import Inventory, local_inventory
from mlxcluster.jobs.hosts import RankHost, hosts_from_inventory, require_python_here
from mlxcluster.jobs.rank_wrapper import DETACH_VAR, RANK_ENV_VAR, encode_rank_envs
from reference_train.metrics import HEARTBEAT_ENV  # the protocol's one copy (no mlx)

BACKENDS = ("ring", "mpi", "jaccl", "jaccl-ring")  # what train and run launch


@dataclass(frozen=True)
class Job:
    """Everything needed to start one program on every rank."""

    hosts: tuple[RankHost, ...]
    backend: str
    python: str
    ssh_config: str | None = None
    mpi_args: tuple[str, ...] = ()
    starting_port: int = 32323
    connections_per_ip: int = 1  # ring: mlx.launch --connections-per-ip (tuned.py)
    env: dict[str, str] = field(default_factory=dict)
    # The python arguments every rank runs (after the rank wrapper):
    # ``("/abs/script.py", ARGS...)`` or ``("-m", "module", ARGS...)``.
    program: tuple[str, ...] = ()
    # The program as the user knows it, for display, when it differs from
    # what runs (the trainer's hand-off adds --progress false).
    shown_program: tuple[str, ...] | None = None
    # Modules the preflight checks every host's python imports (the trainer's
    # hand-off: reference_train.train; `run -m mlx_lm...`: mlx_lm, see
    # program_imports), and doctor's checks judge; any other `run` module is not
    # imported there: its import could do anything.
    imports: tuple[str, ...] = ()
    # How messages name the job and how to go on after it failed or stalled
    # (the trainer: "training", then resume from the last checkpoint).
    title: str = "the job"
    then: str = ""
    tag_output: bool = False  # every rank's lines start with "[R] " (rank_wrapper)
    # jaccl / jaccl-ring: the hostfile with the rdma rows, hosts in rank order (jaccl_plan)
    mlx_hostfile: MlxHostfile | None = None
    # Where every rank imports what it runs of this project (the rank wrapper,
    # reference_train): each remote host's cache folder of this version
    # (launch/code.py sends it there), then this checkout for ranks here.
    # Empty: this checkout alone (ranks on this machine only).
    code_paths: tuple[str, ...] = ()
    # --detach: the ranks go on without the machine that started them (no
    # lease: jobs.lease), keeping their output on their hosts (rank_wrapper).
    detached: bool = False


# What every rank imports of mlxcluster, as paths below package_root(): the
# rank wrapper (standard library only) and its package's two __init__ files,
# which import nothing. Smoke stages them in its run folder; train and run
# send them with reference_train (launch/code.py).
RANK_WRAPPER_FILES = ("mlxcluster/__init__.py", "mlxcluster/jobs/__init__.py",
                      "mlxcluster/jobs/rank_wrapper.py")


def package_root() -> Path:
    """The directory holding mlxcluster and reference_train here (on
    PYTHONPATH for ranks on this machine; remote hosts get a copy of what
    ranks import from it: launch/code.py)."""
    return Path(__file__).resolve().parent.parent.parent


def job_from_inventory(inv: Inventory, backend: str, mpi_args: tuple[str, ...] = ()) -> Job:
    """A job with one rank per inventory host, all with the inventory's python."""
    check_backend(backend)
    pythons = sorted({h.python for h in inv.hosts})
    if len(pythons) > 1:
        raise InputError(f"hosts use different python paths {pythons}; mlx.launch and mpirun "
                         "start the same path everywhere",
                         "install the same venv at one path on every host")
    hosts = hosts_from_inventory(inv)
    return Job(hosts=hosts, backend=backend, python=pythons[0],
               ssh_config=inv.ssh_config, mpi_args=mpi_args, env=common_env(hosts))


def job_from_hostfile(path: str | Path, backend: str | None, python: str,
                      mpi_args: tuple[str, ...] = ()) -> Job:
    """A job from an mlx.launch hostfile ({"backend": ..., "hosts": [{"ssh", "ips"}]})
    or an MPI one (``host slots=1``), validated as ``hostfile check`` does."""
    hostfile = load_launch_hostfile(path)
    backend = backend or hostfile.backend or "ring"
    check_backend(backend)
    hosts = tuple(RankHost(h.ssh, h.ssh, h.ips[:1], python) for h in hostfile.hosts)
    return Job(hosts=hosts, backend=backend, python=python, mpi_args=mpi_args, mlx_hostfile=hostfile if jaccl_plan.is_jaccl(backend) else None)


def job_local(n: int, backend: str, python: str, mpi_args: tuple[str, ...] = ()) -> Job:
    """N ranks on this machine (its python must exist here)."""
    require_python_here(python)
    return job_from_inventory(local_inventory(n, python), backend, mpi_args)


def check_backend(backend: str) -> None:
    """An unknown name is bad input (exit 2); an MLX backend train does not run
    (jaccl, jaccl-ring, nccl) is unavailable (exit 3)."""
    if backend not in MLX_BACKENDS:
        raise InputError(f"unknown backend {backend!r} (MLX's backends are "
                         f"{', '.join(MLX_BACKENDS)})",
                         "use --backend ring (TCP, always available) or mpi")
    if backend not in BACKENDS:
        raise BackendUnavailable(f"mlxcluster train and run support the {', '.join(BACKENDS)} "
                                 f"backends, not {backend!r}",
                                 "use --backend ring (TCP, always available) or mpi")


def plan_jaccl_job(job: Job, inventory: Inventory | None, environ: dict[str, str],
                   collect: jaccl_plan.Collect | None = None) -> Job:
    """A jaccl / jaccl-ring job with its rdma rows, ranks in the hostfile's
    order and the JACCL env (jaccl_plan.jaccl_env); other jobs unchanged.

    From an inventory the rows come from the hosts' live topology (probed
    now, before anything runs: JacclUnavailable names every host that cannot
    take part); from a hostfile, its own rows are checked."""
    if not jaccl_plan.is_jaccl(job.backend):
        return job
    if inventory is not None and not all(h.is_local for h in job.hosts):
        hostfile = jaccl_plan.hostfile_from_live_topology(inventory, job.backend, collect)
    elif job.mlx_hostfile is not None:
        hostfile = replace(job.mlx_hostfile, backend=job.backend)  # --backend wins over the file's
        jaccl_plan.check_hostfile_rows(hostfile, job.backend)
    else:
        raise BackendUnavailable(f"{job.backend} runs across Macs joined by Thunderbolt 5 "
                                 "cables, not as several ranks on this machine",
                                 "give -i INVENTORY (the RDMA rows come from the hosts' "
                                 "topology) or --hostfile FILE with rdma rows; or --backend ring")
    by_ssh = {h.ssh: h for h in job.hosts}
    hosts = tuple(by_ssh[entry.ssh] for entry in hostfile.hosts)  # jaccl-ring: ring order
    env = {**job.env, **jaccl_plan.jaccl_env(hostfile, job.starting_port, job.env, environ)}
    return replace(job, hosts=hosts, env=env, mlx_hostfile=hostfile)


# Read by the dynamic loader when a process starts, before the rank wrapper
# could set them: a host's own value would never take effect.
LOADER_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "DYLD_LIBRARY_PATH", "DYLD_FALLBACK_LIBRARY_PATH",
               "DYLD_INSERT_LIBRARIES", "DYLD_FRAMEWORK_PATH", "PYTHONPATH", "PYTHONHOME")


def common_env(hosts) -> dict[str, str]:
    """The variables every host's inventory env gives the same value (what
    the launcher sets for all); the others go per rank (``per_rank_env``)."""
    envs = [dict(h.env) for h in hosts]
    if not envs:
        return {}
    return {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}


def per_rank_env(hosts) -> dict[str, str]:
    """RANK_ENV_VAR for ranks on ``hosts`` (rank order) whose inventory env
    differs by host, else nothing. InputError for a loader variable that
    differs: it is read before the rank wrapper runs."""
    common = common_env(hosts)
    own = [{k: v for k, v in dict(h.env).items() if common.get(k) != v} for h in hosts]
    if not any(own):
        return {}
    differ = sorted({k for e in own for k in e if k in LOADER_VARS})
    if differ:
        names = ", ".join(h.name for h, e in zip(hosts, own, strict=True) if set(e) & set(differ))
        raise InputError(f"{', '.join(differ)} differs between hosts ({names}): the loader reads it "
                         "when a rank starts, before a host's own value could be set",
                         "give it one value for every host (the top-level env), e.g. the same venv path")
    return {RANK_ENV_VAR: encode_rank_envs(own)}


def rank_env(job: Job) -> dict[str, str]:
    """Variables every rank gets: PYTHONPATH to reference_train (and
    mlxcluster.jobs.rank_wrapper: ``code_paths``, else this checkout) ahead of
    the job's own PYTHONPATH, heartbeat lines on, rank-tagged output for
    ``tag_output``, plus the job's env, and each host's own env (per_rank_env)."""
    env = {HEARTBEAT_ENV: "1", **job.env, **per_rank_env(job.hosts)}
    code = job.code_paths or (str(package_root()),)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*code, job.env.get("PYTHONPATH")) if p)
    if job.tag_output:
        env["MLXCLUSTER_TAG_OUTPUT"] = "1"
    if job.detached:
        env[DETACH_VAR] = "1"
    return env


def rank_program(job: Job) -> tuple[str, ...]:
    """What each rank's python runs after the rank wrapper."""
    return job.program


def script_path(job: Job) -> str | None:
    """The script file a job starts (None for a module)."""
    if job.program and job.program[0] != "-m":
        return job.program[0]
    return None


# Packages a `run -m` module may be from that the preflight imports on every
# host (their import only imports) and a doctor check judges: mlx_lm
# (mlx-lm-version: installed, one version everywhere).
CHECKED_PACKAGES = ("mlx_lm",)


def program_imports(program: tuple[str, ...]) -> tuple[str, ...]:
    """What the preflight asks of every host for ``program`` (``Job.program``):
    the top package of ``-m MODULE`` when it is one of CHECKED_PACKAGES
    (``-m mlx_lm.generate`` -> ``("mlx_lm",)``), else nothing."""
    if len(program) > 1 and program[0] == "-m" and program[1].split(".")[0] in CHECKED_PACKAGES:
        return (program[1].split(".")[0],)
    return ()


def program_command(job: Job) -> str:
    """The command line every rank runs, for display."""
    shown = job.program if job.shown_program is None else job.shown_program
    return shlex.join([job.python, *shown])


def launcher_name(job: Job) -> str:
    """What starts the ranks of ``job``, as the user knows it."""
    return "mpirun" if job.backend == "mpi" else "mlx.launch"


def split_mpi_args(job: Job) -> tuple[str, ...]:
    """The user's --mpi-arg values as mpirun arguments ("--mca a b" is three)."""
    return tuple(part for arg in job.mpi_args for part in shlex.split(arg))
