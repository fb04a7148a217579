"""A stalled job: found (no progress for a while), named (which rank, on which
host, doing what) and its evidence kept.

Progress is the heartbeat lines the ranks print (``@@mlxcluster-heartbeat
RANK STEP``, see reference_train/metrics.py; the launcher hides them).
``StallWatch`` turns them into "stalled or not" with an injected clock:
a fixed limit (``--stall-timeout``) or, by default, 10 x the median step
time with a floor of 60 s. The watch is armed by the first heartbeat;
until then the limit is at least ``STARTUP_GRACE_S`` (ring connects,
data preparation, the first compile).

On a stall, ``collect_states`` asks every host, in one ssh call each, for
each rank's process state and CPU time (``ps -o stat=,time=``, plus
/proc/PID/stat ticks on Linux, before and after a 1 s wait) and its Python
stacks (SIGUSR1 to the rank's pid, dumped by mlxcluster.jobs.rank_wrapper);
``diagnose`` names the rank that is not where the others are, and
``save_report`` writes the whole of it into a folder.
"""

from __future__ import annotations

import linecache
import re
import shlex
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import EXIT_STALLED, MlxclusterError
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from reference_train.metrics import HEARTBEAT_MARK  # the protocol's one copy

HEARTBEAT_RE = re.compile(re.escape(HEARTBEAT_MARK) + r" (\d+) (\d+|done)\r?")
AUTO_FACTOR = 10.0  # the default limit: this many median step times...
AUTO_FLOOR_S = 60.0  # ...but never less than this
STARTUP_GRACE_S = 300.0  # before the first heartbeat, the limit is at least this
MEDIAN_OF = 50  # the median is taken over the latest step intervals
DUMP_WAIT_S = 1.0  # between SIGUSR1 and reading the dumps (and the two CPU samples)


class Stalled(MlxclusterError):
    """The job made no progress for its stall timeout; it was stopped everywhere."""

    exit_code = EXIT_STALLED

    def __init__(self, message: str, hint: str | None = None, report_dir: Path | None = None,
                 hosts: tuple[str, ...] = (), run_id: str = ""):
        super().__init__(message, hint)
        self.report_dir, self.run_id = report_dir, run_id
        self.hosts = hosts  # the hosts of the ranks named (stopped, gone...): for --elastic


# ---------------------------------------------------------------- detection


class StallWatch:
    """Progress seen in the output lines, and whether the job has stalled.

    ``timeout`` None: automatic (``AUTO_FACTOR`` x the median step time,
    at least ``AUTO_FLOOR_S``). Thread-safe: lines come from two pump
    threads while the main thread asks ``stalled()``.
    """

    def __init__(self, timeout: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 factor: float = AUTO_FACTOR, floor: float = AUTO_FLOOR_S,
                 startup_grace: float = STARTUP_GRACE_S):
        self.fixed, self.clock = timeout, clock
        self.factor, self.floor, self.startup_grace = factor, floor, startup_grace
        self._lock = threading.Lock()
        self.started = clock()
        self.last_progress = self.started
        self.armed = False  # a first heartbeat arrived
        self.finished = False  # a rank said done: no more watching
        self.steps: dict[int, int] = {}  # latest step per rank
        self._top_step = -1
        self._top_at = 0.0
        self._intervals: list[float] = []  # seconds per step, latest MEDIAN_OF

    def feed(self, line: str) -> str | None:
        """Record a heartbeat in ``line``; return the rest of the line to show
        (None when it held only a heartbeat)."""
        found = HEARTBEAT_RE.search(line)
        if not found:
            return line
        self.beat(int(found.group(1)), found.group(2))
        rest = (line[:found.start()] + line[found.end():]).strip("\r")
        return rest if rest.strip() else None

    def beat(self, rank: int, step: int | str, now: float | None = None) -> None:
        """Rank ``rank`` reached ``step`` (an int, or 'done')."""
        with self._lock:
            now = self.clock() if now is None else now
            self.last_progress, self.armed = now, True
            if step == "done":
                self.finished = True
                return
            step = int(step)
            self.steps[rank] = max(step, self.steps.get(rank, step))
            if step > self._top_step:
                if self._top_step >= 0:
                    self._intervals.append((now - self._top_at) / (step - self._top_step))
                    del self._intervals[:-MEDIAN_OF]
                self._top_step, self._top_at = step, now

    def started_work(self) -> bool:
        """The program got past its start: a step (or its end) was logged."""
        with self._lock:
            return bool(self.steps) or self.finished

    def median_step_s(self) -> float | None:
        with self._lock:
            return statistics.median(self._intervals) if self._intervals else None

    def limit(self) -> float:
        """Seconds without progress that make a stall, now."""
        if self.fixed is not None:
            limit = self.fixed
        else:
            median = self.median_step_s()
            limit = max(self.floor, self.factor * median) if median is not None else self.floor
        return limit if self.armed else max(limit, self.startup_grace)

    def silent_for(self, now: float | None = None) -> float:
        return (self.clock() if now is None else now) - self.last_progress

    def stalled(self, now: float | None = None) -> bool:
        if self.finished:
            return False
        return self.silent_for(now) > self.limit()

    def why(self, detailed: bool = True) -> str:
        """What makes this a stall, in words (``detailed``: with how the limit was chosen)."""
        how = "" if not detailed else \
            ", --stall-timeout" if self.fixed is not None else ", automatic: 10 x the median step, >= 60 s"
        return f"no progress for {self.silent_for():.0f} s (stall timeout {self.limit():.0f} s{how})"


