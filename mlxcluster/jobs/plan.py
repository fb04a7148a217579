"""The launcher command of a job: one ``LaunchPlan`` (argv, environment, the
files the launcher reads) for every backend.

ring, jaccl and nccl go through MLX's own launcher (``mlx.launch --python``);
MPI goes through ``mpirun`` directly, with arguments both Open MPI 4 and 5
accept (``mlx.launch --backend mpi`` passes ``--output :raw``, which only
Open MPI 5 knows).

Two callers, one plan type: smoke plans its worker with the shared hostfile
generator's MPI arguments (data subnets, pinned btl ports it probes on a
hang); ``train`` and ``run`` plan ``plan_job`` (the interface choice left to
the user's ``--mpi-arg``: per-host /32 lists made mpirun hang or crash in the
lab). Every rank of both runs under the rank wrapper (``RANK_WRAPPER``) and
its command line carries the run id (``cleanup.marked_program``): the marker
the sweep looks for on every host.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxcluster.errors import BackendUnavailable, InputError, MlxclusterError
from mlxcluster.facts.mpi import (
    NO_TREE_SPAWN_PARAM,
    find_libmpi,
    libmpi_env,
    no_tree_spawn_args,
    require_libmpi,
    require_mpirun,
)
from mlxcluster.hostfile import jaccl_plan
from mlxcluster.hostfile.hostfile import JACCL_BACKENDS, HostEntry, MlxHostfile
from mlxcluster.hostfile.hostfile_generate import generate_mpi
from mlxcluster.inventory.inventory import Host, Inventory
from mlxcluster.jobs.cleanup import launcher_env, marked_program
from mlxcluster.jobs.hosts import RankHost, single_python
from mlxcluster.jobs.job import Job, rank_env, rank_program, split_mpi_args

RING_PORT = 32323  # mlx.launch's default --starting-port
MPI_BTL_PORT = 40200  # first port of the btl_tcp range smoke pins (so it can be probed)
MPI_BTL_PORT_RANGE = 16
RANK_WRAPPER = ("-m", "mlxcluster.jobs.rank_wrapper")


@dataclass
class LaunchPlan:
    """One run: the launcher argv, its environment, and per-rank facts the
    driver needs to watch, blame and clean up."""

    backend: str
    run_id: str
    argv: list[str]
    env: dict[str, str]
    hosts: tuple[RankHost, ...]
    run_dir: str  # here (and, for smoke, on every host): the launcher's files
    data_ports: tuple[tuple[str, int], ...]  # rank -> (ip, port) a peer connects to
    files: dict[str, str] = field(default_factory=dict)  # local path -> content
    ssh_config: str | None = None  # the inventory's, for the launcher's ssh

    def write_files(self) -> None:
        """Write the launcher's files (hostfiles) here."""
        Path(self.run_dir).mkdir(mode=0o755, parents=True, exist_ok=True)
        for path, content in self.files.items():
            Path(path).write_text(content)


def mlx_launch_path(python: str = sys.executable) -> str:
    """The ``mlx.launch`` script beside this python, else the one on PATH."""
    beside = Path(python).parent / "mlx.launch"
    if beside.exists():
        return str(beside)
    found = shutil.which("mlx.launch")
    if not found:
        raise BackendUnavailable("mlx.launch not found", "install mlx in the python that runs mlxcluster")
    return found


