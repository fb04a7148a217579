"""Can a backend run on these hosts at all?  Asked before launching, so that
jaccl on Linux or nccl without CUDA is a clear "unavailable: <reason>"
instead of a crash or a silent group of 1.

* ring: always (TCP).
* mpi: ``mpirun`` and its libmpi found on this machine.
* jaccl: every host runs macOS 26.2 or later, lists ``rdma_*`` devices in
  ``ibv_devices``, and has a Thunderbolt link faster than 40 Gb/s (rdma
  devices also exist on TB4 links, where JACCL crashes).
* nccl: every host's python sees CUDA (``mx.cuda.is_available()``).
* every backend: each remote host's login shell parses the command line the
  launcher sends it over ssh (``facts.shell``: under fish mlx.launch and
  mpirun hang until --phase-timeout, measured in the lab). Asked with one ssh
  command, ``echo "$SHELL"; uname -s``, which every login shell that can
  fail this parses; jaccl reads it from the probe it runs anyway. A host
  that does not answer is left to the launch, which names it.

For jaccl every host runs doctor's probe once (``jobs.preflight.probe_capture``:
the same probe, with the ranks' python and env, that ``doctor`` and the
preflight of ``train`` and ``run`` run), and its capture is read by the
shared parsers (mlxcluster.facts) and the topology model; tests feed them
real captures from Macs. (``smoke -i`` plans jaccl from the same captures,
``smoke.jaccl``.)
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcluster.errors import MlxclusterError
from mlxcluster.facts.capture import IBV_DEVICES, SW_VERS, THUNDERBOLT, HostCapture
from mlxcluster.facts.facts import host_facts, system_of
from mlxcluster.facts.mpi import require_libmpi, require_mpirun
from mlxcluster.facts.parsers.ibv import parse_ibv_devices
from mlxcluster.facts.parsers.sw_vers import parse_sw_vers
from mlxcluster.facts.shell import launch_refusal, shell_kind
from mlxcluster.hostfile.jaccl_plan import JACCL_MIN_MACOS
from mlxcluster.jobs.hosts import (
    HostResult,
    RankHost,
    distinct_hosts,
    for_each_host,
    remote_hosts,
    run_script,
)
from mlxcluster.jobs.preflight import probe_capture
from mlxcluster.topology.topology import TB5_MIN_GBPS, build_host


@dataclass(frozen=True)
class HostFacts:
    """What the jaccl preflight needs to know of one host."""

    host: str
    system: str  # uname -s: Darwin, Linux
    macos: tuple[int, ...] | None
    rdma_devices: tuple[str, ...]
    tb_link_gbps: float | None  # fastest current Thunderbolt link, None if none


def macos_version(text: str) -> tuple[int, ...] | None:
    """``sw_vers`` output -> (26, 4); None when absent (not macOS)."""
    return parse_sw_vers(text).version_tuple or None


def rdma_devices(text: str) -> tuple[str, ...]:
    """Device names ``ibv_devices`` lists, in its order (none when RDMA is off)."""
    return tuple(d.name for d in parse_ibv_devices(text))


def fastest_tb_link(capture: HostCapture) -> float | None:
    """Fastest live Thunderbolt link in the host's ``system_profiler
    SPThunderboltDataType -json`` capture, as the topology model sees the
    host's ports (the "Up to ..." port ratings are capabilities, not links);
    None without a link."""
    ports = build_host(capture).ports
    speeds = [p.speed_gbps for p in ports if p.connected and p.speed_gbps is not None]
    return max(speeds) if speeds else None


def tb_link_gbps(text: str) -> float | None:
    """``fastest_tb_link`` of one ``system_profiler SPThunderboltDataType -json`` output."""
    return fastest_tb_link(HostCapture("host", {THUNDERBOLT: text}))


def facts_from_capture(capture: HostCapture) -> HostFacts:
    """The jaccl preflight's facts of one host, from doctor's probe capture
    (or a replayed capture folder): the kernel, ``sw_vers``, ``ibv_devices``
    and the Thunderbolt ports."""
    return HostFacts(capture.name, system_of(capture) or "",
                     macos_version(capture.text(SW_VERS) or ""),
                     rdma_devices(capture.text(IBV_DEVICES) or ""), fastest_tb_link(capture))


def jaccl_problems(facts: Sequence[HostFacts]) -> list[str]:
    """Why JACCL cannot run on these hosts (empty when it can)."""
    problems = []
    for f in facts:
        if f.system != "Darwin":
            problems.append(f"{f.host} runs {f.system or 'an unknown OS'}, not macOS")
        elif f.macos is None or f.macos < JACCL_MIN_MACOS:
            have = ".".join(map(str, f.macos)) if f.macos else "unknown"
            problems.append(f"{f.host} runs macOS {have}, JACCL needs 26.2 or later")
        elif not f.rdma_devices:
            problems.append(f"{f.host} lists no rdma devices (enable RDMA: rdma_ctl enable in Recovery)")
        elif f.tb_link_gbps is None or f.tb_link_gbps <= TB5_MIN_GBPS:
            speed = f"{f.tb_link_gbps:g} Gb/s" if f.tb_link_gbps else "no Thunderbolt link"
            problems.append(f"{f.host} has {speed}; JACCL needs Thunderbolt 5 (> 40 Gb/s)")
    return problems


def cuda_script(python: str) -> str:
    """Ask a host's python whether MLX sees CUDA."""
    return f"{shlex.quote(python)} -c 'import mlx.core as mx; print(mx.cuda.is_available())'"


