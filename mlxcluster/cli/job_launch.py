"""How `mlxcluster run`, `train` and `attach` render a launch: the launch
path's events as they come (``EventView``), and how a failed job is said
(``say_refusal``, ``say_failure``) with its exit code (``exit_code_of``).
The steps themselves are the library's: the launch session
(launch/session.py), the job from the launch flags (launch/job_source.py).

Kept light on purpose: `run --no-preflight` imports only this, the launch
session, the jobs layer and the inventory. The preflight (doctor's checks,
the smoke all_sum, their reports) is imported when it runs: those imports
(paramiko, the doctor, jinja2's report) were a third of run's start-up
(docs/performance-history.md, run over bare mlx.launch).
"""

from __future__ import annotations

import sys

import click

from mlxcluster.errors import EXIT_FAILED
from mlxcluster.jobs.events import (
    Aside,
    Checked,
    ChecksFailed,
    LaunchFailed,
    Note,
    Restarting,
    SendEnded,
    Sending,
    SendProgress,
    StallFailed,
    Warned,
)
from mlxcluster.jobs.job import launcher_name


class EventView:
    """Renders the launch path's events (jobs/events.py) as `run` and
    `train` print them; a transfer's progress bar on stderr."""

    def __init__(self, command: str, mlx_version: str | None = None):
        self.command = command
        self.mlx_version = mlx_version  # the cluster's, once the preflight knows it (known errors)
        self._bar = None

    def __call__(self, event: object) -> None:
        if isinstance(event, Note):
            click.echo(event.text)
        elif isinstance(event, Aside):
            click.echo(event.text, err=True)
        elif isinstance(event, Warned):
            click.secho(f"warning: {event.text}", fg="yellow", err=True)
        elif isinstance(event, Checked):
            self._checked(event)
        elif isinstance(event, ChecksFailed):
            from mlxcluster.cli.doctor import render_check  # preflight only: see the docstring

            for result in event.results:
                for text, colour in render_check(result, verbose=False):
                    click.secho(text, fg=colour, err=True)
        elif isinstance(event, LaunchFailed):
            say_failure(self.command, event.outcome, self.mlx_version)
        elif isinstance(event, StallFailed):
            click.secho(f"error: {event.error}", fg="red", err=True)
        elif isinstance(event, Restarting):
            click.echo(f"restart {event.done}/{event.max_restarts} after: {event.cause}; every "
                       "rank was stopped; probing the hosts again")
        elif isinstance(event, Sending) and sys.stderr.isatty():
            # A bar is for a person watching; in a log it is only its label, alone on a
            # line ("  to labhost1"), after the "sent ..." line has said it all.
            self._bar = click.progressbar(length=max(event.total, 1), label=f"  to {event.host}",
                                          file=sys.stderr)
            self._bar.__enter__()
        elif isinstance(event, SendProgress) and self._bar is not None:
            self._bar.update(event.done - self._bar.pos)
        elif isinstance(event, SendEnded) and self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    @staticmethod
    def _checked(event: Checked) -> None:
        if event.mark == "ok":
            click.echo(f"[✓] {event.text}")
        elif event.mark == "warn":
            click.secho(f"[!] {event.text}", fg="yellow")
        else:
            click.secho(f"[✗] {event.text}", fg="red", err=True)


def say_refusal(command: str, job, outcome) -> None:
    """The launcher refused to start the job (no rank ran, none is to
    blame): say so with its own message and exit 1."""
    click.secho(f"{command} failed: {launcher_name(job)} did not start the job, no rank ran: "
                f"{outcome.refusal}", fg="red", err=True)
    click.echo("fix: check the --mpi-arg values and the hostfile (the launcher's message "
               "is above)" if job.backend == "mpi" else
               "fix: the launcher's message is above", err=True)
    click.get_current_context().exit(EXIT_FAILED)


def say_failure(command: str, outcome, mlx_version: str | None, *, then: str = "") -> str:
    """Who failed and how (a host lost to ssh named, with its fix and
    ``then``), and the cause and fix of any known message in the output
    (docs/errors.md). Returns who failed ("rank 1", or "a rank")."""
    who = outcome.who
    if outcome.lost_host:
        click.secho(f"{command} failed: the ssh connection to {outcome.lost_host} failed or was lost "
                    f"({who} exited with ssh's code 255: the host stopped answering, went to "
                    "sleep or lost its link); every other rank was stopped", fg="red", err=True)
        click.echo(f"fix: bring {outcome.lost_host} back (mlxcluster doctor checks every host)"
                   f"{then}", err=True)
    elif outcome.refused_at_start:
        words = outcome.usage_words()
        click.secho(f"{command} failed: {who} refused to start: it exited with code 2 before its "
                    f"first step (a usage error: its arguments or its input)"
                    f"{f': {words}' if words else ''}; every rank was stopped, none restarted "
                    "(a restart would be refused the same way)", fg="red", err=True)
        click.echo("fix: correct what its message above names, then run again", err=True)
    else:
        signalled = (f" (on {outcome.signalled_host}, which still answers: ssh's code for a "
                     "rank ended by a signal: killed, out of memory or crashed)"
                     if outcome.signalled_host else "")
        click.secho(f"{command} failed: {who} exited with code {outcome.exit_code}{signalled}; "
                    "every rank was stopped", fg="red", err=True)
    for known in outcome.known_errors():
        click.echo(f"known error: {known.text(mlx_version)}", err=True)
    return who


def exit_code_of(outcome) -> int:
    """The command's exit code for a failed job: the failing rank's, else 1."""
    return outcome.exit_code if 0 < outcome.exit_code < 256 else EXIT_FAILED
