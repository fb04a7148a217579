"""``doctor --fix`` and ``doctor --undo`` for ``cli/doctor.py``: the plan
shown, the yes asked, each change shown as it is made, the verdict before
and after, a journal undone. The fixes themselves are in
``mlxcluster/doctor/fixes/``; this module only calls and renders.
"""

from __future__ import annotations

import json
import sys

import click

from mlxcluster.cli.report import emit_page
from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.doctor import run_doctor
from mlxcluster.doctor.fixes.apply import (
    ApplyContext,
    apply_plan,
    check_inventory_writable,
    undo_journal,
)
from mlxcluster.doctor.fixes.journal import Journal, check_writable, fixes_dir, read_journal
from mlxcluster.doctor.fixes.outcome import FixOutcome
from mlxcluster.doctor.fixes.plan import Plan
from mlxcluster.doctor.fixes.session import all_fixed, before_after, open_runner, plan_fixes
from mlxcluster.errors import EXIT_FAILED, EXIT_OK, InputError
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.report import Report
from mlxcluster.topology.topology import build_topology

STATUS_MARKS = {Status.PASS: "✓", Status.WARN: "!", Status.FAIL: "✗", Status.CRASH: "✗", Status.SKIP: "-"}
ENTRY_COLOURS = {"applied": "green", "unchanged": None, "failed": "red", "skipped": "yellow"}


def can_ask() -> bool:
    """Whether a yes can be asked for (a terminal on stdin)."""
    return sys.stdin is not None and sys.stdin.isatty()


def check_fix_flags(*, fix: bool, dry_run: bool, yes: bool, undo: str | None, others: dict[str, bool],
                    mlx_version: str | None = None) -> None:
    """Flag combinations --fix, --dry-run, --yes, --mlx-version and --undo
    refuse (exit 2, before any host is probed); ``others``: flag name -> given."""
    given = [name for name, on in others.items() if on]
    if undo:
        clash = [n for n, on in (("--fix", fix), ("--dry-run", dry_run), ("--yes", yes),
                                 ("--mlx-version", bool(mlx_version))) if on] + given
        if clash:
            raise InputError(f"--undo JOURNAL excludes {', '.join(clash)}",
                             "run 'mlxcluster doctor --undo JOURNAL' alone")
        return
    if mlx_version and not fix:
        raise InputError("--mlx-version goes with --fix", "mlxcluster doctor --fix --mlx-version X")
    if (dry_run or yes) and not fix:
        raise InputError(f"{'--dry-run' if dry_run else '--yes'} goes with --fix",
                         "mlxcluster doctor --fix --dry-run (the plan only) or --fix --yes (apply it)")
    if not fix:
        return
    if dry_run and yes:
        raise InputError("--dry-run and --yes exclude each other",
                         "--dry-run prints the plan only; --yes applies it without asking")
    if given:
        raise InputError(f"--fix excludes {', '.join(given)}",
                         "--fix works on live hosts and prints its plan; run doctor with those flags apart")
    if not dry_run and not yes and not can_ask():
        raise InputError("--fix asks before it changes anything, and there is no terminal to ask on",
                         "pass --yes to apply the plan without asking, or --dry-run to print it only")
    if not dry_run:
        check_writable(fixes_dir())


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


def _problems(results) -> list:
    return [r for r in results if r.status in (Status.FAIL, Status.CRASH, Status.WARN)]


def write_fix_page(path: str | None, report, outcome: FixOutcome) -> None:
    """The --html page of a --fix run: what it did above ``report``'s checks."""
    if path:
        emit_page(Report(doctor=report, topology=build_topology(report.captures), fix=outcome), path)


