"""Generate hostfiles from an inventory and, when known, the topology.

- ring: hosts in ring order; each host's ``ips`` are its addresses on the
  cables to its ring predecessor (as mlx.distributed_config does), one per
  cable; without a topology, the inventory order and first data-path IP.
- jaccl / jaccl-ring: the rdma matrix from the cables (``rdma_<enX>`` of the
  local end; null on the diagonal; a list when several cables join a pair).
- nccl: inventory order, rank 0's IP is the coordinator.
- mpi: ``host slots=1`` lines plus mpirun arguments (btl_tcp_links, no tree
  spawn, the data path's subnets for btl/oob_tcp_if_include, ``-x`` of the
  environment).
Output is deterministic: same inputs, byte-identical text.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass

from mlxcluster.errors import BackendUnavailable, HostfileError, InputError
from mlxcluster.facts.mpi import libmpi_env, no_tree_spawn_args
from mlxcluster.facts.parsers.ifconfig import ipv4_addresses
from mlxcluster.hostfile.hostfile import (
    BACKENDS,
    JACCL_BACKENDS,
    HostEntry,
    MlxHostfile,
    MpiHost,
    dumps_mpi_hostfile,
    parse_mpi_hostfile,
    structure_problems,
)
from mlxcluster.hostfile.ipplan import IpPlan
from mlxcluster.inventory.inventory import abs_path_ok, env_name_ok, show
from mlxcluster.topology.topology import Topology

DEFAULT_TCP_LINKS = 4
# An interface name as Open MPI's if_include/if_exclude take it (en0, bridge0, lo).
_INTERFACE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class MpiFiles:
    hostfile: str  # "host slots=1" lines
    args: tuple[str, ...]  # mpirun arguments (everything but hostfile, -np and program)
    hosts: tuple[MpiHost, ...]

    def command(self, hostfile_path: str, program: list[str], mpirun: str = "mpirun") -> list[str]:
        """The full ready-to-run mpirun command line."""
        return [mpirun, "--hostfile", hostfile_path, "-np", str(len(self.hosts)),
                *self.args, *program]

    def args_line(self) -> str:
        return shlex.join(self.args) + "\n"


def check_env_flags(extra: tuple[str, ...]) -> None:
    """Each ``--env`` is NAME=value: NAME letters, digits and '_' (not a digit
    first), the value one line (it becomes an "envs" entry and an ``-x``)."""
    for e in extra:
        name, eq, value = e.partition("=")
        if not eq or not env_name_ok(name):
            raise InputError(f"--env {show(e)} is not NAME=value with a variable name "
                             "(letters, digits and '_', not starting with a digit)",
                             "e.g. --env MLX_METAL_FAST_SYNCH=1")
        if _CONTROL_RE.search(value):
            raise InputError(f"--env {show(e)}: the value holds a control character (a newline...)",
                             "pass a one-line value")


def check_if_include(value: str) -> None:
    """``--if-include``: comma-separated interface names or CIDR subnets, as
    Open MPI's btl/oob_tcp_if_include take them."""
    for item in value.split(","):
        if _INTERFACE_RE.match(item):
            continue
        try:
            ok = "/" in item and ipaddress.ip_network(item, strict=False) is not None
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"--if-include {show(value)}: {show(item)} is neither an interface name "
                             "nor a subnet like 192.168.0.0/16",
                             "e.g. --if-include en5,192.168.0.0/16 (comma-separated, no spaces)")


def check_mpi_libname(value: str) -> None:
    """``--mpi-libname``: the absolute path of libmpi on the hosts (its
    directory becomes LD/DYLD_LIBRARY_PATH; a relative name would make it '.')."""
    if not abs_path_ok(value):
        raise InputError(f"--mpi-libname {show(value)} is not an absolute path without spaces or shell characters",
                         "e.g. --mpi-libname /opt/venv/lib/libmpi.40.dylib")


