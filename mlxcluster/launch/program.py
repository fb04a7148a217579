"""Hand-off to the user's own program (``mlxcluster run``): what a run does
around the job, as ``trainer.py`` is for the reference trainer.

The program learns which launch it is from ``MLXCLUSTER_RESTART`` (0 first,
then 1, 2... with ``--max-restarts``) and resumes on its own: mlxcluster knows
nothing of its checkpoints. ``run_program`` launches it until it ends well or
the restarts are spent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job, program_command
from mlxcluster.jobs.restarts import Restarts, launch_until_done
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.watch import RunOutcome

RESTART_ENV = "MLXCLUSTER_RESTART"  # which launch of the job this is: 0, then 1, 2... (--max-restarts)


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
