"""Can a backend run on these hosts at all?  Asked before launching, so that
jaccl on Linux or nccl without CUDA is a clear "unavailable: <reason>"
instead of a crash or a silent group of 1.

* ring: always (TCP).
* mpi: ``mpirun`` and its libmpi found on this machine.
* jaccl: every host runs macOS 26.2 or later, lists ``rdma_*`` devices in
  ``ibv_devices``, and has a Thunderbolt link faster than 40 Gb/s (rdma
  devices also exist on TB4 links, where JACCL crashes).
* nccl: every host's python sees CUDA (``mx.cuda.is_available()``).

The parsers are pure functions over the commands' output; tests feed them
real captures from Macs.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcluster.errors import MlxclusterError
from mlxcluster.mpi import require_libmpi, require_mpirun
from mlxcluster.smoke import remote
from mlxcluster.smoke.launch import RankHost

JACCL_MIN_MACOS = (26, 2)
TB5_MIN_GBPS = 40.0  # strictly above: TB4 links run at 40 Gb/s
SECTION = "---mlxsmoke-section---"

FACTS_SCRIPT = (
    f"uname -s; echo {SECTION}; sw_vers 2>/dev/null; echo {SECTION}; "
    f"ibv_devices 2>/dev/null; echo {SECTION}; "
    "system_profiler SPThunderboltDataType -json 2>/dev/null; true"
)


@dataclass(frozen=True)
class HostFacts:
    """What the jaccl preflight needs to know of one host."""

    host: str
    system: str  # uname -s: Darwin, Linux
    macos: tuple[int, ...] | None
    rdma_devices: tuple[str, ...]
    tb_link_gbps: float | None  # fastest current Thunderbolt link, None if none


def parse_sw_vers(text: str) -> tuple[int, ...] | None:
    """``ProductVersion:<tabs>26.4`` -> (26, 4); None when absent (not macOS)."""
    m = re.search(r"^ProductVersion:\s*([\d.]+)", text, re.MULTILINE)
    return tuple(int(p) for p in m.group(1).split(".") if p) if m else None


def parse_ibv_devices(text: str) -> tuple[str, ...]:
    """Device names listed under ``ibv_devices``' header (none when RDMA is off)."""
    names = []
    for line in text.splitlines():
        first = line.split()[0] if line.split() else ""
        if first and first not in ("device", "------") and not first.startswith("-"):
            names.append(first)
    return tuple(names)


def parse_tb_link_gbps(text: str) -> float | None:
    """Fastest current link speed in ``system_profiler SPThunderboltDataType
    -json`` (``"current_speed_key": "80 Gb/s"``; the "Up to ..." port ratings
    are capabilities, not links)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    speeds: list[float] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "current_speed_key" and isinstance(value, str):
                    m = re.fullmatch(r"\s*([\d.]+)\s*Gb/s\s*", value)
                    if m:
                        speeds.append(float(m.group(1)))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return max(speeds) if speeds else None


def parse_facts(host: str, output: str) -> HostFacts:
    """Split FACTS_SCRIPT's output into its sections and parse each."""
    parts = output.split(SECTION)
    parts += [""] * (4 - len(parts))
    return HostFacts(host, parts[0].strip(), parse_sw_vers(parts[1]),
                     parse_ibv_devices(parts[2]), parse_tb_link_gbps(parts[3]))


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


Runner = Callable[[RankHost, str], remote.HostResult]


def distinct_hosts(hosts: Sequence[RankHost]) -> list[RankHost]:
    seen: dict[str, RankHost] = {}
    for h in hosts:
        seen.setdefault(h.ssh, h)
    return list(seen.values())


def unavailable_reason(backend: str, hosts: Sequence[RankHost],
                       run: Runner = lambda h, s: remote.run_script(h, s, timeout=30)) -> str | None:
    """None when ``backend`` can run on ``hosts``, else the reason it cannot."""
    if backend == "ring":
        return None
    if backend == "mpi":
        try:
            require_libmpi(require_mpirun())
        except MlxclusterError as err:
            return err.message
        return None
    targets = distinct_hosts(hosts)
    results = remote.for_each_host(targets, lambda h: run(h, FACTS_SCRIPT if backend == "jaccl"
                                                          else cuda_script(h.python)))
    unreachable = [f"{r.host} ({r.error})" for r in results if not r.ok and not r.output]
    if unreachable:
        return "cannot ask " + ", ".join(unreachable)
    if backend == "jaccl":
        problems = jaccl_problems([parse_facts(r.host, r.output) for r in results])
    elif backend == "nccl":
        problems = [f"{r.host} has no CUDA (NCCL runs on NVIDIA GPUs only)"
                    for r in results if r.output.strip().splitlines()[-1:] != ["True"]]
    else:
        return f"unknown backend {backend}"
    return "; ".join(problems) or None
