"""What the page shows of a ``doctor --fix`` run: each change with its host,
status, commands and output; each check that failed or warned, before and
after; what is left for the user, with the steps (the check's hint).

Plain strings for the template (autoescaped there): commands and outputs
come from hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.fixes.outcome import FixOutcome
from mlxcluster.report.doctor_view import STATUS

# Journal status -> css class.
ENTRY_CSS = {"applied": "pass", "unchanged": "skip", "failed": "fail", "skipped": "warn", "planned": "skip"}


@dataclass
class ChangeRow:
    status: str  # applied / unchanged / failed / skipped / planned (not applied)
    css: str
    check: str
    hosts: str
    what: str
    commands: list[str]
    output: str  # shown for failed and skipped changes (sudo's refusal with the commands to run by hand)


@dataclass
class VerdictRow:
    check: str
    title: str
    before: tuple[str, str, str]  # (mark, css, word)
    after: tuple[str, str, str]
    fixed: bool


@dataclass
class LeftRow:
    check: str
    title: str
    css: str
    word: str
    hosts: list[tuple[str, str]]  # only the hosts it blames
    steps: str | None


@dataclass
class FixView:
    summary: str
    css: str  # pass / warn / fail
    changes: list[ChangeRow]
    verdicts: list[VerdictRow]
    left: list[LeftRow]
    problems: list[tuple[str, str]]
    journal: str | None
    by_host: list[tuple[str, str]]  # host -> "2 applied, 1 failed"


NOT_RUN = ("–", "skip", "not run again")


def _rows(outcome: FixOutcome) -> list[ChangeRow]:
    if outcome.entries:
        return [ChangeRow(e["status"], ENTRY_CSS.get(e["status"], "skip"), e["check"], ", ".join(e["hosts"]),
                          e["what"], list(e.get("commands") or []),
                          e.get("output", "") if e["status"] in ("failed", "skipped") else "")
                for e in outcome.entries]
    return [ChangeRow("planned", "skip", a.check, ", ".join(a.hosts), a.what, list(a.commands), "")
            for a in outcome.planned]


def _blamed(hosts: dict[str, str]) -> list[tuple[str, str]]:
    bad = [(h, t) for h, t in hosts.items() if t.startswith(("✗ ", "! "))]
    return bad or list(hosts.items())


def fix_view(outcome: FixOutcome) -> FixView:
    changes = _rows(outcome)
    counts: dict[str, dict[str, int]] = {}
    for e in outcome.entries:
        for h in e["hosts"]:
            per = counts.setdefault(h, {})
            per[e["status"]] = per.get(e["status"], 0) + 1
    by_host = [(h, ", ".join(f"{n} {s}" for s, n in per.items())) for h, per in counts.items()]
    verdicts = [VerdictRow(c.check, c.title, STATUS[c.before], STATUS[c.after] if c.after else NOT_RUN, c.fixed)
                for c in outcome.changes]
    left = [LeftRow(r.id, r.title, STATUS[r.status][1], STATUS[r.status][2], _blamed(r.hosts), r.hint)
            for r in outcome.left if r.status in (Status.FAIL, Status.CRASH, Status.WARN)]
    failed = sum(1 for e in outcome.entries if e["status"] in ("failed", "skipped"))
    applied = sum(1 for e in outcome.entries if e["status"] == "applied")
    if outcome.not_applied:
        summary = (f"nothing was changed ({outcome.not_applied}); "
                   f"{len(outcome.planned)} change(s) planned" if outcome.planned else
                   f"nothing was changed ({outcome.not_applied})")
        css = "warn" if outcome.planned or left else "pass"
    else:
        hosts = sorted({h for e in outcome.entries if e["status"] == "applied" for h in e["hosts"]})
        summary = (f"{applied} change(s) applied" + (f" on {', '.join(hosts)}" if hosts else "")
                   + (f"; {failed} failed or skipped" if failed else "")
                   + f"; {sum(v.fixed for v in verdicts)} of {len(verdicts)} check(s) pass after")
        css = "fail" if failed or any(v.after[1] == "fail" for v in verdicts) else ("warn" if left else "pass")
    return FixView(summary, css, changes, verdicts, left, list(outcome.problems), outcome.journal, by_host)
