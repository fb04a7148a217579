"""What runs on the hosts now, and stopping it by its run id.

Every rank of a `train` or `run` job writes ``rank<R>.pid`` (``<pid>
<hostname>``) into its run's folder under the rank wrapper's STACKS_ROOT on
its own host (mlxcluster.jobs.rank_wrapper), and its command line carries the
run id. ``list_running`` asks every host, in one ssh call each, for the
ranks whose pid file names a live process, with that process's start time
and command line:

    @@rank mlxtrain-1a2b3c4d5e 0 4242
    01:02:03 /opt/venv/bin/python -X mlxcluster_run=mlxtrain-1a2b3c4d5e -m mlxcluster.jobs.rank_wrapper -m reference_train.train --progress false --config tiny --out runs/a

``parse_listing`` reads that (``ps -o etime=,args=``: the time since the
process started, ``[[DD-]HH:]MM:SS``, the same on macOS and Linux; the start
times ps prints were an hour off in this project's Linux container), apart
from the ssh. ``stop_run`` asks the ranks to stop as the lease
does (SIGUSR2: the trainer checkpoints at its next logged step), waits for
them, then stops whatever is left (TERM, KILL) and removes the run's folder.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from mlxcluster.errors import InputError
from mlxcluster.jobs.cleanup import bracketed, remove_dirs
from mlxcluster.jobs.hosts import HostResult, RankHost, distinct_hosts, for_each_host, run_script
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT

RANK_LINE = re.compile(r"^@@rank (\S+) (\d+) (\d+)\s*$")
RUN_ID_HEX = 10  # the hex digits after the prefix (jobs/cleanup.py new_run_id)
STOP_POLL_S = 0.5
STOP_ASKED = "@@stop-asked"


@dataclass(frozen=True)
class RunKind:
    """A command whose runs `jobs` lists, `stop` stops (and, when
    ``detachable``, `attach` follows): its run ids' prefix."""

    prefix: str  # mlxrun, mlxtrain...: the run id is PREFIX-<10 hex digits>
    command: str  # the command that launches them: run, train...
    detachable: bool = False  # --detach: `mlxcluster attach` follows it again
    # What the command adds to its program that the user did not type, left
    # out where the program is shown (the trainer hand-off's progress bar off).
    added: tuple[str, ...] = ()


# Registered by each launching command's module (``register_run_kind``): this
# layer knows no command's prefix; smoke's runs (mlxsmoke-...) are not listed.
RUN_KINDS: dict[str, RunKind] = {}


def register_run_kind(prefix: str, command: str, *, detachable: bool = False,
                      added: tuple[str, ...] = ()) -> str:
    """Make ``prefix``'s runs known to `jobs`, `stop` (and `attach` when
    ``detachable``); ``added``: arguments the command adds to its program,
    not shown. Returns ``prefix``, for the command's constant."""
    RUN_KINDS[prefix] = RunKind(prefix, command, detachable, added)
    return prefix


def run_kind(run_id: str) -> RunKind | None:
    """The registered kind ``run_id`` is of (PREFIX-<10 hex digits>), else None."""
    prefix, _, digits = run_id.rpartition("-")
    if len(digits) != RUN_ID_HEX or not all(c in "0123456789abcdef" for c in digits):
        return None
    return RUN_KINDS.get(prefix)


def run_id_shapes(*, detachable: bool = False) -> str:
    """The run ids known, as messages name them: "mlxtrain-<10 hex digits>
    or mlxrun-<10 hex digits>"."""
    kinds = [k for k in RUN_KINDS.values() if k.detachable or not detachable]
    return " or ".join(f"{k.prefix}-<{RUN_ID_HEX} hex digits>" for k in kinds)


def check_run_id(run_id: str, *, detachable: bool = False) -> RunKind:
    """``run_id``'s kind, or InputError naming the run ids known (``detachable``:
    of the commands that detach)."""
    kind = run_kind(run_id)
    if kind is None or (detachable and not kind.detachable):
        raise InputError(f"{run_id!r} is not a run id ({run_id_shapes(detachable=detachable)})",
                         "mlxcluster jobs lists the runs and their ids")
    return kind


