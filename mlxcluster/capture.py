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

Live runs produce the same ``HostCapture`` values, so every check that needs
no live host runs identically on a replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import InputError

PROBE = "probe.json"
THUNDERBOLT = "system_profiler_SPThunderboltDataType.json"
HARDWARE = "system_profiler_SPHardwareDataType.json"
HARDWARE_PORTS = "networksetup_listallhardwareports.txt"
IFCONFIG = "ifconfig.txt"
IBV_DEVICES = "ibv_devices.txt"
SW_VERS = "sw_vers.txt"

CAPTURE_FILES: tuple[str, ...] = (
    PROBE,
    THUNDERBOLT,
    HARDWARE,
    HARDWARE_PORTS,
    IFCONFIG,
    IBV_DEVICES,
    SW_VERS,
)
# What the probe returns raw (everything but its own facts).
RAW_CAPTURE_FILES = frozenset(CAPTURE_FILES) - {PROBE}


@dataclass
class HostCapture:
    """Raw outputs seen on one host, keyed by capture file name."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    # Why the host could not be probed at all (connect failure...), else None.
    error: str | None = None

    def text(self, file_name: str) -> str | None:
        """The raw text of one capture file, or None when it was not captured."""
        return self.files.get(file_name)

    def probe(self) -> dict | None:
        """The probe's JSON facts, or None when missing or unreadable."""
        raw = self.files.get(PROBE)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def load_capture_dir(path: str | Path) -> dict[str, HostCapture]:
    """Read a capture directory; host name = folder name, sorted by name."""
    root = Path(path)
    if not root.is_dir():
        raise InputError(
            f"capture directory {root} does not exist",
            "pass the folder written by 'mlxcluster doctor --collect DIR'",
        )
    captures: dict[str, HostCapture] = {}
    for host_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        files = {}
        for name in CAPTURE_FILES:
            f = host_dir / name
            if f.is_file():
                files[name] = f.read_text(encoding="utf-8", errors="replace")
        captures[host_dir.name] = HostCapture(name=host_dir.name, files=files)
    if not any(c.files for c in captures.values()):
        raise InputError(
            f"capture directory {root} holds no capture files in any host folder",
            f"expected DIR/<host>/{PROBE} (or {THUNDERBOLT}, ...), as written by 'doctor --collect DIR'",
        )
    return captures


def save_capture_dir(captures: dict[str, HostCapture], path: str | Path) -> Path:
    """Write captures as DIR/<host>/<file>; returns the directory."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for name, capture in captures.items():
        host_dir = root / name
        host_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in capture.files.items():
            if file_name not in CAPTURE_FILES:  # a name is never a path
                raise ValueError(f"not a capture file name: {file_name!r}")
            (host_dir / file_name).write_text(text, encoding="utf-8")
        if capture.error:
            (host_dir / "error.txt").write_text(capture.error + "\n", encoding="utf-8")
    return root
