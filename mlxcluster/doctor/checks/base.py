"""Check types, the registry and the runner.

A check is a function ``(ctx: CheckContext) -> CheckResult`` registered with
``@check(id, title, live=...)``. ``live=True`` checks need reachable hosts and
are skipped on a replay (``doctor --from DIR``). A check that raises is
reported as ``crash`` and the others still run.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mlxcluster.facts.capture import HostCapture


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    CRASH = "crash"


@dataclass
class CheckResult:
    id: str
    title: str
    status: Status
    # Evidence per host name (or per pair "a -> b"); free text, one line ideally.
    hosts: dict[str, str] = field(default_factory=dict)
    hint: str | None = None
    # What the check's fix needs per host it blames (``doctor --fix``): a
    # name -> plain values; empty when nothing here can be fixed. Not in the
    # JSON document (the fix plan says it).
    fix_data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status.value,
            "hosts": dict(self.hosts),
            "hint": self.hint,
        }


@dataclass
class CheckContext:
    """Everything a check may look at. Checks never do I/O of their own
    except through ``services`` (live checks only)."""

    captures: dict[str, HostCapture]
    inventory: Any = None  # mlxcluster.inventory.inventory.Inventory | None
    live: bool = False
    backend: str | None = None  # the backend the user intends (ring, mpi, jaccl...)
    # Live helpers provided by the doctor driver (remote runner, ...).
    services: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


CheckFn = Callable[[CheckContext], CheckResult]


@dataclass(frozen=True)
class CheckSpec:
    id: str
    title: str
    fn: CheckFn
    live: bool = False
    # The check's fix (``mlxcluster.doctor.fixes.plan.Fix``), declared beside
    # it as its hint is; None: nothing here can fix it.
    fix: Any = None


REGISTRY: dict[str, CheckSpec] = {}


def check(check_id: str, title: str, *, live: bool = False, fix: Any = None) -> Callable[[CheckFn], CheckFn]:
    """Register a check under a unique id (kebab-case, documented in docs/doctor-checks.md),
    with its fix if it has one (``doctor --fix``)."""

    def register(fn: CheckFn) -> CheckFn:
        if check_id in REGISTRY:
            raise ValueError(f"duplicate check id {check_id}")
        REGISTRY[check_id] = CheckSpec(check_id, title, fn, live, fix)
        return fn

    return register


def run_checks(ctx: CheckContext, specs: Iterable[CheckSpec]) -> list[CheckResult]:
    """Run every check; a raising check becomes a CRASH result, never an abort."""
    results = []
    for spec in specs:
        if spec.live and not ctx.live:
            results.append(
                CheckResult(spec.id, spec.title, Status.SKIP, {},
                            "needs hosts reached over SSH (not run on a replay or --local)")
            )
            continue
        try:
            result = spec.fn(ctx)
        except Exception as exc:  # a broken check must not hide the others
            tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result = CheckResult(
                spec.id, spec.title, Status.CRASH, {"*": tail},
                "this is a bug in mlxcluster; please report it with 'doctor --collect'",
            )
        results.append(result)
    return results


def verdict(results: Iterable[CheckResult]) -> str:
    """'fail' if any check failed or crashed, else 'warn' if any warned, else 'pass'."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses or Status.CRASH in statuses:
        return "fail"
    if Status.WARN in statuses:
        return "warn"
    return "pass"
