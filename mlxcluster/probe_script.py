"""The host probe: one self-contained script doctor pipes to ``<python> -``.

It must run on any host's python (3.8+) with the standard library alone; it
uses psutil, netifaces and mlx only when they import. It prints ONE JSON
object on stdout and never raises: a missing command is reported as
"absent", a slow one as "timeout". Raw macOS outputs that doctor saves as
capture files travel in ``raw`` (key = capture file name) and are split out
of ``probe.json`` by the collector. Its external commands run concurrently in
a thread pool, started before mlx is imported, so the probe takes about as
long as its slowest command rather than their sum.

Usage (doctor does this over SSH)::

    <python> - [--inventory-env KEY,KEY...] < probe_script.py

``--inventory-env`` names variables the remote command line set from the
inventory (``env K=V <python> -``), so ``env`` can report what a
non-interactive shell sets by itself.

Output, abridged::

    {"probe_version": 1, "hostname": "studio-1", "os": {"name": "macOS",
     "version": "26.2", "build": "25C56", ...}, "memory_bytes": 137438953472,
     "python": {"executable": "/opt/venv/bin/python", "version": "3.12.4"},
     "mlx": {"version": "0.32.4", "backends": {"ring": true, "mpi": false}},
     "mpi": {"mpirun": {"path": ..., "version": "5.0.11"}, "libmpi": {...}},
     "interfaces": [...], "default_route": {...}, "env": {"MLX_X": "1"},
     "commands": {"pmset -g": "ok", "ibv_devices": "absent"}, "raw": {...}}
"""

import ctypes
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PROBE_VERSION = 1
COMMAND_TIMEOUT = 15.0
# Commands run concurrently: the probe's wall time is doctor's critical path.
COMMAND_WORKERS = 8
BACKENDS = ("ring", "mpi", "jaccl", "jaccl-ring", "nccl")

# Raw outputs saved as capture files (names match mlxcluster/capture.py).
MACOS_CAPTURES = (
    ("system_profiler_SPThunderboltDataType.json", ["system_profiler", "SPThunderboltDataType", "-json"]),
    ("system_profiler_SPHardwareDataType.json", ["system_profiler", "SPHardwareDataType", "-json"]),
    ("networksetup_listallhardwareports.txt", ["networksetup", "-listallhardwareports"]),
    ("ifconfig.txt", ["ifconfig"]),
    ("sw_vers.txt", ["sw_vers"]),
)
# The other commands the probe runs; start_commands and the probe_* functions
# both read these, so what is started early is what is later asked for.
SW_VERS_FIELDS = (("name", "-productName"), ("version", "-productVersion"), ("build", "-buildVersion"))
SYSCTL_FIELDS = (("model", "hw.model"), ("chip", "machdep.cpu.brand_string"), ("memory_bytes", "hw.memsize"))
MPI_TOOLS = (("mpirun", "--version"), ("ompi_info", "--version"))
IBV_DEVICES = ["ibv_devices"]
PMSET = ["pmset", "-g"]
FIREWALL = ["/usr/libexec/ApplicationFirewall/socketfilterfw", "--getglobalstate"]
DEFAULT_ROUTE = ["route", "-n", "get", "default"]

# " ".join(argv) -> Future of execute(argv); filled and emptied by the main thread.
STARTED = {}


