"""What one ``doctor --fix`` run did, as one value: made by the CLI as it
goes, read by the HTML report (``report/fix_view.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcluster.doctor.checks.base import CheckResult
from mlxcluster.doctor.fixes.plan import Action
from mlxcluster.doctor.fixes.session import Change


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
