"""Per-host chores around a smoke run: stage the worker, stop the run, fetch
stderr tails, remove the run directory.

Remote hosts are reached with the OpenSSH client (``BatchMode=yes``, so it
never prompts) like ``mlx.launch`` does; every call has a timeout.  Hosts
whose ssh target is 127.0.0.1 are handled in-process.

Stopping a run relies on its run id (``mlxsmoke-<hex>``) being on the command
line of every process of the run; ``pkill -f`` gets a bracketed pattern
(``[m]lxsmoke-...``) so it never matches the shell that runs it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from mlxcluster.smoke.launch import LaunchPlan, RankHost
from mlxcluster.ssh import openssh

SSH_TIMEOUT_S = 20
TAIL_BYTES = 2000
ERR_MARK = "==> "


@dataclass(frozen=True)
class HostResult:
    """Outcome of one chore on one host: ok, output, or the reason it failed."""

    host: str
    ok: bool
    output: str
    error: str = ""


def ssh_argv(host: RankHost, script: str) -> list[str]:
    """``ssh`` that never prompts and gives up connecting after 5 s."""
    return openssh.ssh_argv(host.ssh_target, script, connect_timeout=5, options=host.ssh_options)


def run_script(host: RankHost, script: str, stdin: str | None = None,
               timeout: float = SSH_TIMEOUT_S, env: dict[str, str] | None = None) -> HostResult:
    """Run a bash script on ``host`` (locally for 127.0.0.1), with a timeout."""
    argv = ["bash", "-c", script] if host.is_local else ssh_argv(host, script)
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HostResult(host.name, False, "", f"timed out after {timeout:.0f} s")
    except OSError as err:
        return HostResult(host.name, False, "", str(err))
    if proc.returncode != 0:
        return HostResult(host.name, False, proc.stdout,
                          (proc.stderr.strip() or f"exit code {proc.returncode}")[-500:])
    return HostResult(host.name, True, proc.stdout)


def remote_hosts(plan: LaunchPlan) -> list[RankHost]:
    """Each distinct remote host of the plan once (ranks may share a host)."""
    seen: dict[str, RankHost] = {}
    for host in plan.hosts:
        if not host.is_local:
            seen.setdefault(host.ssh, host)
    return list(seen.values())


def for_each_host(hosts: list[RankHost], fn) -> list[HostResult]:
    """Run ``fn(host)`` on every host at once; one result per host."""
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        return list(pool.map(fn, hosts))


def stage(plan: LaunchPlan, worker_source: str, env: dict[str, str] | None = None) -> list[HostResult]:
    """Write the launcher files and the worker locally, and the worker into
    the run directory of every remote host."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    (run_dir / "worker.py").write_text(worker_source)
    for path, content in plan.files.items():
        Path(path).write_text(content)
    script = f"mkdir -p {shlex.quote(plan.run_dir)} && cat > {shlex.quote(plan.worker_path)}"
    return for_each_host(remote_hosts(plan),
                         lambda h: run_script(h, script, stdin=worker_source, env=env))


def bracketed(run_id: str) -> str:
    """A regex matching ``run_id`` whose own text does not contain it."""
    return f"[{run_id[0]}]{run_id[1:]}"


def remote_cleanup_script(plan: LaunchPlan, kill: bool) -> str:
    """Kill the run's processes (TERM, CONT so that a stopped rank handles
    its TERM, then KILL), print every rank's stderr tail, remove the run
    directory; the run id itself never appears literally."""
    pattern = shlex.quote(bracketed(plan.run_id))
    glob_dir = f"/tmp/{bracketed(plan.run_id)}"  # the shell glob finds the directory
    script = ""
    if kill:
        script += (f"pkill -TERM -f {pattern}; pkill -CONT -f {pattern}; sleep 0.5; "
                   f"pkill -KILL -f {pattern}; ")
    script += (f"for f in {glob_dir}/*.err; do [ -f \"$f\" ] || continue; "
               f"echo \"{ERR_MARK}$f\"; tail -c {TAIL_BYTES} \"$f\"; echo; done; "
               f"rm -rf {glob_dir}; true")
    return script


def parse_tails(output: str) -> dict[int, str]:
    """``==> /tmp/<id>/<id>.rank<R>.err`` blocks -> {R: tail}."""
    tails: dict[int, str] = {}
    rank, lines = None, []
    for line in output.splitlines():
        if line.startswith(ERR_MARK):
            if rank is not None:
                tails[rank] = "\n".join(lines).strip()
            name = line[len(ERR_MARK):].rsplit(".rank", 1)[-1].removesuffix(".err")
            rank, lines = (int(name) if name.lstrip("-").isdigit() else None), []
        elif rank is not None:
            lines.append(line)
    if rank is not None:
        tails[rank] = "\n".join(lines).strip()
    return tails


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


def marked_processes(run_id: str) -> list[psutil.Process]:
    """Processes on this machine whose command line carries ``run_id``."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
        except psutil.Error:
            continue
        if proc.info["pid"] != me and any(run_id in part for part in cmdline):
            found.append(proc)
    return found


def kill_local_marked(run_id: str, grace_s: float = 1.0) -> int:
    """TERM (and CONT, for a stopped one) then KILL every local process of
    the run; how many there were."""
    procs = marked_processes(run_id)
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


def local_tails(plan: LaunchPlan) -> dict[int, str]:
    """Stderr tails of the ranks that wrote into the local run directory."""
    tails = {}
    for rank in range(len(plan.hosts)):
        path = Path(plan.stderr_path(rank))
        try:
            with path.open("rb") as f:
                f.seek(max(path.stat().st_size - TAIL_BYTES, 0))
                tails[rank] = f.read().decode(errors="replace").strip()
        except OSError:
            continue
    return tails


def finish(plan: LaunchPlan, kill: bool, env: dict[str, str] | None = None
           ) -> tuple[dict[int, str], list[HostResult]]:
    """Stop what is left of the run everywhere (when ``kill``), collect every
    rank's stderr tail, remove the run directories.

    Returns the tails by rank and the per-host results of the remote chores
    (a failed one means that host may still hold processes of the run)."""
    if kill:
        kill_local_marked(plan.run_id)
    tails = local_tails(plan)
    script = remote_cleanup_script(plan, kill)
    results = for_each_host(remote_hosts(plan), lambda h: run_script(h, script, env=env))
    for result in results:
        for rank, tail in parse_tails(result.output).items():
            tails.setdefault(rank, tail)
    shutil.rmtree(plan.run_dir, ignore_errors=True)
    return tails, results