@dataclass(frozen=True)
class RunningRank:
    run_id: str
    rank: int
    host: str
    pid: int
    started: datetime | None
    command: str  # the program as the user gave it, after the rank wrapper


@dataclass(frozen=True)
class RunningJob:
    run_id: str
    ranks: tuple[RunningRank, ...]

    @property
    def command(self) -> str:
        return self.ranks[0].command

    @property
    def started(self) -> datetime | None:
        times = [r.started for r in self.ranks if r.started]
        return min(times) if times else None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))


def listing_script() -> str:
    """Shell text printing every live rank of every run on a host (see the
    module docstring); bash for the glob (zsh fails one that matches none)."""
    inner = (f'for f in {STACKS_ROOT}/mlx*-*/rank*.pid; do [ -f "$f" ] || continue; '
             'run=$(basename "$(dirname "$f")"); rank=$(basename "$f" .pid); rank=${rank#rank}; '
             'pid=$(cut -d" " -f1 "$f"); case "$pid" in ""|*[!0-9]*) continue;; esac; '
             'kill -0 "$pid" 2>/dev/null || continue; '
             'echo "@@rank $run $rank $pid"; LC_ALL=C ps -ww -o etime=,args= -p "$pid"; done; true')
    return f"bash -c {shlex.quote(inner)}"


def program_of(args: str, kind: RunKind | None = None) -> str:
    """The program a rank runs, from its command line: what follows the rank
    wrapper's module (``-m mlxcluster.jobs.rank_wrapper``), without what its
    ``kind``'s command added (``RunKind.added``)."""
    _, found, rest = args.partition("mlxcluster.jobs.rank_wrapper ")
    program = rest if found else args
    if kind is not None and kind.added:
        program = program.replace(shlex.join(kind.added) + " ", "", 1)
    return program


def elapsed_seconds(etime: str) -> int | None:
    """``ps -o etime`` (``[[DD-]HH:]MM:SS``) in seconds; None when it is not that."""
    days, _, clock = etime.rpartition("-")
    parts = clock.split(":")
    if not (days.isdigit() or not days) or not 2 <= len(parts) <= 3 or \
            not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def parse_listing(host: str, text: str, now: datetime | None = None) -> list[RunningRank]:
    """The ranks in ``listing_script``'s output from ``host``; their start
    from ``now`` (this machine's clock) less their elapsed time there."""
    now = now or datetime.now()
    ranks, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        found = RANK_LINE.match(line)
        if not found or run_kind(found.group(1)) is None:
            continue
        ps = lines[i + 1].strip() if i + 1 < len(lines) else ""
        started, command = None, ""
        if ps and not ps.startswith("@@rank"):
            etime, _, command = ps.partition(" ")
            seconds = elapsed_seconds(etime)
            started = None if seconds is None else now - timedelta(seconds=seconds)
        if found.group(1) not in command:  # the pid was reused by another process
            continue
        ranks.append(RunningRank(found.group(1), int(found.group(2)), host, int(found.group(3)),
                                 started, program_of(command, run_kind(found.group(1)))))
    return ranks


def group_jobs(ranks: Sequence[RunningRank]) -> list[RunningJob]:
    """One job per run id, its ranks in rank order, the oldest job first."""
    by_run: dict[str, list[RunningRank]] = {}
    for rank in ranks:
        by_run.setdefault(rank.run_id, []).append(rank)
    jobs = [RunningJob(run, tuple(sorted(rs, key=lambda r: r.rank))) for run, rs in by_run.items()]
    return sorted(jobs, key=lambda j: (j.started or datetime.max, j.run_id))


