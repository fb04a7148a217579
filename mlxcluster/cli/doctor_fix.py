"""``doctor --fix`` and ``doctor --undo`` for ``cli/doctor.py``: the flags
checked, the plan shown, the yes asked, each change shown as it is made, the
verdict before and after, a journal undone. The run itself is
``doctor/fixes/session.py``'s; this module only calls and renders.
"""

from __future__ import annotations

import sys

import click

from mlxcluster.cli.report import emit_page
from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.fixes.outcome import FixOutcome
from mlxcluster.doctor.fixes.plan import Plan
from mlxcluster.doctor.fixes.session import DECLINED, DRY_RUN, FixRun, fix_cluster, undo_fixes
from mlxcluster.doctor.request import DoctorRequest, check_options
from mlxcluster.errors import EXIT_FAILED, EXIT_OK
from mlxcluster.report import Report
from mlxcluster.topology.topology import build_topology

STATUS_MARKS = {Status.PASS: "✓", Status.WARN: "!", Status.FAIL: "✗", Status.CRASH: "✗", Status.SKIP: "-"}
ENTRY_COLOURS = {"applied": "green", "unchanged": None, "failed": "red", "skipped": "yellow"}


def can_ask() -> bool:
    """Whether a yes can be asked for (a terminal on stdin)."""
    return sys.stdin is not None and sys.stdin.isatty()


def render_plan(plan: Plan) -> None:
    if plan.empty:
        click.echo("fix plan: nothing here can be fixed by mlxcluster")
    else:
        hosts = {h for a in plan.actions for h in a.hosts}
        click.secho(f"fix plan: {len(plan.actions)} change(s) for {len(hosts)} host(s)", bold=True)
        for a in plan.actions:
            where = "on this machine" if a.where == "here" else "on " + ", ".join(a.hosts)
            click.echo(f"  [{a.check}] {', '.join(a.hosts)}: {a.what}")
            for command in a.commands:  # on several hosts, each command says where
                click.echo(f"      {command}" if a.where == "hosts" else f"      {where}: {command}")
    for check_id, why in plan.problems:
        click.secho(f"  [{check_id}] its fix could not be planned: {why}", fg="red")
    if plan.left:
        click.echo("left for you (nothing here fixes it):")
        for r in plan.left:
            click.echo(f"  [{r.id}] {r.title}" + (f": {r.hint}" if r.hint else ""))


def render_entry(entry: dict) -> None:
    status = entry["status"]
    click.secho(f"  {status:9} [{entry['check']}] {', '.join(entry['hosts'])}: {entry['what']}",
                fg=ENTRY_COLOURS.get(status))
    if status in ("failed", "skipped") and entry.get("output"):
        for line in entry["output"].splitlines():
            click.echo(f"      {line}")


def write_fix_page(path: str | None, report, outcome: FixOutcome) -> None:
    """The --html page of a --fix run: what it did above ``report``'s checks."""
    if path:
        emit_page(Report(doctor=report, topology=build_topology(report.captures), fix=outcome), path)


class ClickView:
    """A fix run told on the terminal (session.FixView)."""

    def __init__(self, render, verbose: bool):
        self._render, self._verbose = render, verbose

    def report(self, report) -> None:
        self._render(report, self._verbose)
        click.echo("")

    def plan(self, plan: Plan, again: bool) -> None:
        if again:
            click.echo("")
            click.echo("the re-check judged hosts it could not reach before; more to fix:")
        render_plan(plan)

    def confirm(self, plan: Plan) -> bool:
        return click.confirm(f"Apply these {len(plan.actions)} change(s)?", default=False)

    def applying(self) -> None:
        click.echo("applying:")

    def entry(self, entry: dict) -> None:
        render_entry(entry)


def render_outcome(run: FixRun) -> None:
    """The end of an applied run: before -> after, what is left, the journal."""
    outcome = run.outcome
    click.echo("")
    click.echo("before -> after:")
    for c in outcome.changes:
        now = STATUS_MARKS[c.after] if c.after else "not run"
        colour = "green" if c.fixed else "red" if c.after in (Status.FAIL, Status.CRASH) else "yellow"
        click.secho(f"  [{STATUS_MARKS[c.before]}] -> [{now}] {c.title}  [{c.check}]", fg=colour)
    judged = {c.check for c in outcome.changes}
    for r in outcome.left:
        if r.id not in judged:
            click.secho(f"  [{STATUS_MARKS[r.status]}] now: {r.title}  [{r.id}]", fg="yellow")
    if outcome.left:
        click.echo("left for you:")
        for r in outcome.left:
            click.echo(f"  [{r.id}] {r.title}" + (f": {r.hint}" if r.hint else ""))
    click.echo(f"journal: {outcome.journal}")
    click.echo(f"undo: mlxcluster doctor --undo {outcome.journal}")


def run_fix(inventory, request: DoctorRequest, *, render) -> int:
    """The whole --fix run of ``request``, told on the terminal (and the
    --html page); the exit code."""
    r = request
    run = fix_cluster(inventory, ClickView(render, r.verbose), options=check_options(r),
                      wanted={"mlx_version": r.mlx_version} if r.mlx_version else {},
                      dry_run=r.dry_run, yes=r.yes, strict=r.strict, fix_timeout=r.fix_timeout,
                      connect_timeout=r.connect_timeout,
                      accept_new_host_keys=r.accept_new_host_keys)
    if run.outcome.not_applied == DRY_RUN:
        click.echo("dry run: nothing was changed")
    elif run.outcome.not_applied == DECLINED:
        click.echo("nothing was changed")
    elif not run.outcome.not_applied:
        render_outcome(run)
    write_fix_page(r.html_path, run.last, run.outcome)
    return EXIT_OK if run.ok else EXIT_FAILED


def run_undo(path: str, connect_timeout: float) -> int:
    """Undo a journal; 0 when every change with a way back was undone."""
    done = undo_fixes(path, connect_timeout)
    if not done:
        click.echo(f"{path}: no change to undo")
    for entry, status, message in done:
        colour = {"restored": "green", "unchanged": None, "failed": "red", "none": "yellow"}[status]
        click.secho(f"  {status:9} [{entry['check']}] {', '.join(entry['hosts'])}: {message}", fg=colour)
    return EXIT_FAILED if any(s in ("failed", "none") for _, s, _ in done) else EXIT_OK