class LineWatch(StallWatch):
    """For a program of the user's own (`mlxcluster run`): any output line
    is progress. The limit is the given timeout, counted from the launch
    (no startup grace: the user chose it knowing the program)."""

    def __init__(self, timeout: float | None = None, **kw):
        kw.setdefault("startup_grace", 0.0)
        super().__init__(timeout, **kw)

    def started_work(self) -> bool | None:
        return None  # a program of the user's own has no steps to tell its start by

    def feed(self, line: str) -> str | None:
        shown = super().feed(line)  # a heartbeat, if the program prints them, is still hidden
        with self._lock:
            self.last_progress, self.armed = self.clock(), True
        return shown


# ---------------------------------------------------------------- rank states


STATE_WORDS = {"R": "running", "S": "sleeping", "I": "idle", "D": "in uninterruptible wait",
               "U": "in uninterruptible wait", "T": "stopped", "t": "stopped (traced)",
               "Z": "a zombie (exited, not reaped)"}
BAD_STATES = ("T", "t", "Z", "D", "U")  # a rank in one of these is the odd one out


COLLECTIVE_RE = re.compile(r"\b(all_sum|all_gather|all_max|all_min|sum_scatter|average_gradients|"
                           r"send|recv|recv_like)\(")
CONTINUATION = (")", "]", "/", "*", "+", "-", ".", "%", "&", "|")


@dataclass
class Frame:
    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        """'all_sum at train.py:479 (in run)' when the statement at that line
        calls a collective (read here, when this machine has the file: a
        shared filesystem, the same venv path), else 'run at train.py:479'."""
        collective = self.collective()
        if collective:
            return f"{collective} at {Path(self.file).name}:{self.line} (in {self.function})"
        return f"{self.function} at {Path(self.file).name}:{self.line}"

    def collective(self) -> str | None:
        """The collective the statement at this line calls, if any: the line,
        and the lines above it while it continues one ('/ x).item()')."""
        first = self.line
        while first > 1 and first > self.line - 3 and \
                linecache.getline(self.file, first).strip().startswith(CONTINUATION):
            first -= 1
        text = "".join(linecache.getline(self.file, n) for n in range(first, self.line + 1))
        found = COLLECTIVE_RE.findall(text)
        return found[0] if found else None