def list_running(hosts: Sequence[RankHost],
                 env: dict[str, str] | None = None) -> tuple[list[RunningJob], list[HostResult]]:
    """The jobs running on ``hosts`` (each distinct host asked once; this
    machine's ranks too when one is local), and the hosts that did not answer."""
    asked = distinct_hosts(hosts)
    results = for_each_host(asked, lambda h: run_script(h, listing_script(), env=env))
    ranks = [rank for r in results if r.ok for rank in parse_listing(r.host, r.output)]
    return group_jobs(ranks), [r for r in results if not r.ok]


def signal_ranks_script(run_id: str, *signals: str, pause_s: float = 0.5) -> str:
    """Send each of ``signals`` in turn (``pause_s`` apart) to every rank of
    the run on a host, by its pid file: not by command line (``pkill -f``),
    which also matches this `mlxcluster stop RUN_ID` when it runs on that
    host (``--local``; the lab's hosts share this machine's process table),
    and the rank's watchdog and output helper, which end with it."""
    sends = f"; sleep {pause_s}; ".join(
        f'for p in $pids; do kill -{sig} "$p" 2>/dev/null; done' for sig in signals)
    inner = (f'pids=""; for f in {STACKS_ROOT}/{run_id}/rank*.pid; do [ -f "$f" ] || continue; '
             'p=$(cut -d" " -f1 "$f"); case "$p" in ""|*[!0-9]*) continue;; esac; '
             f'pids="$pids $p"; done; [ -n "$pids" ] || exit 0; {sends}; true')
    return f"bash -c {shlex.quote(inner)}"


def stop_mark(run_id: str) -> str:
    """The file `mlxcluster stop` leaves on each host of the run: the controller
    that launched it (train, run, serve) finds it when the ranks have ended and
    keeps that end instead of launching again (``asked_to_stop``). Beside the
    run's folder, not in it: the controller's sweep removes the folder first."""
    return f"{STACKS_ROOT}/{run_id}.stopped"


def asked_script(run_id: str) -> str:
    """Shell text printing ``STOP_ASKED`` when the run's stop mark is there, and
    removing it (the controller asks once, at the run's end)."""
    mark = shlex.quote(stop_mark(run_id))
    return f"if [ -f {mark} ]; then rm -f {mark}; echo {STOP_ASKED}; fi; true"


def asked_to_stop(hosts: Sequence[RankHost], run_id: str,
                  env: dict[str, str] | None = None) -> bool:
    """Whether `mlxcluster stop` asked ``run_id`` to stop on any of ``hosts``
    (one ssh call each; a host that does not answer says nothing)."""
    if run_kind(run_id) is None:
        return False
    results = for_each_host(distinct_hosts(hosts), lambda h: run_script(h, asked_script(run_id),
                                                                        env=env))
    return any(r.ok and STOP_ASKED in r.output for r in results)


def stop_run(hosts: Sequence[RankHost], run_id: str, grace_s: float,
             env: dict[str, str] | None = None) -> tuple[bool, list[HostResult]]:
    """Ask every rank of ``run_id`` to stop (SIGUSR2: a last checkpoint), wait
    up to ``grace_s`` for them to end, then stop what is left (TERM, KILL).
    Returns (whether every rank ended when asked, the hosts that could not
    be reached)."""
    if run_kind(run_id) is None:
        raise ValueError(f"not a run id: {run_id!r}")
    asked = distinct_hosts(hosts)
    mark = f"mkdir -p {STACKS_ROOT} && touch {shlex.quote(stop_mark(run_id))}; "
    for_each_host(asked, lambda h: run_script(h, mark + signal_ranks_script(run_id, "USR2"),
                                              env=env))
    deadline = time.monotonic() + grace_s
    ended = False
    while time.monotonic() < deadline:
        jobs, _ = list_running(hosts, env)
        if not any(j.run_id == run_id for j in jobs):
            ended = True
            break
        time.sleep(STOP_POLL_S)
    kill = signal_ranks_script(run_id, "TERM", "CONT", "KILL") + "; " + remove_dirs(
        STACKS_ROOT, bracketed(run_id))
    results = for_each_host(asked, lambda h: run_script(h, kill, env=env))
    return ended, [r for r in results if not r.ok]
