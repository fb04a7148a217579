"""The macOS application firewall against the ranks' listening python.

Every rank of ring (and MPI's TCP transport) listens on a port that the other
hosts connect to; the application firewall judges the program that listens.
What is sourced (docs/doctor-checks.md "macos-firewall"): a python listed as "Block
incoming connections" has every inbound connection cut (a public incident
write-up: ``OSError: [Errno 57] Socket is not connected`` on the first read,
loopback unaffected); "block all incoming connections" blocks all but basic
services; a python not in the list makes macOS ask on the Mac's screen the
first time it receives a connection, and connections fail while nobody has
answered (measured on macOS 27 by another project). The last is a warning: a
validly signed python may be let in by "Automatically allow downloaded signed
software", which the probe does not read.
"""

from __future__ import annotations

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    BAD,
    WARN,
    Verdict,
    doctor_check,
    join_hosts,
    probed_hosts,
    skip,
    unprobed_evidence,
    worst,
)
from mlxcluster.doctor.fixes.macos import FIREWALL_ALLOW, SOCKETFILTERFW
from mlxcluster.facts import macos_firewall as fw


def judge(facts) -> tuple[str, str, dict | None]:
    """(level "" / "warn" / "fail", evidence, fix_data or None) of one Mac."""
    state = fw.parse_global_state(facts.firewall)
    if state is None:
        return "", f"firewall state not read ({facts.firewall or 'no socketfilterfw --getglobalstate output'})", None
    if state == fw.OFF:
        return "", "firewall off", None
    app = facts.firewall_app
    if state == fw.BLOCK_ALL or fw.parse_block_all(app.get("blockall")):
        return "fail", ("firewall on with 'Block all incoming connections': every rank's listener is "
                        "cut off, whatever the app list says"), None
    path = app.get("path")
    entries = fw.parse_listapps(app.get("listapps"))
    if not path or entries is None:
        return "", "firewall on; the python's rule was not read (socketfilterfw --listapps)", None
    paths = list(dict.fromkeys(p for p in (path, app.get("executable")) if p))
    rule = fw.app_rule(entries, paths)
    if rule is False or fw.parse_app_blocked(app.get("appblocked"), path):
        return "fail", f"firewall on; {path} is set to block incoming connections", \
            {"path": path, "listed": rule is not None}
    if rule:
        return "", f"firewall on; {path} allowed (in its list)", None
    return "warn", (f"firewall on; {path} is not in its list: macOS asks on the Mac's screen the first "
                    "time a rank listens, and connections fail until someone clicks Allow"), \
        {"path": path, "listed": False}


@doctor_check("macos-firewall", "The macOS firewall lets the ranks' python accept connections",
              fix=FIREWALL_ALLOW)
def macos_firewall(ctx: CheckContext) -> Verdict:
    macs = {n: f for n, f in probed_hosts(ctx).items() if f.platform == "darwin"}
    if not macs:
        return skip("no macOS host probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    blamed: dict[str, list[str]] = {"fail": [], "warn": []}
    block_all, fix_data = [], {}
    for n, f in probed_hosts(ctx).items():
        if n not in macs:
            evidence[n] = "not macOS"
            continue
        level, text, data = judge(f)
        evidence[n] = {"fail": BAD, "warn": WARN}.get(level, "") + text
        if level:
            blamed[level].append(n)
            if data is None:
                block_all.append(n)
            else:
                fix_data[n] = data
    hint = None
    if fix_data or block_all:
        steps = [f"on {n}: sudo {SOCKETFILTERFW} --add {d['path']} --unblockapp {d['path']}"
                 for n, d in fix_data.items()]
        if block_all:
            steps.append(f"on {join_hosts(block_all)}: turn off 'Block all incoming connections' "
                         f"(System Settings > Network > Firewall > Options, or sudo {SOCKETFILTERFW} "
                         "--setblockall off)")
        hint = "; ".join(steps) + " (or doctor --fix); then start the job again"
    return Verdict(worst(bool(blamed["fail"]), bool(blamed["warn"])), evidence, hint, fix_data)