@dataclass
class RankState:
    """What one rank's process was doing when the job stalled."""

    rank: int
    host: str
    pid: int | None = None
    stat: str | None = None  # ps STAT ("S", "Sl", "T"...); None: no such process
    cpu_before: float | None = None  # seconds of CPU time, 1 s apart
    cpu_after: float | None = None
    stacks: str = ""  # faulthandler's dump, all threads
    error: str | None = None  # the host could not be asked

    @property
    def state(self) -> str:
        if self.error:
            return f"unknown ({self.error})"
        if self.pid is None:
            # The rank wrapper registers its pid first thing: the launcher's
            # command never ran it there (a login shell that cannot parse the
            # command, a python that is not there: doctor checks both).
            return "not started (no process registered; mlxcluster doctor checks that host)"
        if not self.stat:
            return "gone (the process no longer exists)"
        return STATE_WORDS.get(self.stat[0], self.stat)

    @property
    def cpu_advancing(self) -> bool | None:
        if self.cpu_before is None or self.cpu_after is None:
            return None
        return self.cpu_after > self.cpu_before

    @property
    def is_odd_by_state(self) -> bool:
        return bool(self.error) or self.pid is None or not self.stat or self.stat[0] in BAD_STATES

    @property
    def where(self) -> Frame | None:
        """The innermost frame of the main thread: the one running the
        wrapper, else the one whose outermost frame is a module's code (other
        threads start in threading's _bootstrap)."""
        threads = [t for t in split_threads(self.stacks) if t]
        main = next((t for t in threads if any("rank_wrapper" in f.file for f in t)), None)
        main = main or next((t for t in threads if t[-1].function == "<module>"), None)
        main = main or (threads[0] if threads else None)
        return main[0] if main else None

    def describe(self) -> str:
        """'is stopped (state T, CPU time not advancing)'."""
        if self.error or self.pid is None or not self.stat:
            return f"is {self.state}"
        cpu = {True: ", CPU time advancing", False: ", CPU time not advancing"}.get(self.cpu_advancing, "")
        return f"is {self.state} (state {self.stat}{cpu})"


FRAME_RE = re.compile(r'^\s*File "(.*)", line (\d+) in (\S+)')
THREAD_RE = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+", re.I)


def split_threads(dump: str) -> list[list[Frame]]:
    """faulthandler's text -> each thread's frames, innermost first."""
    threads: list[list[Frame]] = []
    for line in dump.splitlines():
        if THREAD_RE.match(line.strip()):
            threads.append([])
            continue
        found = FRAME_RE.match(line)
        if found and threads:
            threads[-1].append(Frame(found.group(1), int(found.group(2)), found.group(3)))
    return threads


def ranks_text(ranks: list[int]) -> str:
    """'rank 1', 'ranks 0 and 2', 'ranks 0, 2 and 3'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def diagnose(states: list[RankState]) -> str:
    """One line: the rank(s) not where the others are, then where the others wait.

    'rank 1 on labhost2 is stopped (state T, CPU time not advancing); ranks 0
    and 2 wait in all_sum at loop.py:218 (in evaluate)'. A rank in a bad state (stopped,
    zombie, uninterruptible wait, gone) is odd by itself; then the others are
    only placed. Without one, ranks whose main thread stands elsewhere than the
    largest group are the odd ones.
    """
    if not states:
        return "no rank could be found on any host"
    odd = [s for s in states if s.is_odd_by_state]
    rest = [s for s in states if not s.is_odd_by_state]
    groups: dict[str, list[RankState]] = {}
    for s in rest:
        where = s.where
        groups.setdefault(where.short if where else "", []).append(s)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(x.rank for x in kv[1])))
    parts = [f"rank {s.rank} on {s.host} {s.describe()}" for s in sorted(odd, key=lambda s: s.rank)]
    if odd and len(ordered) > 1:
        # A stopped or gone rank is the cause; the others wait on it wherever
        # the collective in flight left them (one MPI rank may finish its
        # part of an all-reduce and go on to the next): places, not suspects.
        places = ", ".join(f"rank {s.rank} in {s.where.short}" if s.where else f"rank {s.rank} gave no stack"
                           for s in sorted(rest, key=lambda s: s.rank))
        parts.append(f"{ranks_text([s.rank for s in rest])} wait at different places: {places}")
        return "; ".join(parts)
    if ordered:
        main_where, main_group = ordered[0]
        tie = len(ordered) > 1 and len(ordered[1][1]) == len(main_group)
        if tie and not odd:  # no majority: say where each rank is
            for where, group in ordered:
                parts.append(f"{ranks_text([s.rank for s in group])} on "
                             f"{', '.join(sorted({s.host for s in group}))} "
                             f"{'in ' + where if where else 'gave no stack'}")
            return "; ".join(parts)
        for where, group in ordered[1:]:
            for s in group:
                at = f"is in {where}" if where else "gave no stack"
                parts.append(f"rank {s.rank} on {s.host} {at} ({s.state})")
        verb = "waits" if len(main_group) == 1 else "wait"
        if main_where:
            line = f"{ranks_text([s.rank for s in main_group])} {verb} in {main_where}"
        else:
            line = f"{ranks_text([s.rank for s in main_group])} gave no stack ({main_group[0].state})"
        if len(parts) == 0:
            line = f"every rank ({ranks_text([s.rank for s in main_group])}) waits in " \
                   f"{main_where or 'an unknown place'}: no single rank stands out (a collective " \
                   "that does not complete: check the network between the hosts)"
        parts.append(line)
    return "; ".join(parts)


def rank_lines(states: list[RankState]) -> list[str]:
    """One line per rank for the report: host, pid, state, where."""
    lines = []
    for s in sorted(states, key=lambda s: s.rank):
        where = s.where
        lines.append(f"rank {s.rank} on {s.host}: pid {s.pid if s.pid is not None else '-'}, "
                     f"{s.describe()[3:]}" + (f", in {where.short}" if where else ", no stack"))
    return lines


# ---------------------------------------------------------------- collecting


def stacks_path(run_id: str) -> str:
    return f"{STACKS_ROOT}/{run_id}"


def collect_script(run_id: str, wait_s: float = DUMP_WAIT_S, folder: str = STACKS_ROOT) -> str:
    """Bash run on one host: for each rank registered there (its pid file names
    this host), the state and CPU time, SIGUSR1, wait, again, and the dump.
    The run id never appears literally (the glob finds the folder
    ``folder``/RUN_ID), so a sweep's ``pkill -f RUN_ID`` never matches this
    script."""
    glob_dir = f"{folder}/[{run_id[0]}]{run_id[1:]}"
    # Run by bash whatever the login shell (zsh on macOS fails unmatched globs).
    return "exec bash -c " + shlex.quote(f"""