def run_fix(inventory, *, backend, connect_timeout, accept_new_host_keys, data_path, hostfile, verbose,
            dry_run, yes, strict, fix_timeout, render, html_path=None, mlx_version=None) -> int:
    """The whole --fix run; the exit code.

    A host whose key was unknown could not be probed before its key was
    saved: the re-check judges it, and what it finds fixable there is a
    second plan (shown and asked for like the first, once). With
    ``html_path`` the page shows what was done (or planned only), before and
    after, and what is left."""
    runner = open_runner(inventory, connect_timeout=connect_timeout, command_timeout=60.0,
                         accept_new_host_keys=accept_new_host_keys)
    options = dict(backend=backend, connect_timeout=connect_timeout, data_path=data_path, hostfile=hostfile)
    wanted = {"mlx_version": mlx_version} if mlx_version else {}  # what the fixes are asked
    try:
        before = run_doctor(inventory, runner=runner, **options)
        render(before, verbose)
        click.echo("")
        plan = plan_fixes(before, inventory, runner, wanted)
        render_plan(plan)

        def unapplied(why: str) -> FixOutcome:
            return FixOutcome(list(plan.actions), left=_problems(before.results), problems=list(plan.problems),
                              not_applied=why)

        if plan.empty:
            write_fix_page(html_path, before, unapplied("nothing here can be fixed by mlxcluster"))
            failing = before.failed() or (strict and before.warned())
            return EXIT_FAILED if failing else EXIT_OK
        if dry_run:
            click.echo("dry run: nothing was changed")
            write_fix_page(html_path, before, unapplied("dry run"))
            return EXIT_FAILED
        check_inventory_writable(plan)
        if not yes and not click.confirm(f"Apply these {len(plan.actions)} change(s)?", default=False):
            click.echo("nothing was changed")
            write_fix_page(html_path, before, unapplied("the answer was no"))
            return EXIT_FAILED
        proposed, problems = list(plan.actions), list(plan.problems)
        journal = Journal.create(fixes_dir(), inventory.path, inventory.ssh_config)
        ctx = ApplyContext(runner, timeout=fix_timeout)
        entries, planned, tried = [], set(), set()
        for round_ in (1, 2):
            click.echo("applying:")
            entries += apply_plan(plan, journal, ctx, on_entry=render_entry)
            planned.update(plan.checks())
            tried.update(action_key(a) for a in plan.actions)
            inventory = load_inventory(inventory.path)
            after = run_doctor(inventory, runner=runner, **options)
            more = [a for a in plan_fixes(after, inventory, runner, wanted).actions if action_key(a) not in tried]
            if not more or round_ == 2:
                break
            plan = Plan(more, [])
            proposed += more
            click.echo("")
            click.echo("the re-check judged hosts it could not reach before; more to fix:")
            render_plan(plan)
            check_inventory_writable(plan)
            if not yes and not click.confirm(f"Apply these {len(plan.actions)} change(s)?", default=False):
                break
        click.echo("")
        click.echo("before -> after:")
        changes = before_after(before.results, after.results)
        for c in changes:
            now = STATUS_MARKS[c.after] if c.after else "not run"
            colour = "green" if c.fixed else "red" if c.after in (Status.FAIL, Status.CRASH) else "yellow"
            click.secho(f"  [{STATUS_MARKS[c.before]}] -> [{now}] {c.title}  [{c.check}]", fg=colour)
        judged = {c.check for c in changes}
        for r in after.results:
            if r.status in (Status.FAIL, Status.CRASH, Status.WARN) and r.id not in judged:
                click.secho(f"  [{STATUS_MARKS[r.status]}] now: {r.title}  [{r.id}]", fg="yellow")
        left = _problems(after.results)
        if left:
            click.echo("left for you:")
            for r in left:
                click.echo(f"  [{r.id}] {r.title}" + (f": {r.hint}" if r.hint else ""))
        click.echo(f"journal: {journal.path}")
        click.echo(f"undo: mlxcluster doctor --undo {journal.path}")
        write_fix_page(html_path, after, FixOutcome(proposed, entries, changes, left, problems, str(journal.path)))
        return EXIT_OK if all_fixed(planned, entries, changes, after.results, strict) else EXIT_FAILED
    finally:
        runner.close()


def action_key(action) -> str:
    """What makes two planned actions the same change."""
    return json.dumps([action.check, list(action.hosts), action.kind, action.params], sort_keys=True)


def run_undo(path: str, connect_timeout: float) -> int:
    """Undo a journal; 0 when every change with a way back was undone."""
    journal = read_journal(path)
    runners = []

    def runner_for():
        if not runners:
            runners.append(open_runner(_Where(journal.ssh_config), connect_timeout=connect_timeout,
                                       command_timeout=60.0))
        return runners[0]

    try:
        done = undo_journal(journal, runner_for)
    finally:
        for r in runners:
            r.close()
    if not done:
        click.echo(f"{path}: no change to undo")
    for entry, status, message in done:
        colour = {"restored": "green", "unchanged": None, "failed": "red", "none": "yellow"}[status]
        click.secho(f"  {status:9} [{entry['check']}] {', '.join(entry['hosts'])}: {message}", fg=colour)
    return EXIT_FAILED if any(s in ("failed", "none") for _, s, _ in done) else EXIT_OK


class _Where:
    """What ``open_runner`` reads of an inventory, from a journal."""

    def __init__(self, ssh_config: str | None):
        self.ssh_config = ssh_config
