"""One ``doctor --fix`` run's pieces the CLI calls in turn: the runner whose
connections the checks, the fixes and the re-check share, the plan from a
report (with read-only look-ups on the hosts), and the verdict before and
after.

    with open_runner(inventory, ...) as runner:
        before = run_doctor(inventory, runner=runner)
        plan = plan_fixes(before, inventory, runner)
        ... the CLI shows the plan and asks ...
        entries = apply_plan(plan, journal, ApplyContext(runner))
        after = run_doctor(load_inventory(inventory.path), runner=runner)
        changes = before_after(before, after, plan)
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.doctor import DoctorReport, load_checks
from mlxcluster.doctor.fixes.plan import Lookup, Plan, build_plan
from mlxcluster.ssh.remote import ParamikoRunner

LOOKUP_TIMEOUT = 20.0


def open_runner(inventory, *, connect_timeout: float, command_timeout: float,
                accept_new_host_keys: bool = False) -> ParamikoRunner:
    """The SSH runner of the whole run (the caller closes it)."""
    return ParamikoRunner(inventory.ssh_config, connect_timeout=connect_timeout,
                          command_timeout=command_timeout, accept_new_host_keys=accept_new_host_keys)


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
        if r.status in (Status.FAIL, Status.WARN, Status.CRASH):
            again = now.get(r.id)
            out.append(Change(r.id, r.title, r.status, again.status if again else None))
    return out


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
