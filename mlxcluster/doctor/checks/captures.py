"""What doctor read: every capture file readable, every inventory host captured,
every probe.json field of its type.

A check that finds nothing to look at skips, so without this check a replay
of a folder whose files are corrupt (or that lacks some of the inventory's
hosts) would pass having checked nothing. On a live run, a host that could
not be probed is the SSH checks' finding, not this one's.
"""

from __future__ import annotations

from pathlib import Path

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    BAD,
    WARN,
    Verdict,
    doctor_check,
    host_facts_of,
    join_hosts,
    worst,
)
from mlxcluster.facts.capture import PROBE


def _folder(ctx: CheckContext) -> str:
    """The capture folder the replayed hosts were read from."""
    sources = {str(Path(c.source).parent) for c in ctx.captures.values() if c.source}
    return sources.pop() if len(sources) == 1 else "the capture folder"


@doctor_check("captures-readable", "Every capture file readable, every inventory host captured")
def captures_readable(ctx: CheckContext) -> Verdict:
    replay = bool(ctx.options.get("replay"))
    evidence: dict[str, str] = {}
    unreadable, unprobed, missing, wrong_typed = [], [], [], []
    facts = host_facts_of(ctx)
    for name, capture in ctx.captures.items():
        problems = [f"{capture.path(f)}: {why}" for f, why in capture.problems().items()]
        if problems:
            unreadable.append(name)
        if replay and capture.error:
            problems.append(f"not probed when the folder was collected: {capture.error}")
            unprobed.append(name)
        failing = bool(problems)
        if facts[name].problems:  # wrong-typed fields: the rest of the probe was read
            problems.append(f"{capture.path(PROBE)}: " + "; ".join(facts[name].problems) + " (read as unknown)")
            wrong_typed.append(name)
        if problems:
            evidence[name] = (BAD if failing else WARN) + "; ".join(problems)
        else:
            evidence[name] = ", ".join(capture.files) or "nothing captured"
    if replay and ctx.inventory is not None:
        folder = _folder(ctx)
        for host in ctx.inventory.hosts:
            if host.name not in ctx.captures:
                evidence[host.name] = BAD + f"in the inventory, but {folder} has no folder {host.name}/"
                missing.append(host.name)
    hints = []
    if unreadable:
        hints.append(f"the files named on {join_hosts(unreadable)} are not their command's output (truncated, "
                     "edited or binary): collect those hosts again (doctor -i INVENTORY --collect NEWDIR)")
    if unprobed:
        hints.append(f"{join_hosts(unprobed)} could not be probed when the folder was collected: fix the "
                     "error shown and collect again")
    if missing:
        hints.append(f"nothing was checked on {join_hosts(missing)}: collect every inventory host "
                     "(doctor -i INVENTORY --collect NEWDIR), or pass the inventory this folder was collected with")
    if wrong_typed:
        hints.append(f"{join_hosts(wrong_typed)}: the probe.json fields named have the wrong type (an edited "
                     "or foreign file?), so the checks that need them saw nothing there: collect those hosts again")
    return Verdict(worst(bool(unreadable or unprobed or missing), bool(wrong_typed)), evidence,
                   "; ".join(hints) or None)