PORT_CLAIMS = Path(tempfile.gettempdir()) / "mlxcluster-ports"
CLAIM_S = 120.0  # a port handed out is not handed out again here for this long


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """First port of ``count`` consecutive ports free on this machine (local runs
    share one host, and other runs may hold mlx.launch's default ports).

    A port free now may be taken before its job binds it; so that two runs of
    this machine choosing at the same moment do not both take it (seen in CI:
    a server's port that was another run's ring port), each block handed out
    is claimed for ``CLAIM_S`` in ``PORT_CLAIMS`` and skipped meanwhile."""
    base = start + secrets.randbelow((stop - start) // 64) * 64
    for offset in range(0, stop - start, 64):
        first = start + (base - start + offset) % (stop - start - count)
        if all(port_is_free(first + i) for i in range(count)) and claim_port(first):
            return first
    raise InputError(f"no {count} consecutive free TCP ports on this machine")


def claim_port(port: int, now: float | None = None) -> bool:
    """Claim ``port`` for this run unless another claimed it within ``CLAIM_S``."""
    now = time.time() if now is None else now
    claim = PORT_CLAIMS / str(port)
    try:
        PORT_CLAIMS.mkdir(exist_ok=True)
        for _ in range(2):
            try:  # O_EXCL: of two runs claiming at once, one gets it
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
                os.utime(claim, (now, now))
                return True
            except FileExistsError:
                if now - claim.stat().st_mtime < CLAIM_S:
                    return False
                claim.unlink(missing_ok=True)  # an old claim: its run has bound or gone
    except OSError:
        pass  # no claims folder to share (a read-only tmp): the port check alone
    return True


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rank_ports(hosts: tuple[RankHost, ...], port: int, connections_per_ip: int = 1
               ) -> tuple[tuple[str, int], ...]:
    """Rank -> (its first IP, its first port): mlx.launch numbers ports rank by
    rank, IP by IP, connection by connection."""
    firsts, next_port = [], port
    for h in hosts:
        firsts.append(next_port)
        next_port += max(len(h.ips), 1) * connections_per_ip
    return tuple((h.ip, firsts[r]) for r, h in enumerate(hosts))


def plan_mlx_launch(backend: str, hosts: tuple[RankHost, ...], program: list[str],
                    env_vars: dict[str, str], environ: dict[str, str], run_id: str, run_dir: str,
                    *, port: int | None = None, connections_per_ip: int = 1,
                    cwd: str | None = None, ssh_config: str | None = None) -> LaunchPlan:
    """``mlx.launch --hostfile H --backend B --python P [--env K=V]... -- PROGRAM``.
    ``port`` None: a free block here when every rank is local, else 32323."""
    if backend in JACCL_BACKENDS and any(len(h.rdma) != len(hosts) for h in hosts):
        raise InputError("jaccl needs the RDMA device matrix (an 'rdma' row per host)",
                         "use -i INVENTORY (the matrix is built from the hosts' topology) or an "
                         "MLX hostfile with rdma rows: --hostfile FILE")
    if any(not h.ips for h in hosts) and backend == "ring":
        raise InputError("the ring backend needs a data-path IP for every host",
                         'give each host "ips" in the hostfile or inventory')
    if backend == "ring":
        hosts = even_ring_ips(hosts)
    n = len(hosts)
    all_local = all(h.is_local for h in hosts)
    per_rank = max(len(h.ips) for h in hosts) * connections_per_ip  # ports per rank
    port = port or (free_port_block(n * per_rank) if all_local else RING_PORT)
    hostfile = MlxHostfile(backend, (), tuple(HostEntry(h.ssh_target, h.ips, h.rdma)
                                              for h in hosts))
    hostfile_path = f"{run_dir}/hostfile.json"
    argv = [mlx_launch_path(), "--hostfile", hostfile_path, "--backend", backend,
            "--python", single_python(hosts), "--starting-port", str(port),
            *(["--cwd", cwd] if cwd else []),
            *(["--connections-per-ip", str(connections_per_ip)] if connections_per_ip > 1 else []),
            *(f"--env={k}={v}" for k, v in env_vars.items()), "--", *program]
    env = dict(environ)
    env.pop("MLX_HOSTFILE", None)
    env.pop("MLX_RANK", None)
    return LaunchPlan(backend, run_id, argv, env, hosts, run_dir,
                      rank_ports(hosts, port, connections_per_ip),
                      {hostfile_path: hostfile.dumps()}, ssh_config)


def inventory_of(hosts: tuple[RankHost, ...]) -> Inventory:
    """The ranks as an inventory, for the shared hostfile generator."""
    return Inventory(cluster="smoke", python=hosts[0].python, hosts=tuple(
        Host(h.name, h.ssh, h.ips, h.user, h.python) for h in hosts))


def even_ring_ips(hosts: tuple[RankHost, ...]) -> tuple[RankHost, ...]:
    """``hosts``, each with its first data IP only unless every host lists
    as many: MLX's ring connects to each neighbour once per IP of the host to
    its right and fails at init when the counts differ ("as many connections
    to the left as to the right"; seen with inventory/example.yaml, one host
    with Ethernet and Thunderbolt IPs). ``hostfile generate`` and train's
    ring hostfile take the first IP too."""
    if len({len(h.ips) for h in hosts}) <= 1:
        return hosts
    return tuple(replace(h, ips=h.ips[:1]) for h in hosts)


def local_mpi_args(n: int, tcp_links: int, libmpi: str, envs: tuple[str, ...]) -> tuple[str, list[str]]:
    """Hostfile and mpirun arguments for N ranks on this machine: TCP over
    loopback ('lo'; the out-of-band channel keeps Open MPI's default, it
    finds no interface when restricted to lo)."""
    args = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_links", str(tcp_links),
            "--mca", "btl_tcp_if_include", "lo"]
    for env in (*(f"{k}={v}" for k, v in libmpi_env(libmpi).items()), *envs):
        args += ["-x", env]
    return f"localhost slots={n}\n", args


