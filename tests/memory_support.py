"""Hosts' memory as doctor captures it, for the split-check tests: the real
captured outputs' file names (tests/fixtures/macos/SOURCES.md) and a Mac's
capture made of one of them and the probe's mlx figures."""

from __future__ import annotations

import json

from mlxcluster.facts.capture import PROBE, SYSCTL_MEMORY, HostCapture

MINI_MEMSIZE = "sysctl_hw_model_hw_memsize_m2pro_mini_mac14_12_32gb_macos26.5.1.txt"
MINI_WIRED = "sysctl_iogpu_wired_limit_mb_default_0_m2pro_mini_mac14_12_32gb_macos26.5.1.txt"
STUDIO_WIRED = "sysctl_iogpu_wired_limit_mb_118000_dynamic_lwm_m4max_studio_mac16_9_128gb.txt"
SET_LOG = "sysctl_set_iogpu_wired_limit_mb_114688_m5max_128gb_launchdaemon_log.txt"
MEMINFO_FILE = "proc_meminfo_linux_dev_box_debian12_24gb.txt"
# Metal's recommended working set, measured (SOURCES.md): 21845.34 MB on 32 GB Macs, 107.52 GiB on 128 GiB.
WORKING_SET_32GB = 22906503168
WORKING_SET_128GB = 115448725504


def mini_sysctl(fixtures) -> str:
    """What the probe's `sysctl hw.memsize iogpu.wired_limit_mb` prints on the captured 32 GB Mac mini."""
    return (fixtures / MINI_MEMSIZE).read_text() + (fixtures / MINI_WIRED).read_text()


def mac_capture(name: str, sysctl: str, working_set: int | None = None, memory: int | None = None,
                python: str = "/usr/bin/python3") -> HostCapture:
    """A Mac's capture: its sysctl output, and the probe's mlx (with ``working_set``, what
    mlx reports as max_recommended_working_set_size) and mlx-lm 0.32.2."""
    probe = {"hostname": name, "platform": "darwin", "python": {"executable": python},
             "mlx": {"import_ok": True, "version": "0.32.4"},
             "trainer_modules": {"mlx_lm": {"distribution": "mlx-lm", "found": True, "version": "0.32.2"}}}
    if working_set:
        probe["mlx"]["gpu"] = {"max_recommended_working_set_size": working_set}
    if memory:
        probe["memory_bytes"] = memory
    return HostCapture(name, {PROBE: json.dumps(probe), SYSCTL_MEMORY: sysctl})
