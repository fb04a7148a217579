"""JACCL planning: captures (or a user's hostfile) in; hostfile, env and verdict out.

JACCL (RDMA over Thunderbolt 5) needs what a JACCL hostfile holds: an
``rdma`` row per host naming the ``rdma_<enX>`` device on the cable to each
peer (``null`` on the diagonal; for jaccl-ring only the two ring neighbours
need one). ``smoke``, ``train`` and ``run`` all build it here, from the
hosts' live topology (doctor's probe: ``system_profiler
SPThunderboltDataType``, ``ibv_devices``, ``sw_vers``) with the generator
``mlxcluster hostfile generate --backend jaccl --from DIR`` uses, so a job
launches exactly what that command writes from the same captures.

A host cannot take part when it is not macOS 26.2+, lists no ``rdma_*``
device, has no Thunderbolt link faster than 40 Gb/s (rdma devices exist on
TB4 links too, where JACCL crashes), lacks the rdma device of a cable it
uses, or (jaccl) has no cable to some other host: JACCL needs a full mesh.
Every such reason is named per host (``JacclUnavailable``, exit 3), before
anything is launched.

The env every JACCL rank gets (``jaccl_env``), for a hostfile whose rank 0 is
``studio`` with IP 10.0.0.1 and the default starting port::

    MLX_JACCL_COORDINATOR=10.0.0.1:32323   # what mlx.launch sets too, shown

and ``MLX_METAL_FAST_SYNCH`` only when the user set it (inventory env, else
this shell): mlxcluster does not turn it on.

mlx.launch itself adds ``MLX_IBV_DEVICES`` (a temp file with the rdma matrix)
and, for jaccl-ring, ``MLX_JACCL_RING=1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mlxcluster.errors import BackendUnavailable, HostfileError
from mlxcluster.facts.capture import IBV_DEVICES, SW_VERS, HostCapture
from mlxcluster.facts.facts import system_of
from mlxcluster.facts.parsers.sw_vers import parse_sw_vers
from mlxcluster.hostfile.hostfile import JACCL_BACKENDS, MlxHostfile, structure_problems
from mlxcluster.hostfile.hostfile_generate import generate_mlx_hostfile
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.topology.topology import TB5_MIN_GBPS, Topology, build_topology

JACCL_MIN_MACOS = (26, 2)
COORDINATOR = "MLX_JACCL_COORDINATOR"
FAST_SYNCH = "MLX_METAL_FAST_SYNCH"
FIX = ("JACCL needs macOS 26.2+ on every host, RDMA enabled ('rdma_ctl enable' in Recovery, "
       "check with ibv_devices) and a Thunderbolt 5 cable between every pair of hosts; "
       "mlxcluster doctor -i INVENTORY --backend jaccl shows the details, or use "
       "--backend ring")
# MLX's JACCL docs once recommended MLX_METAL_FAST_SYNCH=1 (lower latency); it
# has also wedged GPUs in fence_wait until a reboot (ml-explore/mlx issues
# #3142, #3830), and since PR #4005 (mlx 0.32.1, the version we run) MLX's
# docs no longer pass it by default. A launcher that must never hang silently
# follows the current docs: off unless the user sets it, with a warning then.
FAST_SYNCH_WARNING = (f"{FAST_SYNCH}=1 (lower latency) has deadlocked GPUs "
                      "(ml-explore/mlx#3142) and MLX no longer sets it by default; if the job "
                      f"hangs, rerun without it ({FAST_SYNCH}=0 in your environment or the "
                      "inventory's env)")

Collect = Callable[[Inventory], dict[str, HostCapture]]


class JacclUnavailable(BackendUnavailable):
    """JACCL cannot run on these hosts; ``reasons`` maps host -> why (every reason)."""

    def __init__(self, reasons: dict[str, str], total: int, backend: str = "jaccl"):
        self.reasons = dict(reasons)
        lines = "\n".join(f"  {host}: {why}" for host, why in self.reasons.items())
        super().__init__(f"{backend} cannot run: {len(self.reasons)} of {total} host(s) cannot "
                         f"take part:\n{lines}", FIX)


def _command_status(capture: HostCapture, command: str) -> str | None:
    """What the probe said of running ``command`` (ok, absent, timeout...), if anything."""
    probe = capture.probe() or {}
    status = (probe.get("commands") or {}).get(command)
    return str(status) if status else None


def host_reasons(name: str, capture: HostCapture, topology: Topology,
                 backend: str = "jaccl") -> list[str]:
    """Every reason ``name`` cannot take part in a ``backend`` run (empty when it can).
    jaccl needs a cable to every other host; jaccl-ring leaves the ring to the
    generator (it names a missing ring)."""
    if capture.error:
        return [f"not probed: {capture.error}"]
    reasons = []
    system = system_of(capture)
    if system is not None and system != "Darwin":
        reasons.append(f"runs {system}, not macOS (JACCL needs macOS 26.2 or later)")
    elif system == "Darwin":
        version = parse_sw_vers(capture.text(SW_VERS)).version_tuple
        if version and version < JACCL_MIN_MACOS:
            reasons.append(f"runs macOS {'.'.join(map(str, version))}, JACCL needs 26.2 or later")
    host = topology.hosts[name]
    if capture.text(IBV_DEVICES) is None:
        status = _command_status(capture, "ibv_devices")
        why = {"absent": "ibv_devices not found", None: "ibv_devices not captured"}.get(
            status, f"ibv_devices: {status}")
        reasons.append(f"no rdma_* devices ({why})")
    elif not host.rdma_devices:
        reasons.append("no rdma_* devices (ibv_devices lists none: RDMA is disabled)")
    links = [lk for lk in topology.links if name in (lk.a, lk.b)]
    fast = [lk for lk in links if lk.speed_gbps is not None and lk.speed_gbps > TB5_MIN_GBPS]
    if not fast:
        seen = ", ".join(f"{lk.interface_of(name) or '?'} -> {lk.b if lk.a == name else lk.a} "
                         + (f"{lk.speed_gbps:g} Gb/s" if lk.speed_gbps is not None else "? Gb/s")
                         for lk in links)
        reasons.append(f"no Thunderbolt link faster than {TB5_MIN_GBPS:g} Gb/s"
                       + (f" ({seen})" if seen else " (no Thunderbolt cable to another host)"))
        return reasons
    for lk in links:
        other = lk.b if lk.a == name else lk.a
        if lk not in fast:
            reasons.append(f"the cable {lk.interface_of(name) or '?'} -> {other} is not "
                           f"Thunderbolt 5 ({lk.speed_gbps or '?'} Gb/s, JACCL needs > "
                           f"{TB5_MIN_GBPS:g})")
        device = f"rdma_{lk.interface_of(name)}"
        if host.rdma_devices and device not in host.rdma_devices:
            reasons.append(f"no {device} for the cable to {other} (ibv_devices lists "
                           f"{', '.join(host.rdma_devices)})")
    unlinked = [o for o in topology.names() if o != name and not topology.links_between(name, o)]
    if unlinked and backend == "jaccl":
        reasons.append(f"no Thunderbolt cable to {', '.join(unlinked)} (JACCL needs one between "
                       "every pair of hosts)")
    return reasons


def hostfile_from_captures(inventory: Inventory, captures: Mapping[str, HostCapture],
                           backend: str = "jaccl") -> MlxHostfile:
    """The ``backend`` (jaccl or jaccl-ring) hostfile for ``inventory`` from
    ``captures`` (one per host): byte for byte what ``hostfile generate
    --backend BACKEND --from DIR`` writes (no ``envs``: the inventory's env
    reaches the ranks as ``--env``). Hosts in inventory order (jaccl) or ring
    order (jaccl-ring). JacclUnavailable names every host that cannot take
    part and why; BackendUnavailable when the cables make no mesh or ring."""
    topology = build_topology({h.name: captures[h.name] for h in inventory.hosts})
    reasons = {h.name: "; ".join(why) for h in inventory.hosts
               if (why := host_reasons(h.name, captures[h.name], topology, backend))}
    if reasons:
        raise JacclUnavailable(reasons, len(inventory.hosts), backend)
    return generate_mlx_hostfile(inventory, backend, topology)


def hostfile_from_live_topology(inventory: Inventory, backend: str = "jaccl",
                                collect: Collect | None = None) -> MlxHostfile:
    """Probe every host as doctor does (``collect``: doctor_collect.collect_captures
    by default, timeouts included), then hostfile_from_captures."""
    if collect is None:
        # Imported here: it brings paramiko, which every `run`/`train` of a
        # non-jaccl job would otherwise import for nothing (start-up time).
        from mlxcluster.facts import collect as doctor_collect

        collect = doctor_collect.collect_captures
    captures = collect(inventory)
    return hostfile_from_captures(inventory, captures, backend)


def check_hostfile_rows(hostfile: MlxHostfile, backend: str) -> None:
    """A user's hostfile must carry what ``backend`` needs (an rdma row per
    host, rank 0's IP for the coordinator): HostfileError naming every
    problem, before anything is launched (mlx.launch would only say
    "malformed")."""
    problems = structure_problems(MlxHostfile(backend, hostfile.envs, hostfile.hosts))
    if problems:
        raise HostfileError(f"the hostfile cannot start {backend} ({len(problems)} problem(s)):\n"
                            + "\n".join(f"  - {p}" for p in problems),
                            f"mlxcluster hostfile generate --backend {backend} -i INVENTORY "
                            "--from DIR writes one from the hosts' captures; or use -i INVENTORY "
                            "(the rdma rows come from the live topology)")


def coordinator(hostfile: MlxHostfile, starting_port: int) -> str:
    """``ip:port`` of the JACCL coordinator: rank 0's first IP and the starting
    port, as mlx.launch computes it (so the value shown is the one used)."""
    return f"{hostfile.hosts[0].ips[0]}:{starting_port}"


def jaccl_env(hostfile: MlxHostfile, starting_port: int, job_env: Mapping[str, str],
              environ: Mapping[str, str]) -> dict[str, str]:
    """What a JACCL job adds to every rank's env: the coordinator, and
    MLX_METAL_FAST_SYNCH as the user set it (the inventory's env, else this
    shell's environment); unset, it stays unset (MLX's default, off)."""
    env = {COORDINATOR: coordinator(hostfile, starting_port)}
    fast = job_env.get(FAST_SYNCH, environ.get(FAST_SYNCH))
    if fast is not None:
        env[FAST_SYNCH] = fast
    return env


def fast_synch_warning(env: Mapping[str, str]) -> str | None:
    """The warning to show when a job's ranks run with MLX_METAL_FAST_SYNCH=1."""
    return FAST_SYNCH_WARNING if env.get(FAST_SYNCH) == "1" else None


def is_jaccl(backend: str) -> bool:
    return backend in JACCL_BACKENDS