def without_mca(args: list[str], user_args: tuple[str, ...]) -> list[str]:
    """``args`` less each ``--mca NAME VALUE`` that ``user_args`` also sets:
    mpirun refuses a parameter given twice with different values, and the
    user's value wins."""
    names = {user_args[i + 1] for i, a in enumerate(user_args[:-1]) if a in ("--mca", "-mca")}
    out, i = [], 0
    while i < len(args):
        if args[i] in ("--mca", "-mca") and i + 2 < len(args) and args[i + 1] in names:
            i += 3
            continue
        out.append(args[i])
        i += 1
    return out


def root_env(root: bool) -> dict[str, str]:
    """Open MPI 5's prterun also reads these to run as root; harmless on Open MPI 4."""
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if root else {}


def plan_mpirun(hosts: tuple[RankHost, ...], program: list[str], envs: tuple[str, ...],
                environ: dict[str, str], run_id: str, run_dir: str, *, mpirun: str | None = None,
                is_root: bool | None = None, tcp_links: int = 4,
                mpi_args: tuple[str, ...] = (), ssh_config: str | None = None) -> LaunchPlan:
    """``mpirun --hostfile H -np N --mca btl tcp,self ... PYTHON PROGRAM`` with
    the shared generator's arguments (``envs``: "K=V" for every rank);
    ``mpi_args`` (already split) come last before the program, as the user gave them."""
    mpirun = mpirun or require_mpirun()
    libmpi = require_libmpi(mpirun)
    prefix = str(Path(mpirun).resolve().parent.parent)
    n = len(hosts)
    if all(h.is_local for h in hosts):
        hostfile, args = local_mpi_args(n, tcp_links, libmpi, envs)
    else:
        # The shared generator (mlxcluster hostfile generate --backend mpi):
        # 'host slots=1' lines, btl/oob_tcp_if_include on the data subnets, -x env.
        files = generate_mpi(inventory_of(hosts), envs=envs, tcp_links=tcp_links, libmpi=libmpi)
        hostfile, args = files.hostfile, list(files.args)
        if not no_tree_spawn_args(mpi_args):  # the user sets tree spawn (under either name): theirs wins
            args = without_mca(args, ("--mca", NO_TREE_SPAWN_PARAM, ""))
    hostfile_path = f"{run_dir}/mpi_hosts"
    root = os.geteuid() == 0 if is_root is None else is_root
    # Smoke's own additions: root, the remote Open MPI prefix, no core binding
    # (ranks may share a host), and a pinned btl port range (probed on hangs).
    mca = without_mca(["--mca", "btl_tcp_port_min_v4", str(MPI_BTL_PORT),
                       "--mca", "btl_tcp_port_range_v4", str(MPI_BTL_PORT_RANGE), *args], mpi_args)
    argv = [mpirun, *(["--allow-run-as-root"] if root else []),
            "--hostfile", hostfile_path, "-np", str(n), "--prefix", prefix, "--bind-to", "none",
            *mca, *mpi_args, single_python(hosts), *program]
    env = {**environ, **root_env(root), **launcher_env(run_id)}
    ports = tuple((h.ip, MPI_BTL_PORT) for h in hosts)
    return LaunchPlan("mpi", run_id, argv, env, hosts, run_dir, ports, {hostfile_path: hostfile},
                      ssh_config)


# ---------------------------------------------------------------- train and run


