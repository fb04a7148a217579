"""After a job (train, run, smoke): make sure no rank is left on any host, and name the
host a job lost.

Every rank's command line carries the job's run id (``python -X
mlxcluster_run=mlxtrain-<hex> -m mlxcluster.jobs.rank_wrapper ...``; Python keeps
unknown ``-X`` options in ``sys._xoptions`` and ignores them), so that
whatever the launcher could not stop (a host that was unreachable when the
job ended, a launcher killed by SIGKILL) can be found by ``pkill -f`` on every
host afterwards, as smoke does with its run ids (``mlxsmoke-<hex>``).
``pkill -f`` gets a bracketed pattern (``[m]lxtrain-...``) so that it never
matches the shell that runs it.

Open MPI's daemons (``prted``) are no ranks, but one can outlive a job that
failed to start: a host refusing ssh ended mpirun with 255 while the daemon
it had just started on another host lived on, daemonized (seen in CI). Open
MPI 5 hands every ``PRTE_MCA_*`` variable of mpirun's environment to its
daemons as ``--prtemca NAME VALUE`` (checked with 5.0.11), so the launcher's
environment carries the run id too (``launcher_env``) and the sweep's pattern
matches ``mlxcluster_run RUN_ID`` as well as ``mlxcluster_run=RUN_ID``.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import time

import psutil

from mlxcluster.jobs.hosts import HostResult, RankHost, for_each_host, remote_hosts, run_script
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from mlxcluster.ssh.openssh import SSH_FAILED

RUN_MARK = "mlxcluster_run"
SSH_LOST = SSH_FAILED  # ssh's own exit code: the connection failed or was lost
_MPI_REMOTE_HOST = re.compile(r"^\s*Remote host:\s+(\S+)\s*$")


def new_run_id(prefix: str = "mlxjob") -> str:
    """A unique run id, ``PREFIX-<10 hex digits>``: each launching command
    gives its own prefix (jobs/running.py ``register_run_kind``)."""
    return f"{prefix}-{secrets.token_hex(5)}"


def marked_program(run_id: str, program: list[str]) -> list[str]:
    """The python arguments of every rank, carrying the run id."""
    return ["-X", f"{RUN_MARK}={run_id}", *program]


def launcher_env(run_id: str) -> dict[str, str]:
    """What the launcher's environment adds so that Open MPI's daemons carry
    the run id on their command line (``--prtemca mlxcluster_run RUN_ID``);
    Open MPI 4 and mlx.launch ignore it."""
    return {f"PRTE_MCA_{RUN_MARK}": run_id}


def stop_script(run_id: str, pattern: str | None = None) -> str:
    """TERM, then KILL, every process carrying the run id (the bracketed
    pattern never matches the shell running it); CONT in between, so that a
    stopped (SIGSTOP) rank handles its TERM. The grace before KILL is only
    waited when TERM found a process (pkill exits 1 when none matched): after
    a job that ended cleanly, the usual case, the sweep costs one ssh round
    trip, not half a second more (docs/performance-history.md, run overhead). Then
    the run's stack dumps (mlxcluster.jobs.rank_wrapper) are removed
    (``remove_dirs``). ``pattern``: what ``pkill -f`` matches, default the
    bracketed run id."""
    dirs = bracketed(run_id)
    pattern = pattern or dirs
    return (f"if pkill -TERM -f '{pattern}'; then pkill -CONT -f '{pattern}'; sleep 0.5; "
            f"pkill -KILL -f '{pattern}'; fi; {remove_dirs(STACKS_ROOT, dirs)}; true")


def remove_dirs(parent: str, pattern: str) -> str:
    """Shell text removing every directory ``parent``/``pattern`` (a bracketed
    run id) where no process it starts carries the name in its arguments: an
    ``rm -rf`` of the folder did, and a sweep of another host that shares
    this process table (the lab's hosts do; so do ranks run here) KILLed it
    half way, leaving the folder (seen in CI). The glob is expanded and the
    folder entered by bash itself (zsh, macOS's login shell, fails a glob
    that matches nothing); ``find`` then deletes what is inside it, and the
    empty folder."""
    inner = (f'for d in {parent}/{pattern}; do [ -d "$d" ] || continue; '
             f'cd "$d" && find . -mindepth 1 -delete; cd /; done; '
             f"find {parent} -maxdepth 1 -name '{pattern}' -type d -empty -delete")
    return f"bash -c {shlex.quote(inner)} 2>/dev/null"


def run_pattern(run_id: str) -> str:
    """A ``pkill -f`` regex for the processes of a train or run job: the
    marker ``mlxcluster_run=RUN_ID`` on their command line (the ranks, their
    launcher, the shells that start them) or ``mlxcluster_run RUN_ID`` (Open
    MPI's daemons, ``launcher_env``), not any command naming the run
    (``mlxcluster stop RUN_ID`` on the same machine: --local, or the lab's
    hosts, which share this machine's process table)."""
    return bracketed(f"{RUN_MARK}[= ]{run_id}")


def sweep(hosts: tuple[RankHost, ...], run_id: str,
          env: dict[str, str] | None = None) -> list[HostResult]:
    """Stop anything of the job still running, here and on every remote host;
    one result per remote host (not ok: that host may still hold ranks)."""
    kill_local_marked(run_id, marker=f"{RUN_MARK}={run_id}")
    shutil.rmtree(f"{STACKS_ROOT}/{run_id}", ignore_errors=True)
    script = stop_script(run_id, run_pattern(run_id))
    return for_each_host(remote_hosts(hosts), lambda h: run_script(h, script, env=env))


def unstopped_hint(results: list[HostResult], run_id: str) -> str | None:
    """How to finish the job by hand on hosts the sweep could not reach."""
    left = [r for r in results if not r.ok]
    if not left:
        return None
    names = ", ".join(f"{r.host} ({r.error.splitlines()[-1] if r.error else 'failed'})" for r in left)
    return (f"could not reach {names} to make sure no rank of the job is left there; "
            f"when it answers again: {leftover_advice(run_id)}")


def leftover_advice(run_id: str) -> str:
    """What to run on a host the sweep could not reach, once it answers: its
    ranks, then the run's files there (each Mac has its own disk)."""
    return (f"ssh HOST pkill -f {run_id}, then ssh HOST rm -rf /tmp/{run_id} "
            f"{STACKS_ROOT}/{run_id}")


def lost_host(exit_code: int, failed_rank: int | None, host_names: list[str],
              lines: tuple[str, ...]) -> str | None:
    """The host whose ssh connection failed or was lost, when the job ended
    that way (exit 255 is ssh's code; mpirun names the host of a daemon that
    failed)."""
    if exit_code != SSH_LOST:
        return None
    for line in reversed(lines):
        found = _MPI_REMOTE_HOST.match(line)
        if found:
            return found.group(1)
    if failed_rank is not None and 0 <= failed_rank < len(host_names):
        return host_names[failed_rank]
    return None


def bracketed(run_id: str) -> str:
    """A regex matching ``run_id`` whose own text does not contain it."""
    return f"[{run_id[0]}]{run_id[1:]}"


def kill_local_group(pgid: int, grace_s: float = 2.0) -> None:
    """TERM the launcher's process group, then KILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def marked_processes(run_id: str, marker: str | None = None) -> list[psutil.Process]:
    """Processes on this machine whose command line carries ``run_id`` (or,
    given, ``marker``)."""
    marker = marker or run_id
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
        except psutil.Error:
            continue
        if proc.info["pid"] != me and any(marker in part for part in cmdline):
            found.append(proc)
    return found


def kill_local_marked(run_id: str, grace_s: float = 1.0, marker: str | None = None) -> int:
    """TERM (and CONT, for a stopped one) then KILL every local process of
    the run (``marked_processes``); how many there were."""
    procs = marked_processes(run_id, marker)
    for proc in procs:
        try:
            proc.terminate()
            proc.resume()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


class LauncherStopNoise:
    """Drops mlx.launch's own tracebacks from stopping the other ranks.

    After a rank fails, each of mlx.launch's threads stops its rank with
    ``ssh HOST 'kill $(cat PIDFILE)...'``, where PIDFILE was read from a pty
    line still ending in '\\r': the script fails and the thread prints an
    ``Exception in thread ... (_thread_fn)`` ... ``CalledProcessError: ...
    returned non-zero exit status 1.`` traceback. The ranks stop anyway (their
    ssh sessions close). Only such blocks are dropped; any other line passes.
    """

    START = re.compile(r"^Exception in thread .*\(_thread_fn\):\s*$")
    END = re.compile(r"returned non-zero exit status -?\d+\.\s*$")
    MAX_LINES = 80  # a block this long without its end is not the one we know

    def __init__(self) -> None:
        self.block: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to show now (none while a block is being read)."""
        if not self.block:
            if self.START.match(line):
                self.block = [line]
                return []
            return [line]
        self.block.append(line)
        if self.END.search(line) and any("_distributed_utils/launch.py" in b for b in self.block):
            self.block = []
            return []
        if len(self.block) >= self.MAX_LINES:
            return self.flush()
        return []

    def flush(self) -> list[str]:
        """Whatever is held back (the stream ended inside a block)."""
        block, self.block = self.block, []
        return block
