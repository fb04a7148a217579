"""Watch a running launcher: its lines to the caller, heartbeats to the stall
watch, a deadline, Ctrl-C; and read from its output which rank failed.

``mlx.launch`` exits 0 when a rank fails and only warns "Node with rank R
exited with code C"; ``mpirun`` returns the first failing process's code and
names it ("Process name: [prterun-...@1,R]" / "Exit code: C"). Both are read
here, for train/run (``failed_rank``) and for smoke (``parse_launcher_exit``,
line by line).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlxcluster import interrupts
from mlxcluster.doctor.known_errors import Diagnosis, diagnose
from mlxcluster.errors import EXIT_USAGE, Interrupted, MlxclusterError
from mlxcluster.jobs import process, stall
from mlxcluster.jobs.cleanup import LauncherStopNoise
from mlxcluster.jobs.rank_wrapper import EXIT_MARK

# mlx.launch: "[WARN] Node with rank 1 exited with code 3" (or "was killed")
MLX_EXIT_RE = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")
# Open MPI 4 "[[56171,1],6]" and 5 "[prterun-vm-4304@1,1]": the rank is the last number
MPI_PROC_RE = re.compile(r"Process name:\s*\S*?(\d+)\]+\s*$", re.M)
MPI_CODE_RE = re.compile(r"Exit code:\s*(-?\d+)")
# mpirun's words when ranks ran and one aborted (an MPI error is fatal): the job started.
MPI_ABORT_RE = re.compile(r"MPI_ERRORS_ARE_FATAL|has exited due to process rank \d+|"
                          r"peer process has unexpectedly disconnected")
# A whole line, behind the rank's tag when `run` tags lines ("[1] @@mlxcluster-exit 1 3 T").
EXIT_LINE_RE = re.compile(r"^(?:\[\d+\] )?" + re.escape(EXIT_MARK) +
                          r" (\d+) (\d+) (\d+(?:\.\d*)?)[ \t\r]*$", re.M)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# A program's own usage error, as argparse ("prog: error: ...") and click
# ("Error: ...") print it, on a rank's line ("[0] ..." or bare).
USAGE_ERROR_RE = re.compile(r"^(?:\[\d+\] )?(?:[\w.\- ]+: )?[Ee]rror: (.+)$")
# How mlx.launch stops the other ranks once one failed (subprocess codes: -signal).
STOPPED_BY_LAUNCHER = frozenset({-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP})
LAUNCHER_STOP_GRACE_S = 20.0  # mlx.launch / mpirun stop their ranks on every host meanwhile
PUMP_JOIN_S = 10.0


@dataclass(frozen=True)
class RunOutcome:
    """How a launched job ended: the exit code to return and which rank failed."""

    exit_code: int
    failed_rank: int | None = None
    seconds: float = 0.0
    lines: tuple[str, ...] = ()
    run_id: str = ""  # on every rank's command line (mlxcluster.jobs.cleanup)
    lost_host: str | None = None  # the host whose ssh connection failed or was lost
    # ssh's 255 from a host that still answered: the rank there was ended by a signal
    signalled_host: str | None = None
    unstopped: str | None = None  # hosts the final sweep could not reach, and what to run there
    # every rank ended because `mlxcluster stop` asked (jobs/running.py): an end to keep,
    # not a failure to restart
    asked_to_stop: bool = False
    # the program got past its start (a step logged, the server's first answer: the
    # watch's ``started_work``); None: not watched
    started: bool | None = None

    @property
    def who(self) -> str:
        """Who failed, as messages name it: "rank 1", or "a rank"."""
        return f"rank {self.failed_rank}" if self.failed_rank is not None else "a rank"

    def known_errors(self) -> list[Diagnosis]:
        """The messages in its lines whose cause is known (docs/errors.md),
        each once, for the failure to say with its fix."""
        return diagnose(self.lines)

    @property
    def refused_at_start(self) -> bool:
        """A rank exited with 2 before the program's first step or answer: by
        the convention of argparse and click, a usage error (its arguments,
        its input). A restart would be refused the same way."""
        return self.exit_code == EXIT_USAGE and self.started is False

    def usage_words(self) -> str | None:
        """The program's own words for a refusal at start: its last
        ``error: ...`` line (argparse's and click's form), else None."""
        for line in reversed(self.lines):
            found = USAGE_ERROR_RE.search(line)
            if found:
                return found.group(1).strip()
        return None

    @property
    def refusal(self) -> str | None:
        """The launcher's own message when it refused to start the job (no
        rank ran, none is to blame), else None."""
        # A host lost to ssh comes first: mpirun frames that in the same kind
        # of message as an option it refuses, but ranks did run.
        if not self.exit_code or self.failed_rank is not None or self.lost_host:
            return None
        return launcher_error(self.lines)


def parse_launcher_exit(line: str, pending_rank: list[int | None]) -> tuple[int, int | None] | None:
    """(rank, exit code) from a launcher's stderr line, for ranks that died
    without reporting (native crash, killed). ``pending_rank`` carries Open
    MPI's 'Process name' across to the following 'Exit code' line."""
    m = MLX_EXIT_RE.search(line)
    if m:
        return int(m.group(1)), (int(m.group(2)) if m.group(2) else None)
    m = MPI_PROC_RE.search(line)
    if m:
        pending_rank[0] = int(m.group(1))
        return None
    m = MPI_CODE_RE.search(line)
    if m and pending_rank[0] is not None:
        rank, pending_rank[0] = pending_rank[0], None
        return rank, int(m.group(1))
    return None


