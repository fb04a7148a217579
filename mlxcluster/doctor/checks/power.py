"""Power checks (macOS): a host that goes to sleep mid-job hangs every rank."""

from __future__ import annotations

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    WARN,
    Verdict,
    doctor_check,
    join_hosts,
    probed_hosts,
    skip,
    unprobed_evidence,
    worst,
)
from mlxcluster.facts.facts import parse_pmset


@doctor_check("host-sleep", "Hosts do not go to sleep when idle (macOS pmset)")
def host_sleep(ctx: CheckContext) -> Verdict:
    macs = {n: f for n, f in probed_hosts(ctx).items() if f.platform == "darwin"}
    if not macs:
        return skip("no macOS host probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    sleepy = []
    for n, f in probed_hosts(ctx).items():
        if n not in macs:
            evidence[n] = "not macOS"
            continue
        if not f.pmset:
            evidence[n] = "pmset -g output missing"
            continue
        p = parse_pmset(f.pmset)
        if p["sleep_disabled"]:
            evidence[n] = "sleep disabled (pmset disablesleep 1)"
        elif p["sleep_minutes"]:
            evidence[n] = WARN + f"system sleeps after {p['sleep_minutes']} min idle"
            sleepy.append(n)
        elif p["sleep_minutes"] == 0:
            evidence[n] = "never sleeps (sleep 0)"
        else:
            evidence[n] = "sleep setting not found in pmset -g"
    hint = None
    if sleepy:
        hint = (f"on {join_hosts(sleepy)}: sudo pmset -a sleep 0 (keeps the display setting), "
                "or run jobs under 'caffeinate -s'; a sleeping host hangs every rank")
    return Verdict(worst(False, bool(sleepy)), evidence, hint)
