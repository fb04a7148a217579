"""The half after launch, written once for `run`, `train`, `serve` and
`attach`: launch, watch, restart, drop a host, finish, and how the end is
said.

``supervise`` launches a prepared job (launch/session.py) until it ends:
the loop of jobs/restarts.py ``launch_until_done`` (a failure, the hosts
asked again, a host dropped, the restart's job), with the detached note
first and one "launching N rank(s)" note per launch. What differs is the
command's: its ``LaunchOne`` (how one launch runs and is watched: run's
logs, the trainer's record, serve's port, tunnel and probe), its ``again``
and ``drop`` (what a restart changes), and its ``Words``. A detached job
interrupted here is left running, not stopped.

``JobResult`` is how any of them ended; ``ending`` says it, in one ladder
(left running or interrupted; the launcher's refusal; a stop asked for; a
failure, who and why, with its known errors; success) with the exit code,
as ``Said`` lines the CLI renders (cli/job_launch.py ``render_ending``).
Nothing here prints.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import EXIT_FAILED, EXIT_STOPPED_WHEN_ASKED, InputError, Interrupted
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job, launcher_name
from mlxcluster.jobs.restarts import Again, Drop, Restarts, launch_until_done
from mlxcluster.jobs.watch import RunOutcome

# One launch of the command's job: (the job, which launch it is: 0 first,
# ``say``) -> its outcome. ``say(job, what)`` gives the launch note ("launching
# N rank(s) on BACKEND, run ID: WHAT") once the launch knows what it runs, and
# returns it (train's record keeps it).
Say = Callable[[Job, str], str]
LaunchOne = Callable[[Job, int, Say], RunOutcome]


@dataclass(frozen=True)
class Words:
    """How a command's ending is worded: what differs between run, train,
    serve and attach."""

    command: str  # "run", "train"...: "run failed: ..."
    logs: Path | None = None  # where the ranks' logs are, said with the end
    # A stop asked for: by whom, and what every rank did then.
    asked_by: str | None = None  # None: 'mlxcluster stop RUN_ID'
    stop_done: str = "ended"
    record: str | None = None  # the record `attach` makes whole, when a detached job is left
    finished: str | None = None  # the success line, when not "COMMAND finished on N rank(s)..."
    more_on_failure: tuple[str, ...] = ()  # after a failure's lines (run: a hidden rank's tail)


@dataclass(frozen=True)
class JobResult:
    """How a supervised job ended, for every command."""

    job: Job  # as last launched (fewer hosts after an elastic drop)
    outcome: RunOutcome
    words: Words
    restarts: int = 0
    seconds: float = 0.0  # the whole run's, restarts included
    stopped_at: int | None = None  # the step the ranks stopped at when asked (the trainer's)
    interrupted: bool = False  # a signal ended the supervision (a detached job left running)


@dataclass(frozen=True)
class Said:
    """One line of an ending, and where it goes."""

    text: str
    err: bool = True
    colour: str | None = None


@dataclass(frozen=True)
class Ending:
    """What is said at the end of a job, and the command's exit code."""

    kind: str  # "left", "interrupted", "refused", "stopped", "failed", "finished"
    exit_code: int
    said: tuple[Said, ...] = field(default_factory=tuple)
    why: str | None = None  # stopped or failed, in a few words (train's HTML page)


def detached_note(run_id: str) -> Note:
    """What a detached job's launch says first: how to find it again."""
    return Note(f"detached: run {run_id} goes on if this machine goes away; 'mlxcluster attach "
                f"{run_id}' follows it again, 'mlxcluster stop {run_id}' stops it")


def launch_note(job: Job, run_id: str, k: int, what: str) -> str:
    """The note of launch ``k`` (0 first) of ``job``, running ``what``."""
    again = f" (restart {k})" if k else ""
    return f"launching {len(job.hosts)} rank(s) on {job.backend}, run {run_id}{again}: {what}"


def supervise(job: Job, launch_one: LaunchOne, restarts: Restarts, env: dict[str, str], *,
              run_id: str, words: Words, on_event: OnEvent, again: Again,
              drop: Drop | None = None) -> JobResult:
    """Launch ``job`` until it ends (jobs/restarts.py ``launch_until_done``:
    ``again`` gives restart k's job, ``drop`` the job without lost hosts),
    each launch through ``launch_one``; a detached job first says how to
    find it again, and is left running when a signal ends this (a job
    that is not detached is stopped everywhere: ``Interrupted`` raised)."""
    if job.detached:
        on_event(detached_note(run_id))
    count = itertools.count()

    def launch(job: Job) -> RunOutcome:
        k = next(count)

        def say(job: Job, what: str) -> str:
            said = launch_note(job, run_id, k, what)
            on_event(Note(said))
            return said
        return launch_one(job, k, say)

    started = time.monotonic()
    try:
        job, outcome = launch_until_done(job, launch, restarts, env, again=again, drop=drop,
                                         on_event=on_event)
    except Interrupted:
        if not job.detached:
            raise
        return JobResult(job, RunOutcome(0, run_id=run_id), words, restarts.done,
                         time.monotonic() - started, interrupted=True)
    took = outcome.seconds if not restarts.done else time.monotonic() - started
    return JobResult(job, outcome, words, restarts.done, took)


