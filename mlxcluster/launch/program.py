"""Hand-off to the user's own program (``mlxcluster run``): what a run does
around the job, as ``trainer.py`` is for the reference trainer.

``program_job`` puts the program on the chosen job (``program_request``: the
launch session's request for it, launch/session.py). The program learns
which launch it is from ``MLXCLUSTER_RESTART`` (0 first, then 1, 2... with
``--max-restarts``) and resumes on its own: mlxcluster knows nothing of its
checkpoints. ``run_program`` launches it until it ends well or the restarts
are spent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job, program_command, program_imports, script_path
from mlxcluster.jobs.restarts import Restarts, launch_until_done
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.running import register_run_kind
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.session import LaunchFlags, LaunchRequest

RESTART_ENV = "MLXCLUSTER_RESTART"  # which launch of the job this is: 0, then 1, 2... (--max-restarts)
RUN_PREFIX = register_run_kind("mlxrun", "run", detachable=True)  # its run ids


def program_job(job: Job, argv: tuple[str, ...]) -> Job:
    """``job`` running ``argv`` (``jobs.run_output.program_argv``: a script
    or ``-m MODULE``, then its arguments), each line tagged with its rank;
    the preflight checks every host imports a ``-m`` module's package when
    it knows it (``program_imports``: mlx_lm). A script missing here is bad
    input when every rank runs here."""
    job = replace(job, program=argv, imports=program_imports(argv), tag_output=True)
    script = script_path(job)
    if script and all(h.is_local for h in job.hosts) and not os.path.isfile(script):
        raise InputError(f"no such script: {script}",
                         "give the path of a Python file (relative to this directory, or absolute)")
    return job


def program_request(argv: tuple[str, ...], flags: LaunchFlags, *, detached: bool,
                    send_script: bool) -> LaunchRequest:
    """The launch session's request for `mlxcluster run`: ``argv`` on every
    rank, its script sent to every host unless not ``send_script``."""
    return LaunchRequest(flags, RUN_PREFIX, program=partial(program_job, argv=argv),
                         detached=detached, send_script=send_script)


def detached_note(run_id: str) -> Note:
    """What a detached job's launch says first: how to find it again."""
    return Note(f"detached: run {run_id} goes on if this machine goes away; 'mlxcluster attach "
                f"{run_id}' follows it again, 'mlxcluster stop {run_id}' stops it")


def numbered(job: Job, k: int) -> tuple[Job, list]:
    """The job for launch ``k`` (0 first): the program reads it from
    MLXCLUSTER_RESTART and resumes on its own."""
    return replace(job, env={**job.env, RESTART_ENV: str(k)}), []


def launch_number(job: Job) -> int:
    """Which launch ``job`` is (0: the first)."""
    return int(job.env.get(RESTART_ENV, "0"))


@dataclass(frozen=True)
class ProgramResult:
    job: Job  # as last launched
    outcome: RunOutcome
    restarts: int


def run_program(job: Job, restarts: Restarts, env: dict[str, str], *, run_id: str, logs_dir: Path,
                timeout: float | None, stall_timeout: float | None, on_line, on_event: OnEvent) -> ProgramResult:
    """Run the program on ``job``'s ranks until it ends well or the restarts
    are spent; every line goes to ``on_line(stream, line)``, a stall's
    report into ``logs_dir``."""
    if job.detached:
        on_event(detached_note(run_id))

    def launch(job: Job) -> RunOutcome:
        k = launch_number(job)
        note = f" (restart {k})" if k else ""
        on_event(Note(f"launching {len(job.hosts)} rank(s) on {job.backend}, run {run_id}{note}: "
                      f"{program_command(job)}"))
        if not k:
            on_event(Note(f"logs: {logs_dir}/rank<R>.log"))
        return run_job(job, on_line, env=env, timeout=timeout, stall_timeout=stall_timeout,
                       report_dir=logs_dir, run_id=run_id, any_line_progress=True)

    job, outcome = launch_until_done(numbered(job, 0)[0], launch, restarts, env, again=numbered,
                                     on_event=on_event)
    return ProgramResult(job, outcome, launch_number(job))
