"""Interrupt a real ``mlxcluster`` command the way a user would, once its run
is under way, and find what is left of the run afterwards.

Ctrl-C in a terminal sends SIGINT to the foreground process group, which is
mlxcluster (with the ssh chores it starts) but not the launchers, which run in
sessions of their own; ``kill PID`` sends SIGTERM to mlxcluster alone. The lab's
hosts share this machine's process table, so ``processes_with`` sees the ranks
on every lab host too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil


def processes_with(*markers: str) -> list[str]:
    """Command lines (other than this process's) that contain every marker."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if proc.info["pid"] != os.getpid() and all(m in line for m in markers):
            found.append(line)
    return found


@dataclass
class Interrupted:
    returncode: int
    stdout: str
    stderr: str
    seconds_to_exit: float  # from the signal to the command's exit


def interrupt_when(argv: list[str], ready: Callable[[subprocess.Popen], bool], sig: int, *,
                   env: dict[str, str] | None = None, cwd: str | None = None,
                   ready_timeout: float = 120.0, exit_timeout: float = 90.0) -> Interrupted:
    """Start ``argv`` in a session of its own (as a shell starts a job), send
    ``sig`` once ``ready(process)`` holds (to the process group for SIGINT/SIGHUP, as
    a terminal does; to the process alone for SIGTERM, as ``kill`` does), and
    wait for it to exit. Fails if it never became ready or never exited."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout
        while not ready(proc):
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"exited ({proc.returncode}) before it was interrupted:\n"
                                     f"{out[-2000:]}\n{err[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not under way within {ready_timeout:.0f} s")
            time.sleep(0.2)
        sent = time.monotonic()
        if sig == signal.SIGTERM:
            os.kill(proc.pid, sig)
        else:
            os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=exit_timeout)
        return Interrupted(proc.returncode, out, err, time.monotonic() - sent)
    finally:
        if proc.poll() is None:  # the test failed: leave nothing of it behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def smoke_run_id(stderr: str) -> str:
    """The run id the interrupt message names."""
    found = re.search(r"run (mlxsmoke-[0-9a-f]+) stopped", stderr)
    assert found, stderr
    return found.group(1)


class SmokeWorkersRunning:
    """Ready once ``count`` workers of the smoke run started by the process
    (or by a command it started: demo) run, on any lab host too. The run id
    is read from the process's own descendants (the launcher's command line
    names it), so another smoke run on this machine cannot make it ready."""

    def __init__(self, count: int):
        self.count = count
        self.run_id: str | None = None
        self.family: list[psutil.Process] = []  # the process's descendants once ready

    def __call__(self, proc: subprocess.Popen) -> bool:
        if self.run_id is None:
            self.run_id = _run_id_below(proc.pid)
        ready = self.run_id is not None and len(worker_processes(self.run_id)) >= self.count
        if ready:
            self.family = psutil.Process(proc.pid).children(recursive=True)
        return ready

    def family_alive(self) -> list[str]:
        """The descendants seen when the run was ready that still run."""
        alive = []
        for p in self.family:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(p.cmdline()))
            except psutil.Error:
                continue
        return alive


def worker_processes(run_id: str) -> list[psutil.Process]:
    """Python processes running the smoke worker of ``run_id`` (not the ssh
    commands that stage it or the launcher's ssh that starts it, whose
    command lines name it too)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if (len(args) > 1 and os.path.basename(args[0]).startswith("python")
                and any(a.endswith("/worker.py") and run_id in a for a in args[1:])):
            found.append(proc)
    return found


def _run_id_below(pid: int) -> str | None:
    try:
        family = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in family:
        try:
            found = re.search(r"mlxsmoke-[0-9a-f]+", " ".join(child.cmdline()))
        except psutil.Error:
            continue
        if found:
            return found.group(0)
    return None
