"""What the launch path reports while it works, for the CLI to render.

The library never prints: the preflight, the data sync and the restart loop
hand each step, as it happens, to an ``on_event`` callback as one of these
values; `mlxcluster run` and `train` render them (cli/job_launch.py
``EventView``), a test can collect them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the events carry these values, never import their modules
    from mlxcluster.doctor.checks.base import CheckResult
    from mlxcluster.jobs.stall import Stalled
    from mlxcluster.jobs.watch import RunOutcome


@dataclass(frozen=True)
class Note:
    """A line of progress (stdout)."""

    text: str


@dataclass(frozen=True)
class Aside:
    """A line beside the job's own output (stderr): where the job's settings
    came from (the inventory found by default, what tune recorded)."""

    text: str


@dataclass(frozen=True)
class Warned:
    """Something the user should know that does not stop the job (stderr)."""

    text: str


@dataclass(frozen=True)
class Checked:
    """One preflight verdict: ``mark`` "ok" ([✓]), "warn" ([!]) or "fail" ([✗])."""

    mark: str
    text: str


@dataclass(frozen=True)
class ChecksFailed:
    """Doctor's failing checks, found by the preflight (each with its hosts and fix)."""

    results: tuple[CheckResult, ...]


@dataclass(frozen=True)
class LaunchFailed:
    """A launch that failed and is launched again (--max-restarts): said as
    a failure is, before the restart."""

    outcome: RunOutcome


@dataclass(frozen=True)
class StallFailed:
    """A launch that stalled and is launched again."""

    error: Stalled


@dataclass(frozen=True)
class Restarting:
    """Restart ``done`` of ``max_restarts`` is coming, after ``cause``."""

    done: int
    max_restarts: int
    cause: str


@dataclass(frozen=True)
class Sending:
    """Files of ``total`` bytes start on their way to ``host``."""

    host: str
    total: int


@dataclass(frozen=True)
class SendProgress:
    """``done`` of the bytes announced by ``Sending`` have reached ``host``."""

    host: str
    done: int


@dataclass(frozen=True)
class SendEnded:
    """The transfer to ``host`` is over (well or not)."""

    host: str


OnEvent = Callable[[object], None]


def ignore(event: object) -> None:
    """An ``on_event`` for callers that show nothing."""
