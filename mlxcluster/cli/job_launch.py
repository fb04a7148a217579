"""How `mlxcluster run`, `train`, `serve` and `attach` render a launch: the
launch path's events as they come (``EventView``), and any job's end with its
exit code (``render_ending``: the words are the library's, launch/supervisor.py).
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
from collections.abc import Callable

import click

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
from mlxcluster.launch.supervisor import Ending, failure_said


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
            render_said(failure_said(self.command, event.outcome, self.mlx_version))
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


def render_said(said) -> None:
    """Lines of the library's (launch/supervisor.py ``Said``), as they ask."""
    for line in said:
        click.secho(line.text, fg=line.colour, err=line.err)


def render_ending(ending: Ending, then: Callable[[Ending], None] | None = None) -> None:
    """Any job's end (launch/supervisor.py ``ending``: run, train, serve,
    attach): its lines, ``then`` (train: the HTML page), its exit code."""
    render_said(ending.said)
    if then is not None:
        then(ending)
    if ending.exit_code:
        click.get_current_context().exit(ending.exit_code)
