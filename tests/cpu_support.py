"""A process's CPU time, read while it runs (tests/test_quiet_launch.py and
bench/launcher_cpu.py measure the launcher so)."""

from __future__ import annotations

import subprocess
import time

import psutil


def cpu_seconds_until_exit(proc: subprocess.Popen, interval: float = 0.1) -> float:
    """``proc``'s CPU seconds (user + system), sampled every ``interval`` s
    until it exits: the last sample before it is gone (its children not
    counted, as they are not the launcher's own)."""
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            times = ps.cpu_times()
        except psutil.Error:  # exited between the poll and the read
            break
        cpu = max(cpu, times.user + times.system)
        time.sleep(interval)
    return cpu
