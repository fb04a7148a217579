"""Coming back to a detached job (`mlxcluster attach RUN_ID`).

A detached rank keeps its output in files on its own host (the rank
wrapper's ``detach``). Attaching finds the run on the hosts (its pid files,
jobs.running), reads what rank 0's program was (``rank0.argv``, written at
detach), and follows every rank's files from their first line with one ssh
call per host running ``jobs/follow.py`` there; the lines arrive as a
launcher's would, so `train`'s record and views take them unchanged.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.jobs import follow, process, stall
from mlxcluster.jobs.cleanup import sweep
from mlxcluster.jobs.hosts import RankHost, distinct_hosts, for_each_host, host_argv, run_script
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from mlxcluster.jobs.run import stop_stalled
from mlxcluster.jobs.watch import RunOutcome, watch_launcher


@dataclass(frozen=True)
class DetachedRun:
    """A detached run found on the hosts: where its ranks' files are, and
    what rank 0 runs (the python arguments after the rank wrapper)."""

    run_id: str
    hosts: tuple[RankHost, ...]  # the hosts holding its files, one each
    program: tuple[str, ...]


def run_dir(run_id: str) -> str:
    return f"{STACKS_ROOT}/{run_id}"


def probe_script(run_id: str) -> str:
    """Prints ``@@ranks N`` (the run's pid files on the host) and rank 0's
    program when the host has it."""
    folder = shlex.quote(run_dir(run_id))
    inner = (f'n=0; for f in {folder}/rank*.pid; do [ -f "$f" ] && n=$((n+1)); done; '
             f'echo "@@ranks $n"; cat {folder}/rank0.argv 2>/dev/null; true')
    return f"bash -c {shlex.quote(inner)}"


def parse_probe(text: str) -> tuple[int, tuple[str, ...] | None]:
    """(the ranks a host holds, rank 0's program when it is there)."""
    ranks, program = 0, None
    for line in text.splitlines():
        if line.startswith("@@ranks "):
            ranks = int(line.split()[1]) if line.split()[1].isdigit() else 0
        elif line.strip().startswith("["):
            try:
                program = tuple(json.loads(line))
            except ValueError:
                pass
    return ranks, program


def find_detached(hosts: Sequence[RankHost], run_id: str,
                  env: dict[str, str] | None = None) -> DetachedRun | None:
    """The run's files on ``hosts`` (each asked once), or None when no host has any."""
    asked = distinct_hosts(hosts)
    results = for_each_host(asked, lambda h: run_script(h, probe_script(run_id), env=env))
    holding, program = [], None
    for host, result in zip(asked, results, strict=True):
        if not result.ok:
            continue
        ranks, found = parse_probe(result.output)
        if ranks:
            holding.append(host)
        program = program or found
    if not holding:
        return None
    return DetachedRun(run_id, tuple(holding), program or ())


def follow_command(python: str, run_id: str) -> str:
    source = Path(follow.__file__).read_text()
    return f"{shlex.quote(python)} -c {shlex.quote(source)} {shlex.quote(run_dir(run_id))}"


def start_following(run: DetachedRun, python: str, env: dict[str, str] | None = None
                    ) -> process.Running:
    """One follower per host in a local bash (started as a launcher is, its
    lines pumped); it exits with the highest of their exit codes."""
    calls = [shlex.join(host_argv(h, follow_command(python, run.run_id))) for h in run.hosts]
    script = ('pids=""; ' + "".join(f'{call} & pids="$pids $!"; ' for call in calls)
              + 'worst=0; for p in $pids; do wait "$p"; c=$?; [ "$c" -gt "$worst" ] && worst=$c; '
              'done; exit "$worst"')
    return process.start(["bash", "-c", script], env)


def follow_to_end(job: Job, run: DetachedRun, env: dict[str, str], on_line,
                  report_dir: Path, *, watch_stalls: bool = False) -> RunOutcome:
    """Follow ``run`` on ``job``'s hosts (with ``job.python``) to its end,
    with ``watch_stalls`` watched for stalls as train is (heartbeats: a
    stall is diagnosed, every rank stopped, stall.Stalled raised, its
    report under ``report_dir``), then sweep its folders from every host.
    ``on_line(stream, line)`` gets every line. Interrupted propagates with
    the run left running (nothing swept)."""
    watch = stall.StallWatch(None) if watch_stalls else None
    outcome = watch_launcher(
        start_following(run, job.python, env), on_line, time.monotonic(), watch=watch,
        on_stall=lambda: stop_stalled(job, run.run_id, watch, report_dir, env))
    sweep(job.hosts, run.run_id, env)  # every rank has ended: their folders go
    return outcome