def failed_rank(lines: list[str], returncode: int) -> tuple[int, int | None]:
    """(exit code, failing rank) from a launcher's output and return code.

    The rank wrapper's exit lines come first (rank_wrapper.EXIT_MARK): the
    one with the earliest time names the rank that failed first and its own
    code, even when the others failed after it and the launcher names one of
    those (mpirun: "prterun has exited due to process rank 0 ... calling
    abort" when rank 1 had exited 3; tests/fixtures/launcher_output). Without
    them (a rank killed by a signal): mlx.launch exits 0 when a rank fails and
    only warns "Node with rank R exited with code C"; mpirun returns the
    first failing process's code and may name it "[prterun-...@1,R]".
    """
    exits = [m for m in map(EXIT_LINE_RE.search, lines) if m]
    if exits:
        first = min(exits, key=lambda m: float(m.group(3)))  # min keeps the first of equal times
        return int(first.group(2)), int(first.group(1))
    text = ANSI_RE.sub("", "\n".join(lines))
    warns = [m for m in MLX_EXIT_RE.finditer(text) if m.group(2) is not None]
    # Once a rank failed, mlx.launch TERMs the others, and their warnings may
    # come first: a CI run that lost labhost3 under heavy load said "a rank
    # exited with code -15", not the lost host. A rank stopped so is not the cause.
    warn = next((m for m in warns if int(m.group(2)) not in STOPPED_BY_LAUNCHER), None)
    warn = warn or (warns[0] if warns else None)
    if warn:
        return int(warn.group(2)), int(warn.group(1))
    rank, code = MPI_PROC_RE.search(text), MPI_CODE_RE.search(text)
    if code and returncode != 0:
        return int(code.group(1)), int(rank.group(1)) if rank else None
    return returncode, None


HELP_RULE_RE = re.compile(r"^-{20,}$")  # Open MPI frames its own messages with these
HELP_DETAIL_RE = re.compile(r"^\s+([A-Z][\w ]*):\s+(\S.*)$")  # "  Option: --bogus-flag"
ARGPARSE_ERROR_RE = re.compile(r"^mlx\.launch: error: (.+)$", re.M)


def launcher_error(lines: list[str] | tuple[str, ...]) -> str | None:
    """The launcher's own error when it failed without naming a rank, else None.

    mpirun (Open MPI 5, prterun) refuses an unknown option, a bad directive, a
    missing executable or a hostfile without slots before any rank runs: it
    prints a message framed by lines of dashes ("An unrecognized option was
    included on the mpirun command line:" / "Option: --bogus-flag") and exits
    with its own code (213, 183...). mlx.launch exits 2 with "mlx.launch:
    error: ...". A failing rank is named instead ("Node with rank R exited",
    "Process name:" / "Exit code:", a rank's exit line, mpirun's abort of a
    started job), and then this returns None.
    """
    text = ANSI_RE.sub("", "\n".join(lines))
    if any(r.search(text) for r in (MLX_EXIT_RE, MPI_PROC_RE, MPI_CODE_RE, MPI_ABORT_RE,
                                    EXIT_LINE_RE)):
        return None
    argparse_error = ARGPARSE_ERROR_RE.search(text)
    if argparse_error:
        return argparse_error.group(1).strip()
    body = text.splitlines()
    rules = [i for i, line in enumerate(body) if HELP_RULE_RE.match(line.strip())]
    if len(rules) < 2:
        return None
    block = body[rules[0] + 1:rules[1]]
    summary: list[str] = []
    for line in block:  # the first paragraph says what went wrong
        if not line.strip():
            if summary:
                break
            continue
        summary.append(line.strip())
    details = [f"{m.group(1)}: {m.group(2).strip()}" for m in map(HELP_DETAIL_RE.match, block) if m]
    message = " ".join(summary).rstrip(":")
    return f"{message} ({'; '.join(details)})" if details else message or None


