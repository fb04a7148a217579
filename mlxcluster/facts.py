"""Typed host facts, parsed from a HostCapture (live or replayed).

The probe's JSON is the main source; on a replay of a capture folder that
only has raw macOS outputs (no probe.json), ``sw_vers.txt`` and
``system_profiler_SPHardwareDataType.json`` still give the OS version,
build, model, chip and memory (through ``mlxcluster.parsers``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mlxcluster.capture import HARDWARE, SW_VERS, HostCapture
from mlxcluster.parsers.hardware import parse_hardware
from mlxcluster.parsers.sw_vers import parse_sw_vers


def parse_pmset(text: str) -> dict[str, Any]:
    """``pmset -g`` -> {"sleep_minutes": int | None, "sleep_disabled": bool | None}.

    ``sleep`` (minutes of idle before system sleep, 0 = never) is read from the
    settings in use; ``SleepDisabled 1`` (pmset disablesleep) overrides it.
    """
    out: dict[str, Any] = {"sleep_minutes": None, "sleep_disabled": None}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        if fields[0] == "sleep" and fields[1].isdigit():
            out["sleep_minutes"] = int(fields[1])
        elif fields[0] == "SleepDisabled" and fields[1] in ("0", "1"):
            out["sleep_disabled"] = fields[1] == "1"
    return out


def version_tuple(version: str | None) -> tuple[int, ...]:
    """'5.0.11' -> (5, 0, 11); unparsable -> ()."""
    if not version:
        return ()
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


@dataclass(frozen=True)
class HostFacts:
    """What one host reported, typed. None = unknown (not captured)."""

    name: str
    probed: bool  # probe.json was present and readable
    hostname: str | None = None
    platform: str | None = None  # sys.platform: darwin / linux
    os_name: str | None = None
    os_version: str | None = None
    os_build: str | None = None
    model: str | None = None
    chip: str | None = None
    memory_bytes: int | None = None
    cpu_count: int | None = None
    python: str | None = None
    python_version: str | None = None
    mlx_version: str | None = None
    mlx_import_error: str | None = None
    backends: dict[str, bool | None] = field(default_factory=dict)
    mpirun: str | None = None
    mpirun_version: str | None = None
    mpirun_is_open_mpi: bool | None = None
    ompi_info: str | None = None
    ompi_info_version: str | None = None
    libmpi: dict[str, Any] = field(default_factory=dict)
    libmpi_candidates: tuple[dict[str, Any], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    inventory_env: dict[str, str] = field(default_factory=dict)
    path_env: str | None = None
    blas_provider: str | None = None
    blas_mapped: tuple[str, ...] = ()
    interfaces: tuple[dict[str, Any], ...] = ()
    default_route: dict[str, Any] | None = None
    pmset: str | None = None
    firewall: str | None = None


def _section(facts: dict, key: str) -> dict:
    """A nested probe object, or {} when missing or malformed (an older or broken probe)."""
    value = facts.get(key)
    return dict(value) if isinstance(value, dict) else {}


def _items(facts: dict, key: str) -> list:
    value = facts.get(key)
    return list(value) if isinstance(value, list) else []


def host_facts(capture: HostCapture) -> HostFacts:
    """Parse one host's capture into HostFacts (missing parts stay None)."""
    p = capture.probe()
    extra: dict[str, Any] = {}
    sw = capture.text(SW_VERS)
    if sw:
        v = parse_sw_vers(sw)
        extra.update(os_name=v.product, os_version=v.version, os_build=v.build)
    hw_text = capture.text(HARDWARE)
    if hw_text:
        hw = parse_hardware(hw_text)
        memory = int(hw.memory_gb * 2**30) if hw.memory_gb else None
        extra.update({k: v for k, v in (("model", hw.model_id), ("chip", hw.chip), ("memory_bytes", memory))
                      if v is not None})
    if p is None:
        return HostFacts(name=capture.name, probed=False, **extra)
    os_, mlx, mpi = _section(p, "os"), _section(p, "mlx"), _section(p, "mpi")
    mpirun, ompi, blas = _section(mpi, "mpirun"), _section(mpi, "ompi_info"), _section(mlx, "blas")
    values: dict[str, Any] = dict(
        hostname=p.get("hostname"), platform=p.get("platform"),
        os_name=os_.get("name"), os_version=os_.get("version"), os_build=os_.get("build"),
        model=p.get("model"), chip=p.get("chip"), memory_bytes=p.get("memory_bytes"),
        cpu_count=p.get("cpu_count"),
        python=_section(p, "python").get("executable"),
        python_version=_section(p, "python").get("version"),
        mlx_version=mlx.get("version") if mlx.get("import_ok") else None,
        mlx_import_error=mlx.get("import_error"),
        backends=_section(mlx, "backends"),
        mpirun=mpirun.get("path"), mpirun_version=mpirun.get("version"),
        mpirun_is_open_mpi=mpirun.get("open_mpi"),
        ompi_info=ompi.get("path"), ompi_info_version=ompi.get("version"),
        libmpi=_section(mpi, "libmpi"),
        libmpi_candidates=tuple(c for c in _items(mpi, "candidates") if isinstance(c, dict)),
        env=_section(p, "env"), inventory_env=_section(p, "inventory_env"),
        path_env=p.get("path_env"),
        blas_provider=blas.get("sgemm_provider"), blas_mapped=tuple(_items(blas, "mapped")),
        interfaces=tuple(i for i in _items(p, "interfaces") if isinstance(i, dict)),
        default_route=_section(p, "default_route") or None,
        pmset=p.get("pmset"), firewall=p.get("firewall"),
    )
    # Raw captures fill what the probe left empty (e.g. a probe without sysctl).
    for k, v in extra.items():
        if values.get(k) is None:
            values[k] = v
    return HostFacts(name=capture.name, probed=True, **values)


def all_facts(captures: dict[str, HostCapture]) -> dict[str, HostFacts]:
    """HostFacts for every capture, keyed by host name."""
    return {name: host_facts(c) for name, c in captures.items()}


def facts_to_json(f: HostFacts) -> dict[str, Any]:
    """The per-host facts shown in ``doctor --json`` under ``hosts``."""
    return {
        "hostname": f.hostname, "os": f.os_name, "os_version": f.os_version, "os_build": f.os_build,
        "model": f.model, "chip": f.chip, "memory_bytes": f.memory_bytes, "cpu_count": f.cpu_count,
        "python": f.python, "python_version": f.python_version, "mlx_version": f.mlx_version,
        "backends": f.backends, "mpirun": f.mpirun, "open_mpi_version": f.mpirun_version,
        "libmpi": f.libmpi.get("path") or f.libmpi.get("name"),
        "mlx_env": f.env, "blas": f.blas_provider,
    }
