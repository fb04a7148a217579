"""Per-host raw captures: what doctor saw on each host, live or replayed.

A capture directory (``doctor --collect DIR`` writes it, ``doctor --from DIR``
and ``topology --from DIR`` read it) holds one folder per host, named by the
host's inventory name, with these files (any may be missing)::

    DIR/studio-1/probe.json                                   # the probe's JSON facts
    DIR/studio-1/system_profiler_SPThunderboltDataType.json
    DIR/studio-1/system_profiler_SPHardwareDataType.json
    DIR/studio-1/networksetup_listallhardwareports.txt
    DIR/studio-1/ifconfig.txt
    DIR/studio-1/ibv_devices.txt
    DIR/studio-1/sw_vers.txt
    DIR/studio-1/rdma_ctl_status.txt                          # `rdma_ctl status` (stdout and stderr)
    DIR/studio-1/ibv_devinfo.txt                              # every RDMA device's port state
    DIR/studio-1/routes.txt                                   # `netstat -rn -f inet` (macOS), `ip route` (Linux)
    DIR/studio-1/sysctl_memory.txt                            # `sysctl hw.memsize iogpu.wired_limit_mb` (macOS)
    DIR/studio-1/meminfo.txt                                  # /proc/meminfo (Linux)

plus ``error.txt`` when the host could not be probed. A folder with none of
these files, a hidden folder and ``__MACOSX`` are not hosts (``read_capture_dir``
lists them as ignored).

Live runs produce the same ``HostCapture`` values, so every check that needs
no live host runs identically on a replay. A file that is present but cannot
be read as its command's output (not JSON where JSON belongs, binary data) is
named by ``HostCapture.problems()``; the checks then treat it as missing.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import InputError, MlxclusterError

PROBE = "probe.json"
THUNDERBOLT = "system_profiler_SPThunderboltDataType.json"
HARDWARE = "system_profiler_SPHardwareDataType.json"
HARDWARE_PORTS = "networksetup_listallhardwareports.txt"
IFCONFIG = "ifconfig.txt"
IBV_DEVICES = "ibv_devices.txt"
SW_VERS = "sw_vers.txt"
RDMA_CTL = "rdma_ctl_status.txt"
IBV_DEVINFO = "ibv_devinfo.txt"
ROUTES = "routes.txt"
SYSCTL_MEMORY = "sysctl_memory.txt"
MEMINFO = "meminfo.txt"
ERROR = "error.txt"

CAPTURE_FILES: tuple[str, ...] = (
    PROBE,
    THUNDERBOLT,
    HARDWARE,
    HARDWARE_PORTS,
    IFCONFIG,
    IBV_DEVICES,
    SW_VERS,
    RDMA_CTL,
    IBV_DEVINFO,
    ROUTES,
    SYSCTL_MEMORY,
    MEMINFO,
)
# What the probe returns raw (everything but its own facts).
RAW_CAPTURE_FILES = frozenset(CAPTURE_FILES) - {PROBE}
# The JSON capture files and the list each must hold (system_profiler -json).
# The system_profiler files may also hold the plain-text form (not JSON).
JSON_LISTS = {THUNDERBOLT: "SPThunderboltDataType", HARDWARE: "SPHardwareDataType"}


def _json_kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "true/false",
            type(None): "null"}.get(type(value), "number")


def file_problem(file_name: str, text: str) -> str | None:
    """Why ``text`` cannot be the output captured as ``file_name``; None when it can."""
    if "\x00" in text or text.count("\ufffd") > max(2, len(text) // 20):
        return "binary data, not command output"
    json_form = file_name == PROBE or text.lstrip()[:1] in ("{", "[")
    if not json_form:
        return "empty" if file_name in JSON_LISTS and not text.strip() else None
    if not text.strip():
        return "empty"
    try:
        value = json.loads(text)
    except RecursionError:
        return "not valid JSON (nested too deep)"
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"a JSON {_json_kind(value)}, not an object"
    key = JSON_LISTS.get(file_name)
    if key is not None and not isinstance(value.get(key), list):
        return f"no {key} list in it"
    return None


@dataclass
class HostCapture:
    """Raw outputs seen on one host, keyed by capture file name."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    # Why the host could not be probed at all (connect failure...), else None.
    error: str | None = None
    # The folder the files were read from (a replay), else None.
    source: str | None = None

    def text(self, file_name: str) -> str | None:
        """The raw text of one capture file, or None when it was not captured."""
        return self.files.get(file_name)

    def probe(self) -> dict | None:
        """The probe's JSON facts, or None when missing or unreadable."""
        raw = self.files.get(PROBE)
        if raw is None or file_problem(PROBE, raw) is not None:
            return None
        return json.loads(raw)

    def problems(self) -> dict[str, str]:
        """Capture file name -> why it cannot be read, for each unreadable file."""
        found = {name: file_problem(name, text) for name, text in self.files.items()}
        return {name: why for name, why in found.items() if why is not None}

    def path(self, file_name: str) -> str:
        """Where a capture file was read from (its name alone on a live run)."""
        return str(Path(self.source) / file_name) if self.source else file_name


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}",
                         "make the capture folder readable (or collect it again)") from None


