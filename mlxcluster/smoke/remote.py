"""Per-host chores around a smoke run: stage the worker, stop the run, fetch
stderr tails, remove the run directory (through the jobs layer's
``run_script`` on every host and its run-id sweep, ``jobs.cleanup``).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from mlxcluster.jobs.cleanup import bracketed, kill_local_marked, stop_script
from mlxcluster.jobs.hosts import HostResult, for_each_host, remote_hosts, run_script
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.smoke.launch import stderr_path, worker_path

TAIL_BYTES = 2000
ERR_MARK = "==> "


def stage(plan: LaunchPlan, worker_source: str, env: dict[str, str] | None = None) -> list[HostResult]:
    """Write the launcher files and the worker locally, and the worker into
    the run directory of every remote host."""
    plan.write_files()
    Path(worker_path(plan)).write_text(worker_source)
    script = f"mkdir -p {shlex.quote(plan.run_dir)} && cat > {shlex.quote(worker_path(plan))}"
    return for_each_host(remote_hosts(plan.hosts),
                         lambda h: run_script(h, script, stdin=worker_source, env=env))


def remote_cleanup_script(plan: LaunchPlan, kill: bool) -> str:
    """Kill the run's processes (jobs.cleanup's stop script: TERM, CONT so
    that a stopped rank handles its TERM, then KILL), print every rank's
    stderr tail, remove the run directory; the run id itself never appears
    literally."""
    glob_dir = f"/tmp/{bracketed(plan.run_id)}"  # the shell glob finds the directory
    script = f"{stop_script(plan.run_id)}; " if kill else ""
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


def local_tails(plan: LaunchPlan) -> dict[int, str]:
    """Stderr tails of the ranks that wrote into the local run directory."""
    tails = {}
    for rank in range(len(plan.hosts)):
        path = Path(stderr_path(plan, rank))
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
    results = for_each_host(remote_hosts(plan.hosts), lambda h: run_script(h, script, env=env))
    for result in results:
        for rank, tail in parse_tails(result.output).items():
            tails.setdefault(rank, tail)
    shutil.rmtree(plan.run_dir, ignore_errors=True)
    return tails, results