def execute(argv, timeout):
    """Run argv; return (status, stdout or None). Never raises."""
    exe = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0])
    if exe is None or not os.path.exists(exe):
        return "absent", None
    try:
        proc = subprocess.run(
            [exe] + list(argv[1:]), stdin=subprocess.DEVNULL, capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout", None
    except OSError as exc:
        return f"error: {exc}", None
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return "exit {}{}".format(proc.returncode, (": " + err[-1]) if err else ""), out or None
    return "ok", out


def start_commands(pool, argvs, timeout=COMMAND_TIMEOUT):
    """Start argvs on the pool now; run_command picks up their results later."""
    for argv in argvs:
        key = " ".join(argv)
        if key not in STARTED:
            STARTED[key] = pool.submit(execute, argv, timeout)


def run_command(argv, commands, timeout=COMMAND_TIMEOUT):
    """Run argv (or collect it if started); record ok/absent/timeout/error under its name; return stdout or None."""
    key = " ".join(argv)
    future = STARTED.pop(key, None)
    # The started command has its own timeout, so result() cannot wait forever.
    status, out = future.result() if future is not None else execute(argv, timeout)
    commands[key] = status
    return out


def sw_vers_argv(flag):
    return ["sw_vers", flag]


def sysctl_argv(name):
    return ["sysctl", "-n", name]


def planned_commands():
    """Every external command the probe will run on this platform, slowest first."""
    argvs = []
    if sys.platform == "darwin":
        argvs += [argv for _, argv in MACOS_CAPTURES]
        argvs += [sw_vers_argv(flag) for _, flag in SW_VERS_FIELDS]
        argvs += [sysctl_argv(name) for _, name in SYSCTL_FIELDS]
        argvs += [PMSET, FIREWALL, DEFAULT_ROUTE]
    for tool, flag in MPI_TOOLS:
        path = shutil.which(tool)
        if path:
            argvs.append([path, flag])
    argvs.append(IBV_DEVICES)
    return argvs


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return None


def read_file(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def probe_os(commands, raw):
    info = {"system": platform.system(), "release": platform.release(), "machine": platform.machine()}
    if sys.platform == "darwin":
        for field, flag in SW_VERS_FIELDS:
            info[field] = first_line(run_command(sw_vers_argv(flag), commands))
    else:
        text = read_file("/etc/os-release") or ""
        values = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', text, re.M))
        info["name"] = values.get("NAME") or platform.system()
        info["version"] = values.get("VERSION_ID")
        # The kernel build string is the closest Linux analogue of a macOS build.
        info["build"] = platform.release()
    return info


def probe_hardware(commands):
    hw = {"cpu_count": os.cpu_count(), "model": None, "chip": None, "memory_bytes": None}
    if sys.platform == "darwin":
        for field, name in SYSCTL_FIELDS:
            hw[field] = first_line(run_command(sysctl_argv(name), commands))
        mem = hw["memory_bytes"]
        hw["memory_bytes"] = int(mem) if mem and mem.isdigit() else None
    else:
        hw["model"] = first_line(read_file("/sys/devices/virtual/dmi/id/product_name"))
        match = re.search(r"^model name\s*:\s*(.+)$", read_file("/proc/cpuinfo") or "", re.M)
        hw["chip"] = match.group(1).strip() if match else platform.processor() or None
        try:
            hw["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    return hw


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(function):
    """The file a loaded function lives in (dladdr), or None."""
    try:
        libc = ctypes.CDLL(None)
        info = DlInfo()
        addr = ctypes.cast(function, ctypes.c_void_p)
        if libc.dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode("utf-8", "replace"))
    except (AttributeError, OSError, ValueError):
        pass
    return None


def probe_libmpi(name):
    """dlopen a libmpi the way MLX does and ask it for its version."""
    result = {"name": name, "loadable": False, "path": None, "library_version": None, "error": None}
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        result["error"] = str(exc)
        return result
    result["loadable"] = True
    try:
        result["path"] = library_of(lib.MPI_Init)
        # MPI_Get_library_version may be called before MPI_Init (MPI-3).
        buf = ctypes.create_string_buffer(8192)
        length = ctypes.c_int(0)
        if lib.MPI_Get_library_version(buf, ctypes.byref(length)) == 0:
            result["library_version"] = first_line(buf.value.decode("utf-8", "replace"))
    except AttributeError as exc:
        result["error"] = f"not an MPI library: {exc}"
        result["loadable"] = False
    return result


def version_in(text):
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text or "")
    return match.group(1) if match else None


def libmpi_candidates(mpirun_path):
    """libmpi files installed beside mpirun (its ../lib), best first."""
    if not mpirun_path:
        return []
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(mpirun_path))), "lib")
    names = ("libmpi.dylib", "libmpi.40.dylib") if sys.platform == "darwin" else ("libmpi.so", "libmpi.so.40", "libmpi.so.12")
    return [os.path.join(libdir, n) for n in names if os.path.exists(os.path.join(libdir, n))]


