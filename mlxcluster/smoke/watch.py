"""Fold the workers' events and the launcher's output into per-rank states,
and turn them into verdicts: who failed, who hung, who was only stopped.

Pure logic apart from ``probe_port`` (a bounded TCP connect used as evidence
when a run hangs); the clock is injected.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxcluster.jobs.cleanup import SSH_LOST
from mlxcluster.jobs.plan import LaunchPlan
from mlxcluster.jobs.watch import parse_launcher_exit
from mlxcluster.smoke.soak import SoakWatch
from mlxcluster.smoke.stats import BenchRow, summarize

PREFIX = "MLXSMOKE "
HEARTBEAT_SILENCE_S = 5.0  # no line from a rank this long: it is gone or unreachable
PROBE_TIMEOUT_S = 1.5
STDERR_KEEP = 200  # launcher stderr lines kept for the report


@dataclass
class RankState:
    """What the driver knows of one rank while the run goes on."""

    rank: int
    host: str
    phase: str = "init"
    phase_since: float = 0.0
    last_seen: float = 0.0
    step: str = ""
    steps: int = 0
    ready: bool = False
    done: bool = False
    ok: bool = True
    exit_code: int | None = None  # reported by the worker itself
    launcher_code: int | None = None  # from the launcher's stderr (signal: negative)
    errors: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    checks: int = 0
    failed_at: float | None = None  # when the first sign of failure arrived

    def mark_failed(self, now: float) -> None:
        if self.failed_at is None:
            self.failed_at = now


@dataclass
class RankOutcome:
    """One rank's verdict in the report."""

    rank: int
    host: str
    status: str  # passed | failed | hung | exited | stopped
    detail: str = ""
    cause: bool = False  # the rank whose failure came first (the one to look at)
    failures: list[dict] = field(default_factory=list)
    stderr_tail: str = ""


