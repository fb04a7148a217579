"""What one ``doctor --fix`` run did, as one value: made by the fix session
(``session.py``), rendered by the CLI and read by the HTML report
(``report/fix_view.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.fixes.plan import Action

PROBLEM_STATUSES = (Status.FAIL, Status.CRASH, Status.WARN)


@dataclass
class Change:
    check: str
    title: str
    before: Status
    after: Status | None  # None: the check did not run again

    @property
    def fixed(self) -> bool:
        return self.after in (Status.PASS, Status.SKIP)


def before_after(before: list[CheckResult], after: list[CheckResult]) -> list[Change]:
    """Every check that failed or warned before, with its verdict after."""
    now = {r.id: r for r in after}
    out = []
    for r in before:
        if r.status in PROBLEM_STATUSES:
            again = now.get(r.id)
            out.append(Change(r.id, r.title, r.status, again.status if again else None))
    return out


def problems(results: list[CheckResult]) -> list[CheckResult]:
    """The results that fail, crashed or warn: what is left for the user."""
    return [r for r in results if r.status in PROBLEM_STATUSES]


def all_fixed(planned: set[str], entries: list[dict], changes: list[Change], after: list[CheckResult],
              strict: bool = False) -> bool:
    """True when every action applied worked, every check a plan was for
    (``planned``) passes now, and nothing fails (nor warns, with ``strict``)."""
    if any(e["status"] not in ("applied", "unchanged") for e in entries):
        return False
    if any(c.check in planned and not c.fixed for c in changes):
        return False
    bad = (Status.FAIL, Status.CRASH) + ((Status.WARN,) if strict else ())
    return not any(r.status in bad for r in after)


@dataclass
class FixOutcome:
    """What one ``--fix`` run did, for the report: the plan(s) shown, each
    change as journalled (the plan's order), the verdict before and after,
    and what is left for the user (with its hint: the steps)."""

    planned: list[Action]  # every change proposed (both rounds)
    entries: list[dict] = field(default_factory=list)  # journal entries: applied / unchanged / failed / skipped
    changes: list[Change] = field(default_factory=list)  # before -> after per check that failed or warned
    left: list[CheckResult] = field(default_factory=list)  # failing or warning after (or before, when not applied)
    problems: list[tuple[str, str]] = field(default_factory=list)  # fixes that could not be planned
    journal: str | None = None  # its path; None: nothing was applied
    not_applied: str = ""  # why nothing was applied: "dry run", "answered no", "nothing to fix"