tck=$(getconf CLK_TCK 2>/dev/null || echo 100); echo "TCK $tck"
me=$(uname -n)
for d in {glob_dir}; do [ -d "$d" ] && cd "$d" || exit 0; done
cpu() {{ if [ -r /proc/$1/stat ]; then awk '{{print "ticks:" ($14+$15)}}' /proc/$1/stat 2>/dev/null || echo none;
        else t=$(ps -o time= -p $1 2>/dev/null | tr -d ' '); echo "ps:${{t:-none}}"; fi; }}
st() {{ s=$(ps -o stat=,time= -p $1 2>/dev/null | tr -s ' ' | sed 's/^ //'); echo "${{s:--}}"; }}
mine=""
for f in rank*.pid; do
  [ -f "$f" ] || continue
  read pid host < "$f"
  [ "$host" = "$me" ] || continue
  r=${{f#rank}}; r=${{r%.pid}}
  mine="$mine $r:$pid"
  : > "rank$r.stacks"
  echo "R $r $pid $(cpu $pid) $(st $pid)"
  kill -USR1 "$pid" 2>/dev/null
done
sleep {wait_s}
for e in $mine; do
  r=${{e%%:*}}; pid=${{e#*:}}
  echo "C $r $pid $(cpu $pid) $(st $pid)"
  echo "==> $r"; cat "rank$r.stacks" 2>/dev/null; echo "<== $r"
done
true
""")


def cpu_seconds(text: str, ticks_per_s: float) -> float | None:
    """'ticks:523' or 'ps:00:01:02' / 'ps:1-02:03:04' / 'ps:0:05.23' -> seconds."""
    kind, _, value = text.partition(":")
    try:
        if kind == "ticks":
            return float(value) / ticks_per_s
        if kind == "ps" and value not in ("", "none"):
            days, _, clock = value.rpartition("-")
            total = 0.0
            for part in clock.split(":"):
                total = total * 60 + float(part)
            return total + (float(days) * 86400 if days else 0.0)
    except ValueError:
        return None
    return None


def parse_collect(output: str) -> list[tuple[int, int, str | None, float | None, float | None, str]]:
    """The collect script's output -> (rank, pid, stat, cpu before, cpu after, stacks) per rank."""
    tck = 100.0
    before: dict[int, tuple[int, float | None]] = {}
    after: dict[int, tuple[str | None, float | None]] = {}
    stacks: dict[int, list[str]] = {}
    reading: int | None = None
    for line in output.splitlines():
        if reading is not None:
            if line == f"<== {reading}":
                reading = None
            else:
                stacks[reading].append(line)
            continue
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "TCK" and len(parts) > 1:
            try:
                tck = float(parts[1]) or 100.0
            except ValueError:
                pass
        elif parts[0] in ("R", "C") and len(parts) >= 5 and parts[1].isdigit() and parts[2].isdigit():
            rank, pid, cpu = int(parts[1]), int(parts[2]), cpu_seconds(parts[3], tck)
            stat = None if parts[4] == "-" else parts[4]
            if parts[0] == "R":
                before[rank] = (pid, cpu)
            else:
                after[rank] = (stat, cpu)
        elif parts[0] == "==>" and len(parts) == 2 and parts[1].isdigit():
            reading = int(parts[1])
            stacks[reading] = []
    found = []
    for rank, (pid, cpu1) in sorted(before.items()):
        stat, cpu2 = after.get(rank, (None, None))
        found.append((rank, pid, stat, cpu1, cpu2, "\n".join(stacks.get(rank, [])).strip()))
    return found


def collect_states(rank_hosts: list, run_id: str, run_script: Callable,
                   for_each_host: Callable, folder: str = STACKS_ROOT) -> list[RankState]:
    """Every rank's state, asked on every distinct host at once.

    ``rank_hosts``: the job's hosts by rank (objects with ``name`` and
    ``ssh``); ``run_script(host, script) -> result`` with ``ok``, ``output``
    and ``error`` (mlxcluster.smoke.remote.run_script); ``for_each_host``
    runs it on every host in parallel. A rank no host reports is 'not found'.
    ``folder``: where the ranks' pid and stack files are, in ``RUN_ID/``.
    """
    distinct = list({h.ssh: h for h in rank_hosts}.values())
    script = collect_script(run_id, folder=folder)
    results = for_each_host(distinct, lambda h: (h, run_script(h, script)))
    states: dict[int, RankState] = {}
    errors: dict[str, str] = {}
    for host, result in results:
        if not result.ok:
            errors[host.ssh] = (result.error or "failed").splitlines()[-1]
            continue
        for rank, pid, stat, cpu1, cpu2, stacks in parse_collect(result.output):
            if 0 <= rank < len(rank_hosts):
                states[rank] = RankState(rank, rank_hosts[rank].name, pid, stat, cpu1, cpu2, stacks)
    for rank, h in enumerate(rank_hosts):
        if rank not in states:
            states[rank] = RankState(rank, h.name, error=errors.get(h.ssh))
    return [states[r] for r in sorted(states)]


@dataclass
class StallReport:
    summary: str  # the diagnosis line
    ranks: list[str] = field(default_factory=list)  # one line per rank
    directory: Path | None = None  # where the full stacks were saved


def save_report(directory: Path, summary: str, states: list[RankState], header: str) -> Path:
    """``directory``/summary.txt and one ``rank<R>.txt`` (state + full stacks) per rank."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.txt").write_text(
        f"{header}\n{summary}\n\n" + "\n".join(rank_lines(states)) + "\n")
    for s in states:
        (directory / f"rank{s.rank}.txt").write_text(
            f"rank {s.rank} on {s.host}, pid {s.pid}: {s.describe()[3:]}\n"
            f"CPU seconds: {s.cpu_before} -> {s.cpu_after} over {DUMP_WAIT_S:g} s\n\n"
            + (s.stacks or "(no stack: a stopped process dumps only once continued)") + "\n")
    return directory


@dataclass
class Examined:
    """A stalled job looked at: every rank's state, the diagnosis, where it was saved."""

    states: list[RankState]
    summary: str
    directory: Path | None  # None: the report could not be written


def examine(rank_hosts: list, run_id: str, run_script: Callable, for_each_host: Callable,
            report_dir: Path | None, header: str, folder: str = STACKS_ROOT) -> Examined:
    """``collect_states``, ``diagnose`` and ``save_report`` into ``report_dir``,
    in one call (``report_dir`` None, or a report that cannot be written,
    leaves ``directory`` None)."""
    states = collect_states(rank_hosts, run_id, run_script, for_each_host, folder=folder)
    summary = diagnose(states)
    directory: Path | None = None
    if report_dir is not None:
        try:
            directory = save_report(report_dir, summary, states, header)
        except OSError:
            directory = None
    return Examined(states, summary, directory)
