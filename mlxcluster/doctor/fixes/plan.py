"""The fix plan: what ``doctor --fix`` will change, built from a report.

A check declares its fix beside it, as it declares its hint
(``@doctor_check(..., fix=SOME_FIX)``), and puts in its verdict's
``fix_data`` what that fix needs for each host it blames. ``build_plan``
asks each failing or warning check's fix for its ``Action``s, only for those
hosts: a fix never runs where its check passed.

An action is one change: the hosts it is for, one line saying what changes,
the exact commands (run on the host over SSH for ``where == "host"``; for a
change made on this machine, the edit as words), and what its applier
(``apply.APPLIERS[kind]``) needs in ``params`` (plain JSON values: the
journal keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from mlxcluster.doctor.checks.base import CheckResult, CheckSpec, Status
from mlxcluster.ssh.results import CommandResult

# Kinds of action, in the order they are applied: host keys first (the other
# fixes need the connections they allow), then the inventory, then commands
# on the hosts, host by host; mlx installed last (the longest), then mlx-lm
# (its install keeps the mlx the host has then).
KIND_ORDER = ("known-host", "inventory-env", "remote", "ssh-trust", "trainer-install", "mlx-install",
              "mlx-lm-install")


@dataclass
class Action:
    check: str  # the id of the check it fixes
    hosts: tuple[str, ...]  # the inventory hosts it is for
    kind: str  # one of KIND_ORDER
    what: str  # one line: what changes
    commands: list[str]  # the exact commands (or, made here, the edit)
    where: str = "host"  # "host": over SSH on its hosts; "here": on this machine; "hosts": on several
    params: dict[str, Any] = field(default_factory=dict)
    sudo: bool = False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["hosts"] = list(self.hosts)
        return out


# A read-only command on a host at planning time (host name, command): how a
# fix finds what the probe did not report (where OpenBLAS is).
Lookup = Callable[[str, str], CommandResult]


@dataclass
class FixInput:
    result: CheckResult
    inventory: Any  # mlxcluster.inventory.inventory.Inventory
    lookup: Lookup | None = None
    # host name -> (key type, base64) of the host key this machine's
    # connection verified (host-to-host: what the first host should trust).
    host_key: Callable[[str], tuple[str, str]] | None = None
    # What the user asked of the fixes (doctor's flags: "mlx_version").
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fix:
    """A check's fix: ``plan`` turns its result into actions."""

    what: str  # one line for docs and the plan's heading
    plan: Callable[[FixInput], list[Action]]


@dataclass
class Plan:
    actions: list[Action]
    # Failing or warning checks nothing here fixes (no fix, or hosts it
    # cannot fix): "left for you", with their hints.
    left: list[CheckResult]
    # Fixes that could not be planned: (check id, why).
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.actions

    def checks(self) -> list[str]:
        return list(dict.fromkeys(a.check for a in self.actions))


def _needs_fixing(result: CheckResult) -> bool:
    return result.status in (Status.FAIL, Status.WARN, Status.CRASH)


def build_plan(results: Iterable[CheckResult], specs: Iterable[CheckSpec], inventory,
               lookup: Lookup | None = None, host_key: Callable[[str], tuple[str, str]] | None = None,
               options: dict[str, Any] | None = None) -> Plan:
    """Every action the failing and warning checks' fixes propose, in the
    order they are applied, and the checks left for the user."""
    fixes = {s.id: s.fix for s in specs}
    actions: list[Action] = []
    left: list[CheckResult] = []
    problems: list[tuple[str, str]] = []
    for result in results:
        if not _needs_fixing(result):
            continue
        fix = fixes.get(result.id)
        if fix is None or not result.fix_data or result.status is Status.CRASH:
            left.append(result)
            continue
        try:
            proposed = fix.plan(FixInput(result, inventory, lookup, host_key, dict(options or {})))
        except Exception as exc:  # a broken fix must not hide the others; said, not applied
            problems.append((result.id, f"{type(exc).__name__}: {exc}"))
            left.append(result)
            continue
        allowed = set(result.fix_data)
        kept = [a for a in proposed if a.hosts and set(a.hosts) <= allowed]
        actions.extend(kept)
        covered = {h for a in kept for h in a.hosts}
        blamed = {h for h, text in result.hosts.items() if text.startswith(("✗ ", "! "))}
        if not kept or blamed - covered:
            left.append(result)
    actions.sort(key=lambda a: KIND_ORDER.index(a.kind))  # stable: keeps the checks' order
    return Plan(actions, left, problems)
