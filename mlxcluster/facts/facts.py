"""Typed host facts, parsed from a HostCapture (live or replayed).

The probe's JSON is the main source; on a replay of a capture folder that
only has raw macOS outputs (no probe.json), ``sw_vers.txt`` and
``system_profiler_SPHardwareDataType.json`` still give the OS version,
build, model, chip and memory (through ``mlxcluster.facts.parsers``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mlxcluster.facts.capture import HARDWARE, MEMINFO, SW_VERS, SYSCTL_MEMORY, HostCapture
from mlxcluster.facts.parsers.hardware import parse_hardware
from mlxcluster.facts.parsers.memory import parse_mac_memory, parse_meminfo
from mlxcluster.facts.parsers.sw_vers import parse_sw_vers


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
    machine: str | None = None  # platform.machine(): arm64, x86_64, aarch64
    libc: str | None = None  # Linux: "glibc 2.36" (which manylinux wheels run)
    model: str | None = None
    chip: str | None = None
    memory_bytes: int | None = None
    # Linux: MemAvailable when probed (what a model loaded then can have).
    memory_available_bytes: int | None = None
    # macOS: sysctl iogpu.wired_limit_mb (0 = the default share of RAM), and
    # Metal's recommended working set as mlx reports it: the limit in force.
    gpu_wired_limit_mb: int | None = None
    gpu_working_set_bytes: int | None = None
    cpu_count: int | None = None
    python: str | None = None
    python_version: str | None = None
    mlx_version: str | None = None
    mlx_import_error: str | None = None
    mlx_lm_version: str | None = None  # installed mlx-lm (not imported by the probe)
    backends: dict[str, bool | None] = field(default_factory=dict)
    # The mpirun mlxcluster starts (beside the python, else on PATH, as
    # mlxcluster/facts/mpi.py find_mpirun) and where it was found: "beside python" or "PATH".
    mpirun: str | None = None
    mpirun_found: str | None = None
    mpirun_version: str | None = None
    mpirun_is_open_mpi: bool | None = None
    # The mpirun a non-interactive shell's PATH gives (what `mpirun` and
    # mlx.launch typed by hand start); may differ from ``mpirun``.
    path_mpirun: str | None = None
    path_mpirun_version: str | None = None
    ompi_info: str | None = None
    ompi_info_version: str | None = None
    libmpi: dict[str, Any] = field(default_factory=dict)
    libmpi_candidates: tuple[dict[str, Any], ...] = ()
    # The libmpi mlxcluster sets as MLX_MPI_LIBNAME (the first candidate), with
    # "mlx_mpi_available": mx.distributed.is_available("mpi") under it; {} when none.
    launch_libmpi: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    inventory_env: dict[str, str] = field(default_factory=dict)
    path_env: str | None = None
    login_shell: str | None = None  # the user's shell, which sshd runs remote commands through
    login_shell_resolved: str | None = None  # the file it is (realpath: /bin/sh -> dash)
    blas_provider: str | None = None
    blas_mapped: tuple[str, ...] = ()
    interfaces: tuple[dict[str, Any], ...] = ()
    default_route: dict[str, Any] | None = None
    pmset: str | None = None
    firewall: str | None = None
    # macOS: socketfilterfw's raw answers about the inventory python ("path",
    # the file the kernel runs; "blockall", "listapps", "appblocked" texts).
    firewall_app: dict[str, Any] = field(default_factory=dict)
    # probe.json fields of the wrong type, read as unknown ("memory_bytes is a string ('x'), ...").
    problems: tuple[str, ...] = ()


_KINDS = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return "a number"
    return next((k for t, k in _KINDS.items() if isinstance(value, t)), type(value).__name__)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_FIREWALL_APP = {"path": str, "executable": str, "blockall": str, "listapps": str, "appblocked": str}


class _Reader:
    """Typed reads from the probe's JSON. A value of the wrong type (a string
    where the memory size belongs, a list for the hostname) reads as None, as
    if absent, and is recorded in ``problems``; nothing here raises."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def wrong(self, where: str, value: object, kind: type) -> None:
        shown = f" ({_shown(value)})" if isinstance(value, (str, int, float)) else ""
        self.problems.append(f"{where} is {_kind(value)}{shown}, expected {_KINDS[kind]}")

    def get(self, obj: dict, key: str, kind: type, where: str = "") -> Any:
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        self.wrong(where + key, value, kind)
        return None

    def positive(self, obj: dict, key: str) -> int | None:
        value = self.get(obj, key, int)
        if value is not None and value <= 0:
            self.problems.append(f"{key} is {value}, expected a positive integer")
            return None
        return value

    def section(self, obj: dict, key: str, where: str = "") -> dict:
        """A nested probe object, or {} when missing or malformed (an older or broken probe)."""
        return dict(self.get(obj, key, dict, where) or {})

    def items(self, obj: dict, key: str, where: str = "") -> list:
        return list(self.get(obj, key, list, where) or [])

    def fields(self, obj: dict, spec: dict[str, type], where: str) -> dict[str, Any]:
        """The keys of ``spec`` that hold their type (others dropped, recorded)."""
        out = {k: self.get(obj, k, t, where) for k, t in spec.items()}
        return {k: v for k, v in out.items() if v is not None}

    def mapping(self, obj: dict, key: str, kind: type, where: str = "") -> dict[str, Any]:
        """An object whose values must all be ``kind`` (env, backends)."""
        out = {}
        for k, v in self.section(obj, key, where).items():
            if v is None or isinstance(v, kind):
                out[k] = v
            else:
                self.wrong(f"{where}{key}.{k}", v, kind)
        return out

    def dicts(self, obj: dict, key: str, spec: dict[str, type], where: str = "") -> list[dict]:
        """A list of objects, each reduced to the fields of ``spec`` that hold their type."""
        out = []
        for i, item in enumerate(self.items(obj, key, where)):
            if isinstance(item, dict):
                out.append(self.fields(item, spec, f"{where}{key}[{i}]."))
            else:
                self.wrong(f"{where}{key}[{i}]", item, dict)
        return out


