"""The host probe: one self-contained script doctor pipes to ``<python> -``.

It must run on any host's python (3.8+) with the standard library alone; it
uses psutil, netifaces and mlx only when they import. It prints ONE JSON
object on stdout and never raises: a missing command is reported as
"absent", a slow one as "timeout". Raw macOS outputs that doctor saves as
capture files travel in ``raw`` (key = capture file name) and are split out
of ``probe.json`` by the collector.

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

PROBE_VERSION = 1
COMMAND_TIMEOUT = 15.0
BACKENDS = ("ring", "mpi", "jaccl", "jaccl-ring", "nccl")

# Raw outputs saved as capture files (names match mlxcluster/capture.py).
MACOS_CAPTURES = (
    ("system_profiler_SPThunderboltDataType.json", ["system_profiler", "SPThunderboltDataType", "-json"]),
    ("system_profiler_SPHardwareDataType.json", ["system_profiler", "SPHardwareDataType", "-json"]),
    ("networksetup_listallhardwareports.txt", ["networksetup", "-listallhardwareports"]),
    ("ifconfig.txt", ["ifconfig"]),
    ("sw_vers.txt", ["sw_vers"]),
)
FIREWALL = "/usr/libexec/ApplicationFirewall/socketfilterfw"


def run_command(argv, commands, timeout=COMMAND_TIMEOUT):
    """Run argv; record ok/absent/timeout/error under its name; return stdout or None."""
    key = " ".join(argv)
    exe = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0])
    if exe is None or not os.path.exists(exe):
        commands[key] = "absent"
        return None
    try:
        proc = subprocess.run(
            [exe] + list(argv[1:]), stdin=subprocess.DEVNULL, capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        commands[key] = "timeout"
        return None
    except OSError as exc:
        commands[key] = f"error: {exc}"
        return None
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        commands[key] = "exit {}{}".format(proc.returncode, (": " + err[-1]) if err else "")
        return out or None
    commands[key] = "ok"
    return out


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
        for field, flag in (("name", "-productName"), ("version", "-productVersion"), ("build", "-buildVersion")):
            info[field] = first_line(run_command(["sw_vers", flag], commands))
    else:
        text = read_file("/etc/os-release") or ""
        values = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', text, re.M))
        info["name"] = values.get("NAME") or platform.system()
        info["version"] = values.get("VERSION_ID")
        # The kernel build string is the closest Linux analogue of a macOS build.
        info["build"] = platform.release()
    return info


def sysctl(name, commands):
    return first_line(run_command(["sysctl", "-n", name], commands))


def probe_hardware(commands):
    hw = {"cpu_count": os.cpu_count(), "model": None, "chip": None, "memory_bytes": None}
    if sys.platform == "darwin":
        hw["model"] = sysctl("hw.model", commands)
        hw["chip"] = sysctl("machdep.cpu.brand_string", commands)
        mem = sysctl("hw.memsize", commands)
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
    for tool, flag in (("mpirun", "--version"), ("ompi_info", "--version")):
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


def probe_mlx(errors):
    info = {"version": None, "import_ok": False, "import_error": None, "backends": {},
            "path": None, "blas": None}
    try:
        from importlib import metadata
        info["version"] = metadata.version("mlx")
    except Exception as exc:  # PackageNotFoundError or a broken install
        info["import_error"] = f"no mlx distribution: {exc}"
    try:
        import mlx.core as mx
    except Exception as exc:
        info["import_error"] = f"{type(exc).__name__}: {exc}"
        return info
    info["import_ok"] = True
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
    out = run_command(["route", "-n", "get", "default"], commands) or ""
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
    inventory_keys = parse_args(argv)
    commands, raw, errors = {}, {}, []
    facts = {"probe_version": PROBE_VERSION, "hostname": socket.gethostname(),
             "platform": sys.platform}
    # As a non-interactive shell sees it, minus what the inventory injected.
    facts["env"] = {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("MLX_") and k not in inventory_keys}
    inventory_env = {k: os.environ[k] for k in inventory_keys if k in os.environ}
    facts["inventory_env"] = inventory_env
    facts["path_env"] = os.environ.get("PATH")
    facts["os"] = probe_os(commands, raw)
    facts.update(probe_hardware(commands))
    facts["python"] = {"executable": sys.executable, "version": platform.python_version(),
                       "prefix": sys.prefix}
    facts["mlx"] = probe_mlx(errors)
    facts["mpi"] = probe_mpi(commands, inventory_env)
    facts["interfaces"] = probe_interfaces(errors)
    facts["default_route"] = probe_default_route(commands)
    ibv = run_command(["ibv_devices"], commands)
    if ibv is not None:
        raw["ibv_devices.txt"] = ibv
    if sys.platform == "darwin":
        for file_name, argv_ in MACOS_CAPTURES:
            out = run_command(argv_, commands)
            if out is not None:
                raw[file_name] = out
        facts["pmset"] = run_command(["pmset", "-g"], commands)
        facts["firewall"] = first_line(run_command([FIREWALL, "--getglobalstate"], commands))
    facts["commands"] = commands
    facts["errors"] = errors
    facts["raw"] = raw
    facts["duration_s"] = round(time.time() - started, 3)
    return facts


if __name__ == "__main__":
    try:
        result = main(sys.argv[1:])
    except Exception as exc:  # the probe must always print JSON
        result = {"probe_version": PROBE_VERSION, "fatal": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
