"""Hand-off to the user's own program (``mlxcluster run``): what a run does
around the job, as ``trainer.py`` is for the reference trainer.

``program_job`` puts the program on the chosen job (``program_request``: the
launch session's request for it, launch/session.py). The program learns
which launch it is from ``MLXCLUSTER_RESTART`` (0 first, then 1, 2... with
``--max-restarts``) and resumes on its own: mlxcluster knows nothing of its
checkpoints. ``run_program`` launches it until it ends well or the restarts
are spent (launch/supervisor.py), each rank's lines kept in its log.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

from mlxcluster.errors import InputError
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job, program_command, program_imports, script_path
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.run_output import open_rank_logs
from mlxcluster.jobs.running import register_run_kind
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.session import LaunchFlags, LaunchRequest
from mlxcluster.launch.supervisor import JobResult, Words, supervise

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


def numbered(job: Job, k: int) -> tuple[Job, list]:
    """The job for launch ``k`` (0 first): the program reads it from
    MLXCLUSTER_RESTART and resumes on its own."""
    return replace(job, env={**job.env, RESTART_ENV: str(k)}), []


def run_program(job: Job, restarts: Restarts, env: dict[str, str], *, run_id: str,
                logs_dir: str | None, timeout: float | None, stall_timeout: float | None,
                rank0_only: bool, on_line, on_event: OnEvent) -> JobResult:
    """Run the program on ``job``'s ranks until it ends well or the restarts
    are spent (launch/supervisor.py ``supervise``). Every line is kept in its
    rank's log in ``logs_dir`` (default ./runs/RUN_ID; a stall's report goes
    there too) and goes to ``on_line(stream, line)``, with ``rank0_only``
    only rank 0's and the launcher's; a failing rank whose lines were not
    shown has its last ones said with the failure."""
    logs_path, logs = open_rank_logs(logs_dir, run_id)

    def show(stream: str, line: str) -> None:
        rank, _ = logs.write(line)
        if not rank0_only or rank in (0, None):
            on_line(stream, line)

    def launch_one(job: Job, k: int, say) -> RunOutcome:
        say(job, program_command(job))
        if not k:
            on_event(Note(f"logs: {logs_path}/rank<R>.log"))
        return run_job(job, show, env=env, timeout=timeout, stall_timeout=stall_timeout,
                       report_dir=logs_path, run_id=run_id, any_line_progress=True)

    try:
        result = supervise(numbered(job, 0)[0], launch_one, restarts, env, run_id=run_id,
                           words=Words("run", logs=logs_path), on_event=on_event, again=numbered)
    finally:
        logs.close()
    failed = result.outcome.failed_rank
    if result.outcome.exit_code and rank0_only and failed not in (None, 0):  # not shown
        hidden = logs.tail(failed)
        if hidden:
            more = (f"last lines of rank {failed} ({logs_path / f'rank{failed}.log'}):",
                    *(f"[{failed}] {line}" for line in hidden))
            result = replace(result, words=replace(result.words, more_on_failure=more))
    return result