def refuse_detached_restarts(detach: bool, max_restarts: int, *, then: str = "") -> None:
    """InputError for --detach with --max-restarts: restarts are run from this
    machine, which a detached job goes on without (``then``: how to go on
    instead, in the fix)."""
    if detach and max_restarts:
        raise InputError("--detach and --max-restarts do not go together: restarts are run from "
                         "this machine, and a detached job runs on without it",
                         f"leave one out{then}")


def left_running(run_id: str, record: str | None = None) -> str:
    """What a detached job left running says (``record``: the --out whose
    record `attach` makes whole)."""
    whole = f" and makes the record at {record} whole" if record else ""
    return (f"left {run_id} running on the hosts: 'mlxcluster attach {run_id}' follows it "
            f"again{whole}; 'mlxcluster stop {run_id}' stops it")


def refusal_said(command: str, job: Job, outcome: RunOutcome) -> list[Said]:
    """The launcher refused to start the job (no rank ran, none is to blame)."""
    return [Said(f"{command} failed: {launcher_name(job)} did not start the job, no rank ran: "
                 f"{outcome.refusal}", colour="red"),
            Said("fix: check the --mpi-arg values and the hostfile (the launcher's message is "
                 "above)" if job.backend == "mpi" else "fix: the launcher's message is above")]


def failure_said(command: str, outcome: RunOutcome, mlx_version: str | None, *,
                 then: str = "") -> list[Said]:
    """Who failed and how (a host lost to ssh named, with its fix and
    ``then``), and the cause and fix of any known message in the output
    (docs/errors.md)."""
    who = outcome.who
    if outcome.lost_host:
        said = [Said(f"{command} failed: the ssh connection to {outcome.lost_host} failed or was "
                     f"lost ({who} exited with ssh's code 255: the host stopped answering, went "
                     "to sleep or lost its link); every other rank was stopped", colour="red"),
                Said(f"fix: bring {outcome.lost_host} back (mlxcluster doctor checks every host)"
                     f"{then}")]
    elif outcome.refused_at_start:
        words = outcome.usage_words()
        said = [Said(f"{command} failed: {who} refused to start: it exited with code 2 before "
                     f"its first step (a usage error: its arguments or its input)"
                     f"{f': {words}' if words else ''}; every rank was stopped, none restarted "
                     "(a restart would be refused the same way)", colour="red"),
                Said("fix: correct what its message above names, then run again")]
    else:
        signalled = (f" (on {outcome.signalled_host}, which still answers: ssh's code for a "
                     "rank ended by a signal: killed, out of memory or crashed)"
                     if outcome.signalled_host else "")
        said = [Said(f"{command} failed: {who} exited with code {outcome.exit_code}{signalled}; "
                     "every rank was stopped", colour="red")]
    return said + [Said(f"known error: {known.text(mlx_version)}")
                   for known in outcome.known_errors()]


def exit_code_of(outcome: RunOutcome) -> int:
    """The command's exit code for a failed job: the failing rank's, else 1."""
    return outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED


def ending(result: JobResult, mlx_version: str | None = None) -> Ending:
    """What ``result`` says and the command's exit code, in one ladder for
    every command (``mlx_version``: the cluster's, for known errors' fixes)."""
    job, outcome, words = result.job, result.outcome, result.words
    logs = f"; logs: {words.logs}" if words.logs else ""
    run_id = outcome.run_id
    if result.interrupted:
        if job.detached:
            return Ending("left", 0, (Said(left_running(run_id, words.record)),))
        return Ending("interrupted", 0, (Said(f"stopped: every rank of run {run_id} was stopped "
                                              f"on every host{logs}", err=False),))
    said: list[Said] = []
    if job.detached and outcome.lost_host:  # cut off from a host: a detached job may run on there
        said.append(Said(f"lost the ssh connection to {outcome.lost_host}: {job.title} of run "
                         f"{run_id} may go on there ('mlxcluster jobs' shows it, 'mlxcluster "
                         f"attach {run_id}' follows it again when the host answers)"))
    if outcome.refusal:
        return Ending("refused", EXIT_FAILED, (*said, *refusal_said(words.command, job, outcome)))
    if outcome.asked_to_stop:  # `mlxcluster stop RUN_ID`: an end, not a failure to restart
        at = f" at step {result.stopped_at}" if result.stopped_at is not None else ""
        why = f"stopped{at} when asked"
        by = words.asked_by or f"'mlxcluster stop {run_id}'"
        said.append(Said(f"{words.command} {why} ({by}): every rank {words.stop_done}{logs}"))
        return Ending("stopped", EXIT_STOPPED_WHEN_ASKED, tuple(said), why)
    if outcome.exit_code != 0:
        said += failure_said(words.command, outcome, mlx_version, then=job.then)
        said += [Said(line) for line in words.more_on_failure]
        if words.logs:
            said.append(Said(f"logs: {words.logs}"))
        return Ending("failed", exit_code_of(outcome), tuple(said),
                      f"{outcome.who} exited with code {outcome.exit_code}")
    again = f" after {result.restarts} restart(s)" if result.restarts else ""
    finished = words.finished or (f"{words.command} finished on {len(job.hosts)} rank(s) in "
                                  f"{result.seconds:.1f} s{again}{logs}")
    return Ending("finished", 0, (*said, Said(finished, err=False)))