def write_hostfile(job: Job, directory: Path) -> Path:
    """The hostfile the launcher reads: mlx.launch JSON (ring) or Open MPI lines (mpi)."""
    path = directory / hostfile_name(job)
    path.write_text(hostfile_text(job))
    return path


def hostfile_name(job: Job) -> str:
    return "mpi_hosts" if job.backend == "mpi" else "hosts.json"


def hostfile_text(job: Job) -> str:
    """ring: one data IP per rank; jaccl: the planned rdma rows, ssh as the
    launcher reaches it; mpi: ``IP slots=N`` (ranks on one host share a line)."""
    if jaccl_plan.is_jaccl(job.backend) and job.mlx_hostfile is None:
        raise MlxclusterError(f"a {job.backend} job has no rdma rows (plan_jaccl_job plans them)",
                              "report this: train and run plan JACCL before launching")
    if job.mlx_hostfile is not None:
        return replace(job.mlx_hostfile, hosts=tuple(
            replace(entry, ssh=h.ssh_target if h.user else entry.ssh)
            for entry, h in zip(job.mlx_hostfile.hosts, job.hosts, strict=True))).dumps()
    if job.backend == "ring":
        return json.dumps({"backend": "ring", "hosts": [
            {"ssh": h.ssh_target, "ips": [h.ip]} for h in job.hosts]}, indent=1)
    counts: dict[str, int] = {}
    for h in job.hosts:
        target = "localhost" if h.is_local else h.ip
        counts[target] = counts.get(target, 0) + 1
    return "".join(f"{t} slots={n}\n" for t, n in counts.items())


def launcher_argv(job: Job, hostfile: Path, program: list[str], port: int | None = None) -> list[str]:
    """mlx.launch (ring, jaccl, jaccl-ring) or mpirun (mpi) argv running
    `python PROGRAM...` on every rank (from ``port``, default the job's starting port)."""
    env = rank_env(job)
    if job.backend != "mpi":
        argv = [mlx_launch_path(), "--hostfile", str(hostfile), "--backend", job.backend,
                "--python", job.python, "--starting-port", str(port or job.starting_port)]
        if job.connections_per_ip != 1:
            argv += ["--connections-per-ip", str(job.connections_per_ip)]
        argv += [f"--env={k}={v}" for k, v in env.items()]
        return argv + ["--", *program]
    mpirun = require_mpirun()
    libmpi = find_libmpi(mpirun=mpirun)
    if libmpi:  # MLX dlopens libmpi: name the one of this mpirun, unless the inventory does
        env = {**libmpi_env(libmpi), **env}
    argv = [mpirun, "--hostfile", str(hostfile), "-np", str(len(job.hosts)),
            "--mca", "btl", "tcp,self", *no_tree_spawn_args(split_mpi_args(job)), "-x", "PATH"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if len({h.ip for h in job.hosts}) < len(job.hosts):
        # Several ranks on one host (--local): more ranks than cores is fine here.
        argv += ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    for k, v in env.items():
        argv += ["-x", f"{k}={v}"]
    # Interface choice is left to the user (--mpi-arg "--mca btl_tcp_if_include 10.0.0.0/24"):
    # per-host /32 lists made mpirun hang or crash in the lab.
    return argv + list(split_mpi_args(job)) + ["--", job.python, *program]


def plan_job(job: Job, run_id: str, run_dir: str, environ: dict[str, str]) -> LaunchPlan:
    """The plan of a train or run job: every rank runs ``python -X
    mlxcluster_run=RUN_ID -m mlxcluster.jobs.rank_wrapper PROGRAM``. Ring
    ranks all on this machine take a free block of ports, as smoke's do
    (other jobs here may hold the default ones)."""
    hostfile = Path(run_dir) / hostfile_name(job)
    program = marked_program(run_id, [*RANK_WRAPPER, *rank_program(job)])
    port = 0
    if job.backend == "ring":
        all_local = all(h.is_local for h in job.hosts)
        port = free_port_block(len(job.hosts) * job.connections_per_ip) if all_local \
            else job.starting_port
    return LaunchPlan(job.backend, run_id, launcher_argv(job, hostfile, program, port),
                      {**environ, **launcher_env(run_id)},
                      job.hosts, run_dir, tuple((h.ip, port) for h in job.hosts),
                      {str(hostfile): hostfile_text(job)}, job.ssh_config)