_LIBMPI = {"name": str, "path": str, "error": str, "library_version": str, "loadable": bool, "from_env": bool}
_LAUNCH_LIBMPI = {**_LIBMPI, "mlx_mpi_available": bool}
_INTERFACE = {"name": str, "up": bool, "addrs": list, "speed_mbps": int}
_ADDR = {"address": str, "family": str, "netmask": str}


def _interfaces(r: _Reader, p: dict) -> tuple[dict[str, Any], ...]:
    out = []
    for i, iface in enumerate(r.dicts(p, "interfaces", _INTERFACE)):
        iface["addrs"] = r.dicts(iface, "addrs", _ADDR, f"interfaces[{i}].")
        out.append(iface)
    return tuple(out)


def _memory_captures(capture: HostCapture) -> dict[str, Any]:
    """What the raw memory captures say (sysctl on macOS, /proc/meminfo on Linux)."""
    out: dict[str, Any] = {}
    mac = parse_mac_memory(capture.text(SYSCTL_MEMORY))
    if mac.memory_bytes:
        out["memory_bytes"] = mac.memory_bytes
    if mac.wired_limit_mb is not None:
        out["gpu_wired_limit_mb"] = mac.wired_limit_mb
    linux = parse_meminfo(capture.text(MEMINFO))
    if linux.total_bytes:
        out["memory_bytes"] = linux.total_bytes
    if linux.available_bytes is not None:
        out["memory_available_bytes"] = linux.available_bytes
    return out


def system_of(capture: HostCapture) -> str | None:
    """The host's kernel as ``uname -s`` names it (Darwin, Linux): the probe's
    ``os.system``, else Darwin when ``sw_vers`` was captured (a replayed
    macOS folder without probe.json); None when the captures do not say."""
    system = ((capture.probe() or {}).get("os") or {}).get("system")
    if system:
        return str(system)
    return "Darwin" if capture.text(SW_VERS) is not None else None