def parse_event(line: str) -> dict | None:
    """The JSON object of a protocol line (the prefix may follow other text
    when ranks share a pipe), or None."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        event = json.loads(line[at + len(PREFIX):])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def probe_port(ip: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str:
    """'open', 'refused' or 'timed out' / the error: can this machine reach ip:port?"""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timed out"
    except OSError as err:
        return err.strerror or str(err)


class Watch:
    """Folds worker events and launcher lines into per-rank states."""

    def __init__(self, plan: LaunchPlan, clock: Callable[[], float]):
        self.clock = clock
        now = clock()
        self.ranks = [RankState(r, h.name, phase_since=now, last_seen=now)
                      for r, h in enumerate(plan.hosts)]
        self.bench: dict[tuple[str, str, int], dict[int, list[float]]] = {}
        self.stderr_lines: list[str] = []
        self.soak = SoakWatch()
        self._pending_mpi: list[int | None] = [None]

    def rank(self, event: dict) -> RankState | None:
        r = event.get("rank")
        return self.ranks[r] if isinstance(r, int) and 0 <= r < len(self.ranks) else None

    def on_stdout(self, line: str) -> None:
        event = parse_event(line)
        if event is None:
            return
        state = self.rank(event)
        if state is None:
            return
        now = self.clock()
        state.last_seen = now
        kind = event["event"]
        if kind == "ready":
            state.ready = True
            state.phase, state.phase_since = "ready", now
        elif kind == "phase":
            state.phase, state.phase_since = event.get("phase", "?"), now
        elif kind == "heartbeat":
            if event.get("step") != state.step:
                state.step = event.get("step", "")
                state.steps += 1
        elif kind == "check":
            state.checks += 1
            state.steps += 1
            if not event.get("ok"):
                state.ok = False
                state.failures.append(event)
                state.mark_failed(now)
        elif kind == "bench":
            state.steps += 1
            key = (event["op"], event["dtype"], int(event["bytes"]))
            self.bench.setdefault(key, {})[state.rank] = list(event["times"])
        elif kind == "soak":
            # A soak stays in one phase: each reported iteration restarts the
            # deadline, so --phase-timeout bounds one iteration, not the whole soak.
            self.soak.add(event)
            state.steps += 1
            state.phase_since = now
        elif kind == "error":
            state.ok = False
            state.errors.append(event.get("message", "error"))
            state.mark_failed(now)
        elif kind == "exit":
            state.exit_code = event.get("code")
            if state.exit_code:
                state.mark_failed(now)
        elif kind == "done":
            state.done = True
            state.ok = state.ok and bool(event.get("ok"))

    def on_stderr(self, line: str) -> None:
        self.stderr_lines.append(line)
        del self.stderr_lines[:-STDERR_KEEP]
        found = parse_launcher_exit(line, self._pending_mpi)
        if found:
            rank, code = found
            if 0 <= rank < len(self.ranks):
                state = self.ranks[rank]
                state.launcher_code = code if code is not None else -9
                if not state.done:
                    state.mark_failed(self.clock())

    def first_failure(self) -> RankState | None:
        """A rank that failed (error, wrong element, non-zero exit, exit without done)."""
        for state in self.ranks:
            if state.errors or not state.ok:
                return state
            if state.exit_code not in (None, 0) or (state.exit_code == 0 and not state.done):
                return state
            if state.launcher_code is not None and not state.done:
                return state
        return None

    def overdue(self, timeout_s: float) -> list[RankState]:
        """Ranks that have been in one phase longer than the deadline."""
        now = self.clock()
        return [s for s in self.ranks if not s.done and now - s.phase_since > timeout_s]

    def all_done(self) -> bool:
        return all(s.done for s in self.ranks)


def blame_hang(watch: Watch, plan: LaunchPlan, timeout_s: float) -> list[RankOutcome]:
    """Name the ranks behind a hang: silent ranks first (process gone or host
    unreachable), else those furthest behind; a data port this machine cannot
    reach while the others answer is named as evidence."""
    now = watch.clock()
    pending = [s for s in watch.ranks if not s.done]
    silent = [s for s in pending if now - s.last_seen > HEARTBEAT_SILENCE_S]
    least = min(s.steps for s in pending)
    behind = [s for s in pending if s.steps == least]
    probes = [probe_port(ip, port) for ip, port in plan.data_ports]
    unreachable = [r for r, p in enumerate(probes) if p not in ("open", "refused")]
    blamed: list[RankState]
    if unreachable and len(unreachable) < len(probes):
        blamed = [watch.ranks[r] for r in unreachable]
    elif silent and len(silent) < len(pending):
        blamed = silent
    elif len(behind) < len(pending):
        blamed = behind
    else:
        blamed = pending
    outcomes = []
    for state in blamed:
        ip, port = plan.data_ports[state.rank]
        why = f"no progress for {timeout_s:.0f} s in phase {state.phase}"
        if state.step:
            why += f" (step: {state.step})"
        if now - state.last_seen > HEARTBEAT_SILENCE_S:
            why += f"; silent for {now - state.last_seen:.0f} s"
        probe = probes[state.rank]
        if probe not in ("open", "refused"):
            why += f"; data port {ip}:{port} unreachable from here ({probe})"
        outcomes.append(RankOutcome(state.rank, state.host, "hung", why))
    return outcomes


def describe_failure(state: RankState) -> str:
    """One line on why a rank failed."""
    if state.failures:
        f = state.failures[0]
        where = f"{f['op']} {f['dtype']} size {f['size']}"
        if "peer" in f:
            where += f" from rank {f['peer']}"
        more = f" (+{len(state.failures) - 1} more)" if len(state.failures) > 1 else ""
        return (f"wrong result in {where}: first bad index {f.get('bad_index')}, "
                f"got {f.get('got')}, expected {f.get('expected')}{more}")
    if state.errors:
        return state.errors[0]
    code = state.exit_code if state.exit_code not in (None, 0) else state.launcher_code
    if code == SSH_LOST:
        return (f"its ssh connection failed or was lost in phase {state.phase} (exit 255, ssh's "
                "code: the host stopped answering, went to sleep or lost its link)")
    if code is not None and code < 0:
        return f"killed by signal {-code} in phase {state.phase}"
    if code is not None:
        return f"exited with code {code} in phase {state.phase}"
    return f"exited before finishing (phase {state.phase})"


def outcomes(watch: Watch, blamed: list[RankOutcome], tails: dict[int, str]) -> list[RankOutcome]:
    """Every rank's outcome: hung (blamed for a hang), failed (wrong result or
    error), exited (died on its own), stopped (ended because another rank
    failed), or passed."""
    by_rank = {o.rank: o for o in blamed}
    result = []
    for s in watch.ranks:
        if s.rank in by_rank:
            out = by_rank[s.rank]
        elif s.done and s.ok and not s.errors:
            out = RankOutcome(s.rank, s.host, "passed")
        elif s.failures or s.errors:
            out = RankOutcome(s.rank, s.host, "failed", describe_failure(s), failures=s.failures)
        elif s.exit_code not in (None, 0) or (s.launcher_code or 0) > 0:
            out = RankOutcome(s.rank, s.host, "exited", describe_failure(s))
        else:
            out = RankOutcome(s.rank, s.host, "stopped", f"stopped in phase {s.phase}")
        out.stderr_tail = tails.get(s.rank, "")
        result.append(out)
    if not any(o.status in ("failed", "hung", "exited") for o in result):
        # Nobody reported a cause: every unfinished rank is a suspect.
        last = watch.stderr_lines[-1] if watch.stderr_lines else "no output"
        for o in result:
            if o.status == "stopped":
                o.status = "exited"
                o.detail = f"{describe_failure(watch.ranks[o.rank])}; launcher: {last}"
    mark_cause(watch, result)
    return result


_PEER_LOST = re.compile(r"peer was lost|connection reset|broken pipe|connection closed", re.I)


def lost_peer(state: RankState) -> bool:
    """Whether the rank's own error says a peer went away (not a cause)."""
    return not state.failures and any(_PEER_LOST.search(e) for e in state.errors)


def mark_cause(watch: Watch, result: list[RankOutcome]) -> None:
    """The rank that failed first is the cause; ranks that only errored or
    exited after it (a lost peer) were stopped by it. Wrong results stay
    failures wherever they are seen."""
    hung = [o for o in result if o.status == "hung"]
    failed = [s for s in watch.ranks if s.failed_at is not None
              and result[s.rank].status in ("failed", "exited")]
    if hung and not failed:
        for o in hung:
            o.cause = True
        return
    if not failed:
        return
    # A rank that lost its peer is a consequence; prefer one that failed on its own.
    first = min(failed, key=lambda s: (lost_peer(s), s.failed_at, s.rank))
    result[first.rank].cause = True
    for s in failed:
        o = result[s.rank]
        if s is not first and not s.failures:
            o.status = "stopped"
            o.detail = f"{o.detail} (after rank {first.rank} failed)"


def bench_rows(watch: Watch) -> list[BenchRow]:
    """Table rows from every rank's timings, in the order the workers ran them."""
    n = len(watch.ranks)
    return [summarize(op, dtype, nbytes, [by_rank[r] for r in sorted(by_rank)])
            for (op, dtype, nbytes), by_rank in watch.bench.items() if len(by_rank) == n]
