"""Following a detached run again (`mlxcluster attach RUN_ID`): the jobs
layer finds the run's files on the hosts and follows its ranks' lines
(jobs/attach.py, which knows no program); here what a program adds. A
training run (the trainer's module in rank 0's program) is watched for
stalls as `train` watches it, and its record at --out here is made whole
from the lines (launch/record.py), as if `train` had stayed attached. It
ends as any supervised job does (launch/supervisor.py ``JobResult``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mlxcluster.errors import InputError, Interrupted
from mlxcluster.jobs.attach import DetachedRun, find_detached, follow_to_end
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.running import asked_to_stop, list_running
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.record import RunRecord
from mlxcluster.launch.supervisor import JobResult, Words
from mlxcluster.launch.trainer import TRAINER_MODULE, close_record, trainer_out


def find_to_attach(job: Job, run_id: str, env: dict[str, str], on_event: OnEvent) -> DetachedRun:
    """``run_id``'s files on ``job``'s hosts, said as a Note (running or
    ended, where, what), or InputError when no host has them."""
    run = find_detached(job.hosts, run_id, env)
    if run is None:
        raise InputError(f"no run {run_id} on {', '.join(dict.fromkeys(h.name for h in job.hosts))} "
                         "(a job started with --detach keeps its ranks' output there until "
                         "attach has followed it to its end)",
                         "mlxcluster jobs lists what runs there (with the same -i, --hostfile or "
                         "--local)")
    running = any(j.run_id == run_id for j in list_running(job.hosts, env)[0])
    on_event(Note(f"attaching to {run_id} ({'running' if running else 'ended'}) on "
                  f"{', '.join(h.name for h in run.hosts)}: {' '.join(run.program)}"))
    return run


def follow_attached(job: Job, run: DetachedRun, env: dict[str, str],
                    on_line: Callable[[str, str], None], on_event: OnEvent) -> JobResult:
    """Follow ``run`` to its end (jobs/attach.py ``follow_to_end``); a
    training run watched for stalls (its report under its --out) and its
    record at --out kept here, closed however the following ends (its
    plot and any damage said as events). A signal leaves the run running
    (the result ``interrupted``); a stop asked for (`mlxcluster stop`) is
    read from the hosts' mark, as a launching command reads it."""
    training = TRAINER_MODULE in run.program
    out = trainer_out(run.program) if training else None
    record = None
    if out:
        record = RunRecord(out)
        record.start_launch(f"attached to {run.run_id}")
        on_event(Note(f"the run's record: {Path(out).resolve()}"))

    def show(stream: str, line: str) -> None:
        shown = record.feed(line) if record is not None else line
        if shown is not None:
            on_line(stream, shown)

    job = replace(job, detached=True)  # the run goes on without this machine
    words = Words("attach", record=out, finished=f"{run.run_id} finished: every rank ended well")
    started = time.monotonic()
    try:
        outcome = follow_to_end(job, run, env, show, Path(out) if out else Path("runs"),
                                watch_stalls=training)
    except Interrupted:
        return JobResult(job, RunOutcome(0, run_id=run.run_id), words,
                         seconds=time.monotonic() - started, interrupted=True)
    finally:
        if record is not None:
            for said in close_record(record):
                on_event(said)
    stopped_at = record.stopped_at if record is not None else None
    if outcome.exit_code and (stopped_at is not None or asked_to_stop(job.hosts, run.run_id, env)):
        outcome = replace(outcome, asked_to_stop=True)
    outcome = replace(outcome, run_id=run.run_id)
    return JobResult(job, outcome, words, seconds=time.monotonic() - started, stopped_at=stopped_at)
