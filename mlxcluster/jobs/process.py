"""Start a launcher, read its lines, stop it.

The launcher (mlx.launch, mpirun, or any command: demo's steps) runs in its
own session, so that one process group holds it and what it starts here.
Its stdout and stderr are read by ``pump_lines`` threads onto one queue of
``(stream, line)``; the caller reads that queue in its own thread, where it
also keeps its deadlines. This is the one line pump of mlxcluster.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.jobs import quiet_launch
from mlxcluster.jobs.hosts import RankHost, launcher_ports, remote_hosts
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.ssh.launcher_ssh import launcher_environment
from mlxcluster.ssh.shared import shared_in

END = None  # the line that says a stream ended

# SIGINT is how a launcher is told to stop (mlx.launch and mpirun then stop
# their ranks on every host: jobs.watch.stop_launcher). A process started in
# the background by a shell script (`mlxcluster train ... &`, nohup in a
# script) inherits SIGINT ignored, and exec keeps it ignored: the launcher
# then shrugged the stop off and was KILLed 20 s later, its remote ranks left
# to the sweep (seen in CI, started with `&`). Such a launcher is started
# through this line of python, which sets SIGINT back to its default first.
SIGINT_DEFAULT_THEN_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                            "os.execvp(sys.argv[1], sys.argv[1:])")


def pump_lines(stream, name: str, out: queue.Queue) -> None:
    """Put each line of ``stream`` (bytes) on ``out`` as (name, text without
    its line end or NULs); (name, END) when the stream ends."""
    for raw in iter(stream.readline, b""):
        out.put((name, raw.decode(errors="replace").replace("\x00", "").rstrip("\r\n")))
    out.put((name, END))


@dataclass
class Running:
    """A started command: the process, and the queue its lines arrive on."""

    proc: subprocess.Popen
    lines: queue.Queue
    pumps: list[threading.Thread]
    open_streams: int = 0

    def next_line(self, timeout: float | None) -> tuple[str, str] | None:
        """The next (stream, line), or None when none came within ``timeout``
        or every stream has ended."""
        while self.open_streams:
            try:
                name, line = self.lines.get(timeout=timeout)
            except queue.Empty:
                return None
            if line is END:
                self.open_streams -= 1
                continue
            return name, line
        return None

    def drained(self) -> bool:
        """Every stream ended."""
        return self.open_streams == 0

    def join(self, timeout: float) -> None:
        for t in self.pumps:
            t.join(timeout=timeout)

    def rest(self) -> list[tuple[str, str]]:
        """Lines already queued (after the process ended and the pumps were joined)."""
        found = []
        while True:
            try:
                name, line = self.lines.get_nowait()
            except queue.Empty:
                return found
            if line is END:
                self.open_streams -= 1
            else:
                found.append((name, line))


def start(argv: list[str], env: dict[str, str] | None = None, *,
          merge_stderr: bool = False) -> Running:
    """Start ``argv`` in its own session (stdin closed, SIGINT not ignored)
    and pump its lines."""
    proc = subprocess.Popen(sigint_not_ignored(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True)
    streams = [(proc.stdout, "stdout")] + ([] if merge_stderr else [(proc.stderr, "stderr")])
    lines: queue.Queue = queue.Queue()
    pumps = [threading.Thread(target=pump_lines, args=(s, name, lines), daemon=True)
             for s, name in streams]
    for t in pumps:
        t.start()
    return Running(proc, lines, pumps, open_streams=len(pumps))


def sigint_not_ignored(argv: list[str]) -> list[str]:
    """``argv``, or ``argv`` behind SIGINT_DEFAULT_THEN_EXEC when this process
    ignores SIGINT (the child would inherit that)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return argv
    return [sys.executable, "-c", SIGINT_DEFAULT_THEN_EXEC, *argv]


def start_plan(plan: LaunchPlan) -> Running:
    """Write the plan's files and start its launcher (``launcher_argv``). It reaches the hosts
    through launcher_ssh's ssh (the inventory's ssh_config, BatchMode,
    keepalive, and the job's shared connections when its hosts have them:
    jobs.connections), written into the plan's local run directory."""
    plan.write_files()
    remote = remote_hosts(plan.hosts)
    sharing = shared_in(remote[0].ssh_options) if remote else ()
    env = launcher_environment(plan.env, Path(plan.run_dir) / "bin", plan.ssh_config, sharing,
                               launcher_ports(plan.hosts))
    return start(launcher_argv(plan.argv, plan.hosts), env)


def launcher_argv(argv: list[str], hosts: tuple[RankHost, ...]) -> list[str]:
    """The plan's launcher command as started: when every rank runs on this
    machine, mlx.launch through ``quiet_launch`` (the same launcher without its
    busy loop: 2 local ranks' steps took half the time, bench/launcher_cpu.py
    --local 2); else, and any other launcher, as it is (ranks on other hosts:
    the lab's steps were 8% slower without the loop, docs/performance-runs.md)."""
    if argv and Path(argv[0]).name == "mlx.launch" and hosts and all(h.is_local for h in hosts):
        return quiet_launch.command(argv[0], argv[1:])
    return argv
