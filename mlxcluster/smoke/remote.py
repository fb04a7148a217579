"""Per-host chores around a smoke run: stage the worker and the rank
wrapper, stop the run, fetch stderr tails, remove the run directory (through the jobs layer's
``run_script`` on every host and its run-id sweep, ``jobs.cleanup``).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from mlxcluster.jobs.cleanup import bracketed, kill_local_marked, remove_dirs, stop_script
from mlxcluster.jobs.hosts import HostResult, for_each_host, remote_hosts, run_script
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.jobs.rank_wrapper import EXIT_MARK
from mlxcluster.jobs.stall import stacks_path
from mlxcluster.smoke.launch import staged_files, stderr_path

TAIL_BYTES = 2000
ERR_MARK = "==> "
STAGE_END = "MLXCLUSTER_STAGED_FILE_END"


def stage(plan: LaunchPlan, worker_source: str, env: dict[str, str] | None = None) -> list[HostResult]:
    """Write the launcher files here, and the worker with the rank wrapper
    (``launch.staged_files``) here and into the run directory of every remote
    host, in one ssh call each."""
    plan.write_files()
    files = staged_files(plan, worker_source)
    for path, content in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    script = write_files_script(files)
    return for_each_host(remote_hosts(plan.hosts),
                         lambda h: run_script(h, "/bin/sh -s", stdin=script, env=env))


def write_files_script(files: dict[str, str]) -> str:
    """A POSIX shell script (read on stdin: the command line stays short)
    that writes ``files`` (path -> text), each as a quoted here-document."""
    lines = ["set -e"]
    for path, content in files.items():
        if STAGE_END in content.splitlines():
            raise ValueError(f"{path} holds the line {STAGE_END}, which ends a staged file")
        body = content if content.endswith("\n") else content + "\n"
        lines += [f"mkdir -p {shlex.quote(str(Path(path).parent))}",
                  f"cat > {shlex.quote(path)} <<'{STAGE_END}'\n{body}{STAGE_END}"]
    return "\n".join(lines) + "\n"


def remote_cleanup_script(plan: LaunchPlan, kill: bool) -> str:
    """Kill the run's processes (jobs.cleanup's stop script: TERM, CONT so
    that a stopped rank handles its TERM, then KILL), print every rank's
    stderr tail, remove the run directory; the run id itself never appears
    literally. The tails are read by bash whatever the login shell: zsh,
    macOS's, fails a glob that matches nothing and drops the rest of the
    line, which left the run directory on a host without stderr files."""
    glob_dir = f"/tmp/{bracketed(plan.run_id)}"  # the shell glob finds the directory
    tails = (f'for f in {glob_dir}/*.err; do [ -f "$f" ] || continue; '
             f'echo "{ERR_MARK}$f"; tail -c {TAIL_BYTES} "$f"; echo; done')
    script = f"{stop_script(plan.run_id)}; " if kill else ""
    return (f"{script}bash -c {shlex.quote(tails)}; "
            f"{remove_dirs('/tmp', bracketed(plan.run_id))}; true")


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
    return {r: without_exit_line(t) for r, t in tails.items()}


def without_exit_line(tail: str) -> str:
    """A rank's stderr tail less the rank wrapper's exit line (``EXIT_MARK
    RANK CODE TIME``): the worker's stderr goes to its file, and the watch
    has the exit code from the worker's own ``exit`` event."""
    return "\n".join(line for line in tail.splitlines() if not line.startswith(EXIT_MARK)).strip()


def local_tails(plan: LaunchPlan) -> dict[int, str]:
    """Stderr tails of the ranks that wrote into the local run directory."""
    tails = {}
    for rank in range(len(plan.hosts)):
        path = Path(stderr_path(plan, rank))
        try:
            with path.open("rb") as f:
                f.seek(max(path.stat().st_size - TAIL_BYTES, 0))
                tails[rank] = without_exit_line(f.read().decode(errors="replace"))
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
    if kill:  # the local ranks' pid and stack files (remote ones: stop_script)
        shutil.rmtree(stacks_path(plan.run_id), ignore_errors=True)
    return tails, results