def probe_mpi(commands, inventory_env):
    mpi = {}
    for tool, flag in MPI_TOOLS:
        path = shutil.which(tool)
        entry = {"path": path, "version": None, "output": None, "open_mpi": None}
        if path:
            out = run_command([path, flag], commands)
            entry["output"] = first_line(out)
            entry["version"] = version_in(entry["output"])
            entry["open_mpi"] = "Open MPI" in (out or "")
        else:
            commands[f"{tool} {flag}"] = "absent"
        mpi[tool] = entry
    env_name = inventory_env.get("MLX_MPI_LIBNAME") or os.environ.get("MLX_MPI_LIBNAME")
    default = "libmpi.dylib" if sys.platform == "darwin" else "libmpi.so"
    libmpi = probe_libmpi(env_name or default)
    libmpi["from_env"] = bool(env_name)
    mpi["libmpi"] = libmpi
    mpi["candidates"] = [probe_libmpi(p) for p in libmpi_candidates(mpi["mpirun"]["path"])]
    return mpi


def mapped_libraries():
    """Shared libraries mapped into this process (Linux /proc/self/maps)."""
    text = read_file("/proc/self/maps") or ""
    paths = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/") and ".so" in parts[5]:
            paths.add(parts[5])
    return sorted(paths)


def probe_blas(mx):
    """Which BLAS mlx's matmul runs on (Linux): mapped libs + cblas_sgemm's owner."""
    a = mx.ones((64, 64))
    mx.eval(a @ a)
    libs = [p for p in mapped_libraries() if re.search(r"blas|lapack|mkl|accelerate", os.path.basename(p), re.I)]
    provider = None
    try:
        # A global cblas_sgemm (LD_PRELOAD) wins over mlx's bundled one.
        provider = library_of(ctypes.CDLL(None).cblas_sgemm)
    except AttributeError:
        bundled = [p for p in libs if re.search(r"libblas", os.path.basename(p))]
        provider = bundled[0] if bundled else None
    return {"mapped": libs, "sgemm_provider": provider}


def distribution_version(name):
    """The installed distribution's version, or None."""
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:  # PackageNotFoundError, or a broken install's metadata
        return None


def probe_mlx(errors):
    info = {"version": None, "import_ok": False, "import_error": None, "backends": {},
            "path": None, "blas": None}
    try:
        import mlx.core as mx
    except Exception as exc:
        info["import_error"] = f"{type(exc).__name__}: {exc}"
        # A broken install may still name its distribution's version.
        info["version"] = distribution_version("mlx")
        return info
    info["import_ok"] = True
    # The installed distribution's version is what pip and mlx.launch users
    # compare; mx.__version__ (free once imported) only when it has none.
    info["version"] = distribution_version("mlx") or getattr(mx, "__version__", None)
    info["path"] = os.path.dirname(getattr(mx, "__file__", "") or "") or None
    for backend in BACKENDS:
        try:
            info["backends"][backend] = bool(mx.distributed.is_available(backend))
        except Exception as exc:  # older mlx: no such backend name
            info["backends"][backend] = None
            errors.append(f"is_available({backend}): {exc}")
    if sys.platform.startswith("linux"):
        try:
            info["blas"] = probe_blas(mx)
        except Exception as exc:
            errors.append(f"blas: {exc}")
    return info