def cluster_envs(inventory, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The cluster-wide environment as "K=V": inventory ``env`` (sorted) then ``extra``."""
    check_env_flags(extra)
    envs = [f"{k}={v}" for k, v in sorted(inventory.env.items())]
    for e in extra:
        envs = [x for x in envs if x.split("=", 1)[0] != e.split("=", 1)[0]] + [e]
    return tuple(envs)


def _works(hf: MlxHostfile, inventory) -> MlxHostfile:
    """``hf`` when ``hostfile check`` would accept it; else refuse to write it."""
    problems = structure_problems(hf)
    if problems:
        raise HostfileError(
            f"the {hf.backend} hostfile for {inventory.path or inventory.cluster} would not work "
            f"({len(problems)} problem(s)):\n" + "\n".join(f"  - {p}" for p in problems),
            "give the hosts their data-path IPs (ips: [...]) in the inventory, or pick another backend",
        )
    return hf


def _require_topology_hosts(inventory, topology: Topology) -> None:
    missing = [h.name for h in inventory.hosts if h.name not in topology.hosts]
    if missing:
        raise InputError(
            f"the topology has no capture for {', '.join(missing)}",
            "capture every inventory host (doctor --collect DIR) and pass --from DIR",
        )


def _first_ip(host) -> list[str]:
    if host.ips:
        return [host.ips[0]]
    try:
        return [str(ipaddress.ip_address(host.ssh))]
    except ValueError:
        return []


def _ring_hops(topology: Topology) -> tuple[list[str], int]:
    ring = list(topology.ring or ())
    if len(ring) < 2:
        raise BackendUnavailable(
            "no Thunderbolt ring passes through every host",
            "run 'mlxcluster topology --from DIR --dot' to see which cable is missing",
        )
    count = min(len(topology.links_between(a, b))
                for a, b in zip(ring, ring[1:] + ring[:1], strict=True))
    return ring, count


def _link_ip(topology: Topology, plan: IpPlan | None, host: str, link) -> str:
    iface = link.interface_of(host)
    if plan is not None:
        return plan.address(host, link)
    iface_info = topology.hosts[host].interfaces.get(iface or "")
    addrs = ipv4_addresses(iface_info) if iface_info else ()
    if not addrs:
        raise HostfileError(
            f"{host} has no IPv4 address on {iface or 'its Thunderbolt port'} "
            f"(cable to {link.b if host == link.a else link.a})",
            "assign addresses with --plan-ips (a /30 per cable), or capture ifconfig after setting them",
        )
    return addrs[0]


def generate_mlx_hostfile(inventory, backend: str, topology: Topology | None = None,
                          envs: tuple[str, ...] = (), plan: IpPlan | None = None) -> MlxHostfile:
    """The MLX JSON hostfile for ``backend`` (not mpi: see generate_mpi);
    HostfileError when ``hostfile check`` would reject it (nccl without an
    IP for rank 0...)."""
    return _works(_mlx_hostfile(inventory, backend, topology, envs, plan), inventory)


def _mlx_hostfile(inventory, backend: str, topology: Topology | None,
                  envs: tuple[str, ...], plan: IpPlan | None) -> MlxHostfile:
    if backend not in BACKENDS or backend == "mpi":
        raise InputError(f"backend {backend!r} has no MLX JSON hostfile here",
                         "use --backend mpi for the MPI hostfile and mpirun arguments")
    by_name = {h.name: h for h in inventory.hosts}
    if backend in JACCL_BACKENDS and topology is None:
        raise InputError(f"--backend {backend} needs the Thunderbolt topology",
                         "pass --from DIR (captures from 'doctor --collect DIR')")
    if topology is None or (backend in ("ring", "nccl") and not topology.links):
        hosts = [HostEntry(h.ssh_target, tuple(_first_ip(h))) for h in inventory.hosts]
        if backend == "ring":
            missing = [h.name for h in inventory.hosts if not _first_ip(h)]
            if missing:
                raise HostfileError(
                    f"the ring backend needs an IP per host; none for {', '.join(missing)}",
                    "add 'ips: [...]' to those hosts in the inventory",
                )
        return MlxHostfile(backend, envs, tuple(hosts))
    _require_topology_hosts(inventory, topology)
    if backend == "nccl":
        return MlxHostfile(backend, envs, tuple(HostEntry(h.ssh_target, tuple(_first_ip(h)))
                                                for h in inventory.hosts))
    if backend == "ring":
        ring, count = _ring_hops(topology)
        hosts = []
        for i, name in enumerate(ring):
            prev = ring[i - 1]
            links = topology.links_between(name, prev)[:count]
            hosts.append(HostEntry(by_name[name].ssh_target,
                                   tuple(_link_ip(topology, plan, name, lk) for lk in links)))
        return MlxHostfile("ring", envs, tuple(hosts))
    if backend == "jaccl":
        order = [h.name for h in inventory.hosts]
        if not topology.full_mesh:
            raise BackendUnavailable(
                "jaccl needs a full Thunderbolt mesh and these hosts are not fully cabled",
                "use --backend jaccl-ring, or add the missing cables (mlxcluster topology --dot)",
            )
        pairs = [(a, b) for a in order for b in order if a != b]
        count = min(len(topology.links_between(a, b)) for a, b in pairs) if pairs else 1
    else:
        order, count = _ring_hops(topology)
    n = len(order)
    hosts = []
    for i, name in enumerate(order):
        neighbours = {order[(i - 1) % n], order[(i + 1) % n]}
        row: list = []
        for other in order:
            if other == name or (backend == "jaccl-ring" and other not in neighbours):
                row.append(None)
                continue
            devs = tuple(f"rdma_{lk.interface_of(name)}"
                         for lk in rdma_links(topology, name, other)[:count])
            row.append(devs[0] if len(devs) == 1 else devs)
        hosts.append(HostEntry(by_name[name].ssh_target, tuple(_first_ip(by_name[name])), tuple(row)))
    return MlxHostfile(backend, envs, tuple(hosts))


def _down_ends(topology: Topology, link) -> list[tuple[str, str]]:
    """(host, device) of each end of ``link`` that ibv_devinfo shows PORT_DOWN."""
    ends = [(h, f"rdma_{link.interface_of(h)}") for h in (link.a, link.b)]
    return [(h, d) for h, d in ends if topology.hosts[h].port_down(d)]


def rdma_links(topology: Topology, a: str, b: str) -> list:
    """The cables between a and b, those with no PORT_DOWN end first (as
    omlx-plus's topology does): a PORT_DOWN device in the matrix fails with
    "[jaccl] Couldn't allocate protection domain". Stable otherwise."""
    links = topology.links_between(a, b)
    return sorted(links, key=lambda lk: bool(_down_ends(topology, lk)))


def rdma_port_notes(inventory, topology: Topology | None, hf: MlxHostfile) -> list[str]:
    """What the rdma matrix of ``hf`` left out or kept although ibv_devinfo
    shows it PORT_DOWN, one sentence each (empty without ibv_devinfo captures)."""
    if topology is None or hf.backend not in JACCL_BACKENDS:
        return []
    names = {h.ssh_target: h.name for h in inventory.hosts}
    order = [names.get(h.ssh, h.ssh) for h in hf.hosts]
    notes = []
    for i, entry in enumerate(hf.hosts):
        for j, dev in enumerate(entry.rdma):
            if dev is None or j <= i:
                continue
            a, b = order[i], order[j]
            used = set((dev,) if isinstance(dev, str) else dev)
            for lk in rdma_links(topology, a, b):
                down = _down_ends(topology, lk)
                if not down:
                    continue
                shown = ", ".join(f"{d} on {h}" for h, d in down)
                if f"rdma_{lk.interface_of(a)}" in used:
                    notes.append(f"{shown} (cable {a} <-> {b}) is PORT_DOWN yet in the matrix (no other "
                                 f"cable joins {a} and {b} to use instead): JACCL will fail with \"Couldn't allocate protection domain\"; reseat "
                                 "that cable (mlxcluster doctor --backend jaccl, check rdma-ports-active)")
                else:
                    notes.append(f"skipped {shown} (cable {a} <-> {b}): PORT_DOWN in ibv_devinfo")
    return notes


def _subnets(ips: list[str]) -> list[str]:
    """The /24 (IPv4) each data-path IP sits in, deduplicated, in first-seen order."""
    nets: list[str] = []
    for ip in ips:
        addr = ipaddress.ip_address(ip)
        prefix = 24 if addr.version == 4 else 64
        net = str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))
        if net not in nets:
            nets.append(net)
    return nets


def _mpi_data_path(inventory, if_include: str | None, plan: IpPlan | None) -> str | None:
    """What btl/oob_tcp_if_include should name: given, the plan's /30s, or the data IPs' /24s."""
    if if_include is not None:
        return if_include
    if plan is not None:
        return ",".join(plan.subnets())
    ips = [ip for h in inventory.hosts for ip in _first_ip(h)]
    return ",".join(_subnets(ips)) if ips else None


def _mpi_env(envs: tuple[str, ...], libmpi: str | None) -> list[str]:
    """MLX_MPI_LIBNAME and its library directory first, then the cluster env."""
    env = list(envs)
    if libmpi:
        first = libmpi_env(libmpi)
        env = [f"{k}={v}" for k, v in first.items()] + [
            e for e in env if not e.startswith(tuple(f"{k}=" for k in first))]
    return env


def generate_mpi(inventory, envs: tuple[str, ...] = (), tcp_links: int = DEFAULT_TCP_LINKS,
                 if_include: str | None = None, libmpi: str | None = None,
                 extra_args: tuple[str, ...] = (), plan: IpPlan | None = None) -> MpiFiles:
    """Open MPI hostfile (one slot per host) and the tuned mpirun arguments."""
    if tcp_links < 1:
        raise InputError(f"--tcp-links must be at least 1, got {tcp_links}")
    hosts = tuple(MpiHost(h.ssh_target, 1) for h in inventory.hosts)
    data_path = _mpi_data_path(inventory, if_include, plan)
    args: list[str] = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_links", str(tcp_links)]
    # Every daemon started from mpirun's machine: no host-to-host SSH needed (see mlxcluster/facts/mpi.py).
    args += no_tree_spawn_args(extra_args)
    if data_path:
        args += ["--mca", "btl_tcp_if_include", data_path, "--mca", "oob_tcp_if_include", data_path]
    for e in _mpi_env(envs, libmpi):
        args += ["-x", e]
    args += list(extra_args)
    return MpiFiles(dumps_mpi_hostfile(hosts), tuple(args), hosts)


def checked_mpi_files(files: MpiFiles, inventory) -> MpiFiles:
    """``files`` when ``hostfile check`` accepts its hostfile; else refuse to
    write it (smoke runs generate_mpi's output directly: Open MPI reads a
    host listed twice as two slots)."""
    try:
        parse_mpi_hostfile(files.hostfile, "<generated>")
    except HostfileError as err:
        problems = err.message.split("\n", 1)[1] if "\n" in err.message else err.message
        raise HostfileError(
            f"the MPI hostfile for {inventory.path or inventory.cluster} would not pass "
            f"'hostfile check':\n{problems}",
            "give every inventory host its own ssh target") from None
    return files


def generate_mpi_json(inventory, envs: tuple[str, ...] = (), tcp_links: int = DEFAULT_TCP_LINKS,
                      if_include: str | None = None, libmpi: str | None = None,
                      plan: IpPlan | None = None) -> MlxHostfile:
    """An MLX JSON hostfile for ``mlx.launch --backend mpi``.

    mlx.launch writes its own ``host slots=N`` file and passes ``envs`` as
    ``-x``; the TCP tuning travels as OMPI_MCA_* variables, which Open MPI
    reads in every rank (the BTL lives in the ranks).
    """
    if tcp_links < 1:
        raise InputError(f"--tcp-links must be at least 1, got {tcp_links}")
    data_path = _mpi_data_path(inventory, if_include, plan)
    env = _mpi_env(envs, libmpi) + [f"OMPI_MCA_btl_tcp_links={tcp_links}"]
    if data_path:
        env.append(f"OMPI_MCA_btl_tcp_if_include={data_path}")
    hosts = tuple(HostEntry(h.ssh_target, tuple(_first_ip(h))) for h in inventory.hosts)
    return _works(MlxHostfile("mpi", tuple(env), hosts), inventory)