@dataclass
class CaptureFolder:
    """A capture directory as read: its hosts, and the folders that are not hosts."""

    captures: dict[str, HostCapture]
    ignored: dict[str, str] = field(default_factory=dict)  # folder name -> why it is not a host


def _not_a_host(folder: Path) -> str | None:
    """Why a folder of a capture directory is not a host, or None when it is one."""
    if folder.name == "__MACOSX":
        return "macOS archive metadata"
    if folder.name.startswith("."):
        return "hidden"
    if not any((folder / name).is_file() for name in (*CAPTURE_FILES, ERROR)):
        return "no capture file"
    return None


def load_capture_dir(path: str | Path) -> dict[str, HostCapture]:
    """Read a capture directory; host name = folder name, sorted by name."""
    return read_capture_dir(path).captures


def read_capture_dir(path: str | Path) -> CaptureFolder:
    """Read a capture directory: one host per folder holding a capture file (or
    ``error.txt``), sorted by name. Hidden folders, ``__MACOSX`` (added when a
    zip is unpacked on a Mac) and folders with no capture file are not hosts:
    they are listed in ``ignored``.

    Raises InputError when no host folder holds a readable capture file (or
    the error that kept its host from being probed): nothing could be checked.
    """
    root = Path(path)
    if not root.is_dir():
        raise InputError(
            f"capture directory {root} does not exist",
            "pass the folder written by 'mlxcluster doctor --collect DIR'",
        )
    captures: dict[str, HostCapture] = {}
    ignored: dict[str, str] = {}
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        why = _not_a_host(host_dir)
        if why is not None:
            ignored[host_dir.name] = why
            continue
        files = {}
        for name in CAPTURE_FILES:
            f = host_dir / name
            if f.is_file():
                files[name] = _read(f)
        error = None
        if (host_dir / ERROR).is_file():  # the host could not be probed when collected
            error = _read(host_dir / ERROR).strip() or "no reason saved"
        captures[host_dir.name] = HostCapture(name=host_dir.name, files=files, error=error,
                                              source=str(host_dir))
    if not captures:
        raise InputError(
            f"capture directory {root} holds no capture files in any host folder",
            f"expected DIR/<host>/{PROBE} (or {THUNDERBOLT}, ...), as written by 'doctor --collect DIR'",
        )
    if not any(set(c.files) - set(c.problems()) for c in captures.values()):
        why = [f"{c.path(f)}: {p}" for c in captures.values() for f, p in c.problems().items()]
        why += [f"{c.name} was not probed: {c.error}" for c in captures.values() if c.error]
        raise InputError(
            f"capture directory {root} holds no readable capture file, so nothing can be checked:\n"
            + "\n".join(f"  - {w}" for w in why),
            "collect the hosts again (mlxcluster doctor -i INVENTORY --collect NEWDIR), or replace "
            "the files named with the output of their command",
        )
    return CaptureFolder(captures, ignored)


def prepare_capture_dir(path: str | Path) -> Path:
    """Check, before any host is probed, that captures can be saved in ``path``:
    a new or empty folder (created now) that this user can write.

    A folder that already holds files is refused: writing one capture over
    another mixes their host folders, and a later replay would show hosts
    that are no longer in the cluster.
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise InputError(f"cannot save captures in {root}: it is a file, not a folder",
                         "pass a new or empty folder to --collect")
    if root.is_dir() and any(root.iterdir()):
        entries = sorted(p.name for p in root.iterdir())
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise InputError(
            f"cannot save captures in {root}: it is not empty ({shown})",
            "pass a new or empty folder to --collect (a capture written over another one mixes their host "
            "folders, and a later --from shows hosts that are gone), or delete the old capture first",
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"cannot save captures in {root}: {exc.strerror or exc}",
                         "pass a folder you can create and write to --collect") from None
    return root


def save_capture_dir(captures: dict[str, HostCapture], path: str | Path) -> Path:
    """Write captures as DIR/<host>/<file>; returns the directory.

    A write that fails (disk full, a file in the way) raises MlxclusterError
    naming the path; the caller has the captures and the report in hand.
    """
    root = Path(path)
    target = root
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name, capture in captures.items():
            host_dir = target = root / name
            host_dir.mkdir(parents=True, exist_ok=True)
            for file_name, text in capture.files.items():
                if file_name not in CAPTURE_FILES:  # a name is never a path
                    raise ValueError(f"not a capture file name: {file_name!r}")
                target = host_dir / file_name
                target.write_text(text, encoding="utf-8")
            if capture.error:
                target = host_dir / ERROR
                target.write_text(capture.error + "\n", encoding="utf-8")
    except OSError as exc:
        raise MlxclusterError(
            f"could not save the captures in {root}: {target}: {exc.strerror or exc}",
            "the report is complete; free the disk or fix what is in the way, and collect again into a new folder",
        ) from None
    return root