def host_facts(capture: HostCapture) -> HostFacts:
    """Parse one host's capture into HostFacts (missing or wrong-typed parts stay None)."""
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
    extra.update(_memory_captures(capture))
    if p is None:
        return HostFacts(name=capture.name, probed=False, **extra)
    r = _Reader()
    os_, mlx, mpi = r.section(p, "os"), r.section(p, "mlx"), r.section(p, "mpi")
    python, shell = r.section(p, "python"), r.section(p, "login_shell")
    mpirun, ompi = r.section(mpi, "mpirun", "mpi."), r.section(mpi, "ompi_info", "mpi.")
    mpirun_path = r.get(mpirun, "path", str, "mpi.mpirun.")
    launch = r.fields(r.section(mpi, "launch_libmpi", "mpi."), _LAUNCH_LIBMPI, "mpi.launch_libmpi.")
    if "path_mpirun" in mpi:
        on_path = r.section(mpi, "path_mpirun", "mpi.")
        path_mpirun = r.get(on_path, "path", str, "mpi.path_mpirun.")
        path_mpirun_version = r.get(on_path, "version", str, "mpi.path_mpirun.")
    else:  # an older probe looked on PATH only
        path_mpirun, path_mpirun_version = mpirun_path, r.get(mpirun, "version", str, "mpi.mpirun.")
    blas = r.section(mlx, "blas", "mlx.")
    gpu = r.section(mlx, "gpu", "mlx.")
    mlx_lm = r.section(r.section(p, "trainer_modules"), "mlx_lm", "trainer_modules.")
    values: dict[str, Any] = dict(
        hostname=r.get(p, "hostname", str), platform=r.get(p, "platform", str),
        os_name=r.get(os_, "name", str, "os."), os_version=r.get(os_, "version", str, "os."),
        os_build=r.get(os_, "build", str, "os."),
        machine=r.get(os_, "machine", str, "os."), libc=r.get(os_, "libc", str, "os."),
        model=r.get(p, "model", str), chip=r.get(p, "chip", str), memory_bytes=r.positive(p, "memory_bytes"),
        cpu_count=r.positive(p, "cpu_count"),
        python=r.get(python, "executable", str, "python."),
        python_version=r.get(python, "version", str, "python."),
        mlx_version=r.get(mlx, "version", str, "mlx.") if r.get(mlx, "import_ok", bool, "mlx.") else None,
        mlx_import_error=r.get(mlx, "import_error", str, "mlx."),
        mlx_lm_version=r.get(mlx_lm, "version", str, "trainer_modules.mlx_lm."),
        gpu_working_set_bytes=r.positive(gpu, "max_recommended_working_set_size"),
        backends=r.mapping(mlx, "backends", bool, "mlx."),
        mpirun=mpirun_path, mpirun_version=r.get(mpirun, "version", str, "mpi.mpirun."),
        mpirun_found=r.get(mpirun, "found", str, "mpi.mpirun.") or ("PATH" if mpirun_path else None),
        mpirun_is_open_mpi=r.get(mpirun, "open_mpi", bool, "mpi.mpirun."),
        path_mpirun=path_mpirun, path_mpirun_version=path_mpirun_version,
        ompi_info=r.get(ompi, "path", str, "mpi.ompi_info."),
        ompi_info_version=r.get(ompi, "version", str, "mpi.ompi_info."),
        libmpi=r.fields(r.section(mpi, "libmpi", "mpi."), _LIBMPI, "mpi.libmpi."),
        libmpi_candidates=tuple(c for c in r.dicts(mpi, "candidates", _LIBMPI, "mpi.") if "name" in c),
        launch_libmpi=launch if "name" in launch else {},  # a library without a name is none
        env=r.mapping(p, "env", str), inventory_env=r.mapping(p, "inventory_env", str),
        path_env=r.get(p, "path_env", str),
        login_shell=r.get(shell, "path", str, "login_shell."),
        login_shell_resolved=r.get(shell, "resolved", str, "login_shell."),
        blas_provider=r.get(blas, "sgemm_provider", str, "mlx.blas."),
        blas_mapped=tuple(m for m in r.items(blas, "mapped", "mlx.blas.") if isinstance(m, str)),
        interfaces=_interfaces(r, p),
        default_route=r.section(p, "default_route") or None,
        pmset=r.get(p, "pmset", str), firewall=r.get(p, "firewall", str),
        firewall_app=r.fields(r.section(p, "firewall_app"), _FIREWALL_APP, "firewall_app."),
    )
    # Raw captures fill what the probe left empty (e.g. a probe without sysctl).
    for k, v in extra.items():
        if values.get(k) is None:
            values[k] = v
    return HostFacts(name=capture.name, probed=True, problems=tuple(r.problems), **values)


def all_facts(captures: dict[str, HostCapture]) -> dict[str, HostFacts]:
    """HostFacts for every capture, keyed by host name."""
    return {name: host_facts(c) for name, c in captures.items()}


def facts_to_json(f: HostFacts) -> dict[str, Any]:
    """The per-host facts shown in ``doctor --json`` under ``hosts``."""
    return {
        "hostname": f.hostname, "os": f.os_name, "os_version": f.os_version, "os_build": f.os_build,
        "model": f.model, "chip": f.chip, "memory_bytes": f.memory_bytes, "cpu_count": f.cpu_count,
        "memory_available_bytes": f.memory_available_bytes, "gpu_wired_limit_mb": f.gpu_wired_limit_mb,
        "gpu_working_set_bytes": f.gpu_working_set_bytes,
        "python": f.python, "python_version": f.python_version, "mlx_version": f.mlx_version,
        "backends": f.backends, "mpirun": f.mpirun, "mpirun_found": f.mpirun_found,
        "mpirun_on_path": f.path_mpirun, "open_mpi_version": f.mpirun_version,
        "libmpi": f.libmpi.get("path") or f.libmpi.get("name"),
        "launch_libmpi": f.launch_libmpi.get("name"),
        "mlx_env": f.env, "blas": f.blas_provider,
    }