class LineFilter:
    """What the user sees of one stream: heartbeats go to the stall watch,
    mlx.launch's tracebacks from stopping ranks are dropped."""

    def __init__(self, watch: stall.StallWatch | None):
        self.watch = watch
        self.noise = LauncherStopNoise()

    def feed(self, line: str) -> list[str]:
        if self.watch is not None:
            shown = self.watch.feed(line)
            if shown is None:
                return []
            line = shown
        return self.noise.feed(line)

    def flush(self) -> list[str]:
        return self.noise.flush()


def run_streaming(argv: list[str], on_line: Callable[[str, str], None],
                  env: dict[str, str] | None = None, timeout: float | None = None,
                  keep: int = 400, watch: stall.StallWatch | None = None,
                  on_stall: Callable[[], MlxclusterError] | None = None) -> RunOutcome:
    """Run `argv`, calling on_line(stream, line) as lines arrive; kill it on timeout.

    With ``watch``, every line goes through it first (heartbeats are recorded
    and hidden); when it says the job stalled, ``on_stall()`` (diagnose and
    stop the ranks) runs, the launcher is stopped, and its error is raised."""
    start = time.monotonic()
    return watch_launcher(process.start(argv, env), on_line, start, timeout, keep, watch, on_stall)


def watch_launcher(running: process.Running, on_line: Callable[[str, str], None], start: float,
                   timeout: float | None = None, keep: int = 400,
                   watch: stall.StallWatch | None = None,
                   on_stall: Callable[[], MlxclusterError] | None = None) -> RunOutcome:
    """Read a started launcher's lines until it ends (see ``run_streaming``)."""
    tail: list[str] = []
    exits: list[str] = []  # the ranks' exit lines (rank_wrapper.EXIT_MARK)
    filters = {"stdout": LineFilter(watch), "stderr": LineFilter(watch)}

    def show(name: str, lines: list[str]) -> None:
        for line in lines:
            if EXIT_LINE_RE.search(line):  # for failed_rank, not the user; kept apart
                exits.append(line)         # from the tail, which drops old lines
                continue
            tail.append(line)
            del tail[:-keep]
            on_line(name, line)

    deadline = None if timeout is None else start + timeout
    proc = running.proc
    ended: float | None = None  # when the launcher was first seen ended
    try:
        while True:
            if proc.poll() is not None:
                ended = ended or time.monotonic()
                # Done when its streams end; something it started may still
                # hold its pipes: not longer than PUMP_JOIN_S then.
                if running.drained() or time.monotonic() - ended > PUMP_JOIN_S:
                    break
            wait_s = 0.5
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            if running.drained():  # the streams ended first: wait for the launcher itself
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait_s)
            else:
                got = running.next_line(wait_s)
                if got is not None:
                    show(got[0], filters[got[0]].feed(got[1]))
            if ended is not None:
                continue
            if deadline is not None and time.monotonic() >= deadline:
                with interrupts.deferred():
                    stop_launcher(running)
                raise MlxclusterError(
                    f"the job did not finish within {timeout:.0f} s and was stopped",
                    "raise --timeout; a hung rank is found and named by --stall-timeout") from None
            if watch is not None and on_stall is not None and watch.stalled():
                with interrupts.deferred():
                    try:
                        error = on_stall()
                    finally:  # the launcher goes, whatever the diagnosis did
                        stop_launcher(running)
                raise error from None
    except KeyboardInterrupt as stop:
        with interrupts.deferred():
            stop_launcher(running)
        signum = interrupts.signum_of(stop)
        raise Interrupted(signum, f"interrupted ({interrupts.signal_name(signum)}): the job was "
                                  "stopped on every rank") from None
    except BaseException:  # the caller's on_line failed (its stdout closed: `| head`): stop all
        with interrupts.deferred():
            stop_launcher(running)
        raise
    for name, f in filters.items():
        show(name, f.flush())
    code, rank = failed_rank(exits + tail, proc.returncode)
    return RunOutcome(exit_code=code, failed_rank=rank, seconds=time.monotonic() - start,
                      lines=tuple(exits + tail))


def stop_launcher(running: process.Running) -> None:
    """SIGINT the launcher's process group (mlx.launch and mpirun then stop
    their ranks on every host themselves); KILL it if it is not gone in 20 s.
    Its last lines are not shown (its own traceback as it stops)."""
    interrupts.stop_process(running.proc, signal.SIGINT, LAUNCHER_STOP_GRACE_S, group=True)
    running.join(timeout=5)