Runner = Callable[[RankHost, str], HostResult]
Probe = Callable[[RankHost], HostCapture]


def probe_host(host: RankHost) -> HostCapture:
    """Doctor's probe on ``host`` with the ranks' python and the inventory's env."""
    return probe_capture(host, host.python, dict(host.env))


# The login shell and the system, in words fish, csh and every sh parse alike.
SHELL_QUESTION = 'echo "$SHELL"; uname -s'


def shell_refusal(answer: str, backend: str) -> str | None:
    """``launch_refusal`` from a host's answer to SHELL_QUESTION (None when the
    answer is not two lines: then nothing is known)."""
    lines = answer.strip().splitlines()
    if len(lines) < 2 or not lines[-2].startswith("/"):
        return None
    shell, system = lines[-2].strip(), lines[-1].strip()
    return launch_refusal(shell, shell_kind(shell, None, system.lower()), backend)


def login_shell_problems(backend: str, hosts: Sequence[RankHost], run: Runner) -> list[str]:
    """One line per remote host whose login shell cannot start a rank of ``backend``."""
    results = for_each_host(remote_hosts(hosts), lambda h: run(h, SHELL_QUESTION))
    return [f"{r.host}: {why}" for r in results
            if r.ok and (why := shell_refusal(r.output, backend))]


def unavailable_reason(backend: str, hosts: Sequence[RankHost],
                       run: Runner = lambda h, s: run_script(h, s, timeout=30),
                       probe: Probe = probe_host, shells: bool = True) -> str | None:
    """None when ``backend`` can run on ``hosts``, else the reason it cannot.
    ``shells``: ask each remote host's login shell (train and run have asked
    it already, in their own probe)."""
    if backend == "jaccl":
        captures = for_each_host(distinct_hosts(hosts), probe)
        unreachable = [f"{c.name} ({c.error})" for c in captures if c.error]
        if unreachable:
            return "cannot ask " + ", ".join(unreachable)
        problems = jaccl_problems([facts_from_capture(c) for c in captures])
        if shells:
            local = {h.name for h in hosts if h.is_local}
            problems += [f"{c.name}: {why}" for c in captures if c.name not in local
                         and (why := capture_shell_refusal(c, backend))]
        return "; ".join(problems) or None
    if backend not in ("ring", "mpi", "nccl"):
        return f"unknown backend {backend}"
    problems = login_shell_problems(backend, hosts, run) if shells else []
    if backend == "mpi" and not problems:
        try:
            require_libmpi(require_mpirun())
        except MlxclusterError as err:
            return err.message
    if backend == "nccl" and not problems:
        problems = cuda_problems(hosts, run)
    return "; ".join(problems) or None


def capture_shell_refusal(capture: HostCapture, backend: str) -> str | None:
    """``launch_refusal`` from the login shell in a host's probe capture."""
    f = host_facts(capture)
    return launch_refusal(f.login_shell,
                          shell_kind(f.login_shell, f.login_shell_resolved, f.platform), backend)


def cuda_problems(hosts: Sequence[RankHost], run: Runner) -> list[str]:
    """Hosts whose python does not see CUDA, or that could not be asked."""
    results = for_each_host(distinct_hosts(hosts), lambda h: run(h, cuda_script(h.python)))
    unreachable = [f"{r.host} ({r.error})" for r in results if not r.ok and not r.output]
    if unreachable:
        return ["cannot ask " + ", ".join(unreachable)]
    return [f"{r.host} has no CUDA (NCCL runs on NVIDIA GPUs only)"
            for r in results if r.output.strip().splitlines()[-1:] != ["True"]]
