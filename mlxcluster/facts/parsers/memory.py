"""Parse what a host says about its memory: ``sysctl`` on macOS, ``/proc/meminfo`` on Linux.

``sysctl NAME...`` prints one ``name: value`` line per name it knows (an
unknown name goes to stderr, not here); setting a value prints ``name: old ->
new``::

    hw.memsize: 34359738368
    iogpu.wired_limit_mb: 0                 # 0: Metal's default cap, not "no GPU memory"
    iogpu.wired_limit_mb: 0 -> 114688       # sudo sysctl iogpu.wired_limit_mb=114688

``/proc/meminfo`` lines are ``Name:   12345 kB``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WIRED_LIMIT = "iogpu.wired_limit_mb"
MEMSIZE = "hw.memsize"

_SYSCTL_LINE = re.compile(r"^([A-Za-z0-9_.]+):\s*(.*?)\s*$")
_MEMINFO_LINE = re.compile(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?\s*$")


def parse_sysctl(text: str | None) -> dict[str, str]:
    """``name -> value`` of every ``name: value`` line; for a ``name: old ->
    new`` line (what setting prints) the new value. A later line of the same
    name wins (a log of several settings ends with the last)."""
    values: dict[str, str] = {}
    for line in (text or "").splitlines():
        m = _SYSCTL_LINE.match(line.strip())
        if m and m.group(2):
            values[m.group(1)] = m.group(2).split("->")[-1].strip()
    return values


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True)
class MacMemory:
    """What ``sysctl hw.memsize iogpu.wired_limit_mb`` says (None: not printed)."""

    memory_bytes: int | None
    # The GPU wired-memory limit in MiB; 0 = macOS's default (a share of RAM
    # that Metal reports as its recommended working set), None = not said
    # (an older macOS has no such oid).
    wired_limit_mb: int | None


def parse_mac_memory(text: str | None) -> MacMemory:
    values = parse_sysctl(text)
    return MacMemory(_whole(values.get(MEMSIZE)), _whole(values.get(WIRED_LIMIT)))


@dataclass(frozen=True)
class Meminfo:
    total_bytes: int | None
    # What the kernel thinks can be had without swapping (MemAvailable, Linux 3.14+).
    available_bytes: int | None


def parse_meminfo(text: str | None) -> Meminfo:
    """MemTotal and MemAvailable of ``/proc/meminfo``, in bytes (it says kB: KiB)."""
    values = {}
    for line in (text or "").splitlines():
        m = _MEMINFO_LINE.match(line.strip())
        if m:
            values[m.group(1)] = int(m.group(2)) * 1024
    return Meminfo(values.get("MemTotal"), values.get("MemAvailable"))