def probe_interfaces(errors):
    interfaces = []
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        stats = psutil.net_if_stats()
        addrs = psutil.net_if_addrs()
        for name in sorted(set(stats) | set(addrs)):
            st = stats.get(name)
            entry = {"name": name, "up": st.isup if st else None, "mtu": st.mtu if st else None,
                     "speed_mbps": (st.speed or None) if st else None, "addrs": []}
            for a in addrs.get(name, []):
                fam = {socket.AF_INET: "inet", socket.AF_INET6: "inet6"}.get(a.family)
                if fam:
                    entry["addrs"].append({"family": fam, "address": a.address.split("%")[0], "netmask": a.netmask})
            interfaces.append(entry)
        return interfaces
    try:
        import netifaces
        for name in netifaces.interfaces():
            entry = {"name": name, "up": None, "mtu": None, "speed_mbps": None, "addrs": []}
            for fam_id, fam in ((netifaces.AF_INET, "inet"), (netifaces.AF_INET6, "inet6")):
                for a in netifaces.ifaddresses(name).get(fam_id, []):
                    entry["addrs"].append({"family": fam, "address": a.get("addr", "").split("%")[0], "netmask": a.get("netmask")})
            interfaces.append(entry)
    except ImportError:
        errors.append("interfaces: neither psutil nor netifaces importable")
    except Exception as exc:
        errors.append(f"interfaces: {exc}")
    return interfaces


def probe_default_route(commands):
    if sys.platform.startswith("linux"):
        for line in (read_file("/proc/net/route") or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 2 and parts[1] == "00000000":
                gw = socket.inet_ntoa(int(parts[2], 16).to_bytes(4, "little"))
                return {"interface": parts[0], "gateway": gw}
        return None
    out = run_command(DEFAULT_ROUTE, commands) or ""
    iface = re.search(r"interface:\s*(\S+)", out)
    gw = re.search(r"gateway:\s*(\S+)", out)
    if not iface:
        return None
    return {"interface": iface.group(1), "gateway": gw.group(1) if gw else None}


def parse_args(argv):
    keys = []
    if "--inventory-env" in argv:
        i = argv.index("--inventory-env")
        if i + 1 < len(argv):
            keys = [k for k in argv[i + 1].split(",") if k]
    return keys


def main(argv):
    started = time.time()
    # Leaving the with-block joins every thread (each command has a timeout).
    with ThreadPoolExecutor(max_workers=COMMAND_WORKERS) as pool:
        # Started before mlx is imported, so they run while it loads.
        start_commands(pool, planned_commands())
        facts = collect_facts(argv)
    facts["duration_s"] = round(time.time() - started, 3)
    return facts


def collect_facts(argv):
    inventory_keys = parse_args(argv)
    commands, raw, errors = {}, {}, []
    facts = {"probe_version": PROBE_VERSION, "hostname": socket.gethostname(),
             "platform": sys.platform}
    # As a non-interactive shell sees it, minus what the inventory injected.
    facts["env"] = {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("MLX_") and k not in inventory_keys}
    inventory_env = {k: os.environ[k] for k in inventory_keys if k in os.environ}
    # probe.json goes into bug reports (doctor --collect): record the values
    # of MLX_* variables only (checks read them); others only as set.
    facts["inventory_env"] = {k: (v if k.startswith("MLX_") else "(set)") for k, v in inventory_env.items()}
    facts["path_env"] = os.environ.get("PATH")
    facts["os"] = probe_os(commands, raw)
    facts.update(probe_hardware(commands))
    facts["python"] = {"executable": sys.executable, "version": platform.python_version(),
                       "prefix": sys.prefix}
    facts["mlx"] = probe_mlx(errors)
    facts["mpi"] = probe_mpi(commands, inventory_env)
    facts["interfaces"] = probe_interfaces(errors)
    facts["default_route"] = probe_default_route(commands)
    ibv = run_command(IBV_DEVICES, commands)
    if ibv is not None:
        raw["ibv_devices.txt"] = ibv
    if sys.platform == "darwin":
        for file_name, argv_ in MACOS_CAPTURES:
            out = run_command(argv_, commands)
            if out is not None:
                raw[file_name] = out
        facts["pmset"] = run_command(PMSET, commands)
        facts["firewall"] = first_line(run_command(FIREWALL, commands))
    facts["commands"] = commands
    facts["errors"] = errors
    facts["raw"] = raw
    return facts


if __name__ == "__main__":
    try:
        result = main(sys.argv[1:])
    except Exception as exc:  # the probe must always print JSON
        result = {"probe_version": PROBE_VERSION, "fatal": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
