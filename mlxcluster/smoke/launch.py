"""Command lines that start one smoke worker per host.

ring, jaccl and nccl go through MLX's own launcher (``mlx.launch --python``);
MPI goes through ``mpirun`` directly, with arguments both Open MPI 4 and 5
accept (``mlx.launch --backend mpi`` passes ``--output :raw``, which only
Open MPI 5 knows).

This module builds the minimal launch arguments smoke needs: an MLX JSON
hostfile for ``mlx.launch`` and an ``mpirun`` argument list with a
``host slots=1`` hostfile.  The full generator of hostfiles and MPI
arguments (``mlxcluster.hostfile.hostfile``) replaces these builders once it lands.

Every worker's command line carries the run id (``mlxsmoke-<hex>``): it is
the marker the driver looks for to stop every process of a run on every host.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import BackendUnavailable, InputError
from mlxcluster.facts.mpi import (
    NO_TREE_SPAWN_PARAM,
    libmpi_env,
    no_tree_spawn_args,
    require_libmpi,
    require_mpirun,
)
from mlxcluster.hostfile.hostfile import (
    JACCL_BACKENDS,
    HostEntry,
    MlxHostfile,
    load_launch_hostfile,
)
from mlxcluster.hostfile.hostfile_generate import generate_mpi
from mlxcluster.inventory.inventory import Host, Inventory, local_inventory

LOCAL_TARGETS = ("127.0.0.1",)  # the only ssh name mlx.launch runs without ssh
RING_PORT = 32323  # mlx.launch's default --starting-port
MPI_BTL_PORT = 40200  # first port of the btl_tcp range we pin (so it can be probed)
MPI_BTL_PORT_RANGE = 16
WORKER_SOURCE = Path(__file__).with_name("worker.py")
BACKENDS = ("ring", "mpi", "jaccl", "nccl")
FORWARDED_ENV_PREFIX = "MLXCLUSTER_SMOKE_"  # test hooks travel to every rank


@dataclass(frozen=True)
class RankHost:
    """Where one rank runs: its display name, ssh target, data-path IPs and python."""

    name: str
    ssh: str
    ips: tuple[str, ...]
    python: str
    rdma: tuple = ()
    ssh_options: tuple[str, ...] = ()  # e.g. ("-F", "/path/ssh_config") from the inventory
    user: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the inventory's env for this host (cluster + host)

    @property
    def is_local(self) -> bool:
        return self.ssh in LOCAL_TARGETS

    @property
    def ssh_target(self) -> str:
        """``user@host`` when a user is set (what ``ssh`` and mlx.launch take)."""
        return f"{self.user}@{self.ssh}" if self.user and not self.is_local else self.ssh


def hosts_from_inventory(inv) -> tuple[RankHost, ...]:
    """One rank per inventory host (``mlxcluster.inventory.inventory.Inventory``), in
    inventory order: its name, ssh target, data IPs, python and ssh options."""
    options: tuple[str, ...] = ("-F", os.path.expanduser(inv.ssh_config)) if inv.ssh_config else ()
    return tuple(
        RankHost(h.name, h.ssh, tuple(h.ips) or (h.ssh,), h.python,
                 ssh_options=options + (("-p", str(h.port)) if h.port else ()), user=h.user,
                 env=tuple(sorted(h.env.items())))
        for h in inv.hosts)


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


@dataclass
class LaunchPlan:
    """One run: the launcher argv, its environment, and per-rank facts the
    driver needs to watch, blame and clean up."""

    backend: str
    run_id: str
    argv: list[str]
    env: dict[str, str]
    hosts: tuple[RankHost, ...]
    run_dir: str  # on every host: worker.py and the per-rank stderr files
    data_ports: tuple[tuple[str, int], ...]  # rank -> (ip, port) a peer connects to
    files: dict[str, str] = field(default_factory=dict)  # local path -> content

    @property
    def worker_path(self) -> str:
        return f"{self.run_dir}/worker.py"

    def stderr_path(self, rank: int) -> str:
        return f"{self.run_dir}/{self.run_id}.rank{rank}.err"


def new_run_id() -> str:
    """A marker unique to one run, safe in a command line and a file name."""
    return f"mlxsmoke-{secrets.token_hex(5)}"


def local_hosts(n: int, python: str | None = None) -> tuple[RankHost, ...]:
    """``n`` ranks on this machine (mlx.launch runs 127.0.0.1 without ssh)."""
    return hosts_from_inventory(local_inventory(n, python))


def hosts_from_hostfile(path: str, python: str | None = None) -> tuple[tuple[RankHost, ...], str]:
    """Read and validate an MLX JSON hostfile (``{"backend", "envs", "hosts":
    [{"ssh", "ips", "rdma"}]}`` or a bare list of hosts) or an MPI one
    (``host slots=1``); returns the hosts and its backend."""
    hostfile = load_launch_hostfile(path)
    hosts = tuple(RankHost(h.ssh, h.ssh, h.ips, python or sys.executable, h.rdma)
                  for h in hostfile.hosts)
    return hosts, hostfile.backend


def mlx_launch_path(python: str = sys.executable) -> str:
    """The ``mlx.launch`` script beside this python, else the one on PATH."""
    beside = Path(python).parent / "mlx.launch"
    if beside.exists():
        return str(beside)
    found = shutil.which("mlx.launch")
    if not found:
        raise BackendUnavailable("mlx.launch not found", "install mlx in the python that runs mlxcluster")
    return found


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """First port of ``count`` consecutive ports free on this machine (local runs
    share one host, and other runs may hold mlx.launch's default ports)."""
    base = start + secrets.randbelow((stop - start) // 64) * 64
    for offset in range(0, stop - start, 64):
        first = start + (base - start + offset) % (stop - start - count)
        if all(port_is_free(first + i) for i in range(count)):
            return first
    raise InputError(f"no {count} consecutive free TCP ports on this machine")


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    """The test-hook variables of the driver's environment, passed to every rank."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}


def rank_env(hosts: tuple[RankHost, ...], environ: dict[str, str]) -> tuple[str, ...]:
    """"K=V" for every rank: the inventory's env, then the test hooks.

    ``mlx.launch --env`` and ``mpirun -x`` set one environment for all ranks,
    so hosts whose inventory env differs are refused."""
    envs = {h.env for h in hosts}
    if len(envs) > 1:
        names = ", ".join(h.name for h in hosts if h.env != hosts[0].env)
        raise InputError(f"the inventory gives {names} another env than {hosts[0].name}",
                         "smoke sets one environment for every rank: move env to the cluster level")
    merged = dict(hosts[0].env) if hosts else {}
    merged.update(forwarded_env(environ))
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


def single_python(hosts: tuple[RankHost, ...]) -> str:
    """mlx.launch takes one --python for every host."""
    pythons = sorted({h.python for h in hosts})
    if len(pythons) != 1:
        raise InputError(f"hosts use different pythons {pythons}; mlx.launch takes one --python",
                         "install the same venv path on every host")
    return pythons[0]


def plan_mlx_launch(backend: str, hosts: tuple[RankHost, ...], opts: WorkerOptions,
                    environ: dict[str, str], run_id: str | None = None,
                    port: int | None = None) -> LaunchPlan:
    """``mlx.launch --hostfile H --backend B --python P -- worker.py ...``."""
    run_id = run_id or new_run_id()
    run_dir = f"/tmp/{run_id}"
    if backend in JACCL_BACKENDS and any(len(h.rdma) != len(hosts) for h in hosts):
        raise InputError("jaccl needs the RDMA device matrix (an 'rdma' row per host)",
                         "use -i INVENTORY (the matrix is built from the hosts' topology) or an "
                         "MLX hostfile with rdma rows: --hostfile FILE")
    if any(not h.ips for h in hosts) and backend == "ring":
        raise InputError("the ring backend needs a data-path IP for every host",
                         'give each host "ips" in the hostfile or inventory')
    n = len(hosts)
    all_local = all(h.is_local for h in hosts)
    per_rank = max(len(h.ips) for h in hosts) * opts.connections_per_ip  # ports per rank
    port = port or (free_port_block(n * per_rank) if all_local else RING_PORT)
    hostfile = MlxHostfile(backend, (), tuple(HostEntry(h.ssh_target, h.ips, h.rdma)
                                              for h in hosts))
    hostfile_path = f"{run_dir}/hostfile.json"
    launcher_python = sys.executable
    env_args = [f"--env={e}" for e in rank_env(hosts, environ)]
    argv = [mlx_launch_path(launcher_python), "--hostfile", hostfile_path, "--backend", backend,
            "--python", single_python(hosts), "--starting-port", str(port), "--cwd", "/tmp",
            *(["--connections-per-ip", str(opts.connections_per_ip)]
              if opts.connections_per_ip > 1 else []),
            *env_args, "--", f"{run_dir}/worker.py",
            # jaccl-ring is jaccl inside the ranks (mlx.launch sets MLX_JACCL_RING=1)
            *worker_args("jaccl" if backend in JACCL_BACKENDS else backend, n, run_id, run_dir,
                         opts)]
    env = dict(environ)
    env.pop("MLX_HOSTFILE", None)
    env.pop("MLX_RANK", None)
    # mlx.launch numbers ports rank by rank, IP by IP, connection by connection.
    firsts, next_port = [], port
    for h in hosts:
        firsts.append(next_port)
        next_port += max(len(h.ips), 1) * opts.connections_per_ip
    ports = tuple((h.ips[0] if h.ips else h.ssh, firsts[r]) for r, h in enumerate(hosts))
    return LaunchPlan(backend, run_id, argv, env, hosts, run_dir, ports,
                      {hostfile_path: hostfile.dumps()})


def inventory_of(hosts: tuple[RankHost, ...]) -> Inventory:
    """The ranks as an inventory, for the shared hostfile generator."""
    return Inventory(cluster="smoke", python=hosts[0].python, hosts=tuple(
        Host(h.name, h.ssh, h.ips, h.user, h.python) for h in hosts))


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


def plan_mpirun(hosts: tuple[RankHost, ...], opts: WorkerOptions, environ: dict[str, str],
                run_id: str | None = None, mpirun: str | None = None,
                is_root: bool | None = None, tcp_links: int = 4,
                mpi_args: tuple[str, ...] = ()) -> LaunchPlan:
    """``mpirun --hostfile H -np N --mca btl tcp,self ... python worker.py ...``;
    ``mpi_args`` (already split) come last before the program, as the user gave them."""
    run_id = run_id or new_run_id()
    run_dir = f"/tmp/{run_id}"
    mpirun = mpirun or require_mpirun()
    libmpi = require_libmpi(mpirun)
    prefix = str(Path(mpirun).resolve().parent.parent)
    n = len(hosts)
    envs = rank_env(hosts, environ)
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
            *mca, *mpi_args, hosts[0].python, f"{run_dir}/worker.py",
            *worker_args("mpi", n, run_id, run_dir, opts)]
    env = dict(environ)
    if root:
        # Open MPI 5's prterun also reads these; harmless on Open MPI 4.
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ports = tuple((h.ips[0] if h.ips else h.ssh, MPI_BTL_PORT) for h in hosts)
    return LaunchPlan("mpi", run_id, argv, env, hosts, run_dir, ports, {hostfile_path: hostfile})


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
