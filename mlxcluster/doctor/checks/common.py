"""Helpers shared by doctor's check modules.

A doctor check returns ``Verdict(status, evidence, hint)``; ``doctor_check``
registers it and wraps it into a ``CheckResult`` with its id and title.
Evidence is one line per host; the hosts a check blames start with
``BAD`` (fail) or ``WARN`` (warn) so both the text and the JSON output say
which host is at fault.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxcluster.doctor.checks.base import CheckContext, CheckResult, Status, check
from mlxcluster.facts.capture import PROBE
from mlxcluster.facts.facts import HostFacts, all_facts

BAD = "✗ "
WARN = "! "


@dataclass
class Verdict:
    status: Status
    evidence: dict[str, str] = field(default_factory=dict)
    hint: str | None = None
    fix_data: dict[str, Any] = field(default_factory=dict)  # host -> what the check's fix needs


def doctor_check(check_id: str, title: str, *, live: bool = False, fix: Any = None):
    """Register ``fn(ctx) -> Verdict`` as check ``check_id``; ``fix`` (a
    ``mlxcluster.doctor.fixes.plan.Fix``) is what ``doctor --fix`` does for
    the hosts in the verdict's ``fix_data``."""

    def register(fn: Callable[[CheckContext], Verdict]):
        def run(ctx: CheckContext) -> CheckResult:
            v = fn(ctx)
            # Evidence in inventory/capture order, whatever order the check filled it in.
            order = list(ctx.captures) + [k for k in v.evidence if k not in ctx.captures]
            evidence = {k: v.evidence[k] for k in order if k in v.evidence}
            return CheckResult(check_id, title, v.status, evidence, v.hint, dict(v.fix_data))

        run.__name__ = fn.__name__
        run.__module__ = fn.__module__
        run.__doc__ = fn.__doc__
        check(check_id, title, live=live, fix=fix)(run)
        return fn

    return register


def host_facts_of(ctx: CheckContext) -> dict[str, HostFacts]:
    """Facts for every host (parsed once per doctor run)."""
    if "facts" not in ctx.services:
        ctx.services["facts"] = all_facts(ctx.captures)
    return ctx.services["facts"]


def probed_hosts(ctx: CheckContext) -> dict[str, HostFacts]:
    """Facts of the hosts whose probe ran."""
    return {n: f for n, f in host_facts_of(ctx).items() if f.probed}


def unprobed_evidence(ctx: CheckContext) -> dict[str, str]:
    """'not probed: why' for each host without probe output (blamed elsewhere)."""
    out = {}
    for name, capture in ctx.captures.items():
        if capture.probe() is None:
            out[name] = f"not probed ({_why_unprobed(capture)})"
    return out


def _why_unprobed(capture) -> str:
    if capture.error:
        return capture.error
    if capture.text(PROBE) is not None:
        return f"{PROBE} unreadable, see captures-readable"
    return f"no {PROBE}"


def majority(values: dict[str, object]) -> object:
    """The most common value (ties: the first host's)."""
    counts = Counter(values.values())
    best = max(counts.values())
    return next(v for v in values.values() if counts[v] == best)


def host_order(name: str) -> list:
    """Sort key that puts studio-2 before studio-10 (numbers compared as numbers)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def join_hosts(names) -> str:
    return ", ".join(sorted(names, key=host_order))


def from_hosts(sources, everyone) -> str:
    """``sources`` as words: "every other host (15)" when it is all of ``everyone``."""
    sources = set(sources)
    if len(sources) > 2 and sources == set(everyone):
        return f"every other host ({len(sources)})"
    return join_hosts(sources)


_SLOT = "\0"  # where a fix named its host, while fixes are compared


def _host_taken_out(fix: str, target: str) -> str:
    """``fix`` with each whole-word ``target`` replaced by _SLOT (10.0.0.2 in
    'root@10.0.0.2' is one; 10.0.0.2 in 10.0.0.21 is not)."""
    return re.sub(rf"(?<![\w.-]){re.escape(target)}(?![\w.-])", _SLOT, fix)


def grouped_fixes(fixes) -> str | None:
    """Each distinct fix once, naming every host it is for.

    ``fixes``: ``(host, fix, target)`` triples; ``target`` is the text the fix
    was written for (host name, IP or ssh target as it appears in ``fix``) or
    None. Fixes that differ only in it are one fix: eight hosts with an
    unknown key give one "for each HOST in a, b, ...: run 'ssh HOST' once ..."
    instead of eight sentences. A fix that does not name its host gets the
    hosts in front ("a, b: host down or ..."). None when there is no fix.
    """
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for host, fix, target in fixes:
        if not fix:
            continue
        template = _host_taken_out(fix, target) if target else fix
        members = groups.setdefault(template, [])
        entry = (host, target if _SLOT in template else None)
        if entry not in members:
            members.append(entry)
    sentences = []
    for template, members in groups.items():
        if _SLOT in template:
            targets = list(dict.fromkeys(t for _, t in members))
            sentences.append(template.replace(_SLOT, targets[0]) if len(targets) == 1 else
                             f"for each HOST in {join_hosts(targets)}: {template.replace(_SLOT, 'HOST')}")
        else:
            sentences.append(f"{join_hosts(dict.fromkeys(h for h, _ in members))}: {template}")
    return "; ".join(sentences) or None


def readable_text(capture, file: str) -> str | None:
    """``file``'s text from one host's captures; None when not captured or unreadable
    (its problem is captures-readable's finding)."""
    return None if file in capture.problems() else capture.text(file)


def captured_texts(ctx: CheckContext, file: str) -> tuple[dict[str, str], list[str]]:
    """Host -> readable text of ``file``, and the hosts without one, in capture order."""
    texts, missing = {}, []
    for name, capture in ctx.captures.items():
        text = readable_text(capture, file)
        if text is None:
            missing.append(name)
        else:
            texts[name] = text
    return texts, missing


def skip(reason: str, evidence: dict[str, str] | None = None) -> Verdict:
    return Verdict(Status.SKIP, evidence or {}, reason)


def worst(blamed_fail: bool, blamed_warn: bool) -> Status:
    if blamed_fail:
        return Status.FAIL
    if blamed_warn:
        return Status.WARN
    return Status.PASS
