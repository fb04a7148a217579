"""One ``doctor --fix`` run, and one ``doctor --undo``: the checks, the
plan, the user's yes, the changes host by host over the connections the
checks used, the re-check, and the verdict before and after. What the run
tells and asks goes through a ``FixView`` (the CLI renders it); what it did
comes back as one ``FixRun``.

    run = fix_cluster(inventory, view, options=..., dry_run=False, yes=True)
    run.outcome.changes   # before -> after for each check that failed or warned
    run.ok                # everything fixable fixed, nothing failing left

A host whose key was unknown could not be probed before its key was saved:
the re-check judges it, and what it finds fixable there is a second plan,
shown and asked for like the first, once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from mlxcluster.doctor.doctor import DoctorReport, load_checks, run_doctor
from mlxcluster.doctor.fixes.apply import (
    ApplyContext,
    apply_plan,
    check_inventory_writable,
    undo_journal,
)
from mlxcluster.doctor.fixes.journal import Journal, fixes_dir, read_journal
from mlxcluster.doctor.fixes.outcome import FixOutcome, all_fixed, before_after, problems
from mlxcluster.doctor.fixes.plan import Action, Lookup, Plan, build_plan
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.ssh import remote
from mlxcluster.ssh.remote import ParamikoRunner

LOOKUP_TIMEOUT = 20.0


def open_runner(inventory, *, connect_timeout: float, command_timeout: float,
                accept_new_host_keys: bool = False) -> ParamikoRunner:
    """The SSH runner of the whole run (the caller closes it)."""
    return remote.open_runner(inventory.ssh_config, connect_timeout=connect_timeout,
                              command_timeout=command_timeout,
                              accept_new_host_keys=accept_new_host_keys)


def lookup_on(runner, inventory, timeout: float = LOOKUP_TIMEOUT) -> Lookup:
    """A read-only command on an inventory host, over the runner."""

    def lookup(name: str, command: str):
        host = inventory.host(name)
        return runner.run(host.ssh, command, user=host.user, port=host.port, timeout=timeout)

    return lookup


def verified_host_key(runner, inventory):
    """Host name -> (type, base64) of the key the runner's connection to it
    verified against this machine's known_hosts."""

    def host_key(name: str) -> tuple[str, str]:
        host = inventory.host(name)
        key = runner.connect(host.ssh, host.user, host.port).get_transport().get_remote_server_key()
        return key.get_name(), key.get_base64()

    return host_key


def plan_fixes(report: DoctorReport, inventory, runner=None, options: dict | None = None) -> Plan:
    """The plan for a report's failing and warning checks (``options``:
    what the user asked of the fixes, e.g. ``mlx_version``)."""
    if runner is None:
        return build_plan(report.results, load_checks(), inventory, options=options)
    return build_plan(report.results, load_checks(), inventory, lookup_on(runner, inventory),
                      verified_host_key(runner, inventory), options)


# Why nothing was applied (FixOutcome.not_applied).
NOTHING_TO_FIX = "nothing here can be fixed by mlxcluster"
DRY_RUN = "dry run"
DECLINED = "the answer was no"


class FixView(Protocol):
    """What a fix run tells as it goes, and the one thing it asks."""

    def report(self, report: DoctorReport) -> None:
        """The verdict before anything changes."""

    def plan(self, plan: Plan, again: bool) -> None:
        """A plan (``again``: the second, for hosts the re-check judged first)."""

    def confirm(self, plan: Plan) -> bool:
        """The user's yes to apply ``plan`` (never asked with ``yes``)."""

    def applying(self) -> None:
        """Changes are about to be made."""

    def entry(self, entry: dict) -> None:
        """One change as journalled: applied, unchanged, failed or skipped."""


@dataclass
class FixRun:
    """What one fix run did: the reports, the outcome, and whether it is
    all fixed (the exit code's 0)."""

    before: DoctorReport
    after: DoctorReport | None  # None: nothing was applied
    outcome: FixOutcome
    ok: bool

    @property
    def last(self) -> DoctorReport:
        """The newest verdict on the cluster."""
        return self.after or self.before


def action_key(action: Action) -> str:
    """What makes two planned actions the same change."""
    return json.dumps([action.check, list(action.hosts), action.kind, action.params], sort_keys=True)


def fix_cluster(inventory, view: FixView, *, options: dict, wanted: dict | None = None, dry_run: bool = False,
                yes: bool = False, strict: bool = False, fix_timeout: float, connect_timeout: float,
                accept_new_host_keys: bool = False) -> FixRun:
    """Check, plan, ask, apply, check again (``options``: run_doctor's;
    ``wanted``: what the user asked of the fixes, e.g. ``mlx_version``)."""
    runner = open_runner(inventory, connect_timeout=connect_timeout, command_timeout=60.0,
                         accept_new_host_keys=accept_new_host_keys)
    try:
        before = run_doctor(inventory, runner=runner, **options)
        view.report(before)
        plan = plan_fixes(before, inventory, runner, wanted)
        view.plan(plan, again=False)

        def unapplied(why: str, ok: bool = False) -> FixRun:
            outcome = FixOutcome(list(plan.actions), left=problems(before.results), problems=list(plan.problems),
                                 not_applied=why)
            return FixRun(before, None, outcome, ok)

        if plan.empty:
            return unapplied(NOTHING_TO_FIX, ok=not (before.failed() or (strict and before.warned())))
        if dry_run:
            return unapplied(DRY_RUN)
        check_inventory_writable(plan)
        if not yes and not view.confirm(plan):
            return unapplied(DECLINED)
        proposed, plan_problems = list(plan.actions), list(plan.problems)
        journal = Journal.create(fixes_dir(), inventory.path, inventory.ssh_config)
        ctx = ApplyContext(runner, timeout=fix_timeout)
        entries, planned, tried = [], set(), set()
        for round_ in (1, 2):
            view.applying()
            entries += apply_plan(plan, journal, ctx, on_entry=view.entry)
            planned.update(plan.checks())
            tried.update(action_key(a) for a in plan.actions)
            inventory = load_inventory(inventory.path)
            after = run_doctor(inventory, runner=runner, **options)
            more = [a for a in plan_fixes(after, inventory, runner, wanted).actions if action_key(a) not in tried]
            if not more or round_ == 2:
                break
            plan = Plan(more, [])
            proposed += more
            view.plan(plan, again=True)
            check_inventory_writable(plan)
            if not yes and not view.confirm(plan):
                break
        changes = before_after(before.results, after.results)
        outcome = FixOutcome(proposed, entries, changes, problems(after.results), plan_problems, str(journal.path))
        return FixRun(before, after, outcome, all_fixed(planned, entries, changes, after.results, strict))
    finally:
        runner.close()


class _Where:
    """What ``open_runner`` reads of an inventory, from a journal."""

    def __init__(self, ssh_config: str | None):
        self.ssh_config = ssh_config


def undo_fixes(path: str, connect_timeout: float) -> list[tuple[dict, str, str]]:
    """Undo a journal: (entry, status, message) for each change, newest
    first; a connection is opened only when a change is on a host."""
    journal = read_journal(path)
    runners = []

    def runner_for():
        if not runners:
            runners.append(open_runner(_Where(journal.ssh_config), connect_timeout=connect_timeout,
                                       command_timeout=60.0))
        return runners[0]

    try:
        return undo_journal(journal, runner_for)
    finally:
        for r in runners:
            r.close()
