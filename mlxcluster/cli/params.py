"""Flag types and flags shared by the commands."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable

import click

from mlxcluster.hostfile.tuned import MAX_CONNECTIONS
from mlxcluster.inventory.inventory import Inventory, load_inventory
from mlxcluster.inventory.inventory_search import InventoryChoice, find_inventory
from mlxcluster.launch.job_source import JobSource
from mlxcluster.launch.session import LaunchFlags


class Seconds(click.FloatRange):
    """A duration in seconds within a range. click's FloatRange lets 'nan'
    through (every comparison with NaN is false), and a NaN deadline never
    expires: refuse it."""

    name = "seconds"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|h|m|s)?")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration written as people write it: ``90``, ``90s``,
    ``2.5s``, ``30m``, ``2h``, ``1h30m``, ``1m30s``, ``500ms`` (a bare number
    is seconds). ValueError for anything else, negative values included."""
    raw = str(text).strip().lower()
    if not raw:
        raise ValueError("empty duration")
    total, pos, units = 0.0, 0, []
    for match in _DURATION_RE.finditer(raw):
        if match.start() != pos:
            break
        unit = match.group(2)
        if unit is None and (match.start() != 0 or match.end() != len(raw)):
            break  # a bare number is seconds only on its own ("1h30", "1 30m" are unclear)
        units.append(unit)
        total += float(match.group(1)) * _UNIT_SECONDS[unit]
        pos = match.end()
    if pos != len(raw) or not units or len(set(units)) != len(units):
        raise ValueError(f"{text!r} is not a duration (e.g. 90, 90s, 30m, 2h, 1h30m)")
    if not math.isfinite(total):
        raise ValueError(f"{text!r} is not a finite duration")
    return total


class Duration(click.ParamType):
    """A duration (``parse_duration``), as float seconds within [low, high].
    ``words`` are accepted as they are (``("auto", "off")``), lower-cased."""

    name = "duration"

    def __init__(self, low: float | None = None, high: float | None = None,
                 words: tuple[str, ...] = ()):
        self.low, self.high, self.words = low, high, words

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() in self.words:
            return value.strip().lower()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(value)
            except ValueError as err:
                self.fail(str(err), param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a duration", param, ctx)
        if self.low is not None and seconds < self.low:
            self.fail(f"{value} is below the minimum of {self.low:g} s", param, ctx)
        if self.high is not None and seconds > self.high:
            self.fail(f"{value} is above the maximum of {self.high:g} s", param, ctx)
        return seconds


INVENTORY_HELP = ("Inventory YAML (default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                  "~/.config/mlxcluster/cluster.yaml).")


def inventory_option(help_text: str = INVENTORY_HELP):
    """The -i/--inventory flag of every command that reads an inventory; the
    value is None when not given (``load_chosen_inventory`` finds the default)."""
    return click.option("-i", "--inventory", "inventory_path", type=click.Path(dir_okay=False),
                        default=None, help=help_text)


def choose_inventory(given: str | None, *, other_sources: str = "") -> InventoryChoice:
    """-i, or the default inventory, naming on stderr the file found by
    default (stdout stays clean for --json). ``other_sources`` ("--hostfile
    FILE or --local N") joins the hint when there is no inventory at all."""
    choice = find_inventory(given, other_sources=other_sources)
    if not choice.given:
        click.echo(choice.describe(), err=True)
    return choice


def load_chosen_inventory(given: str | None, *, other_sources: str = "") -> Inventory:
    """``choose_inventory``, loaded."""
    return load_inventory(choose_inventory(given, other_sources=other_sources).path)


def launch_options(backends: tuple[str, ...]):
    """The flags of the commands that launch a job on every host (`run`,
    `train`): where the ranks run (--hostfile, -i, --local), the backend
    (one of ``backends``), the python, mpirun's extra arguments, the
    preflight and OpenBLAS switches, and the timeout."""
    options = [
        click.option("--hostfile", type=click.Path(exists=True, dir_okay=False),
                     help="A hostfile: mlx.launch's JSON or an Open MPI one (host slots=N)."),
        inventory_option("An mlxcluster inventory (YAML). Used when no --hostfile or --local is "
                         "given; default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                         "~/.config/mlxcluster/cluster.yaml."),
        click.option("--local", "local_ranks", type=click.IntRange(1, 64), metavar="[N]",
                     help=f"Run N ranks on this machine instead (--local alone: {LOCAL_RANKS_DEFAULT})."),
        click.option("--backend", type=click.Choice(backends), default=None,
                     help="Distributed backend (default: the hostfile's, else ring)."),
        click.option("--python", "python", default=None,
                     help="Python on every host for --hostfile/--local (default: this one)."),
        click.option("--mpi-arg", "mpi_args", multiple=True, metavar="ARG",
                     help="Extra mpirun argument (repeatable; use --mpi-arg=--flag)."),
        click.option("--connections-per-ip", type=click.IntRange(1, MAX_CONNECTIONS), default=None,
                     help="ring: mlx.launch --connections-per-ip (default: the hostfile's .args, "
                          "as 'mlxcluster tune' wrote it, else 1)."),
        click.option("--no-preflight", is_flag=True,
                     help="Skip the doctor checks (-i), the host probe and the all_sum smoke "
                          "(the python is still looked for on every host)."),
        click.option("--no-openblas", is_flag=True, help="Do not preload OpenBLAS on Linux hosts."),
        click.option("--no-sync-code", is_flag=True,
                     help="Do not send what ranks import of mlxcluster (reference_train, the rank "
                          "wrapper) to ~/.cache/mlxcluster/code on every host; every host then "
                          "needs this checkout at the same path (a shared folder)."),
        click.option("--timeout", type=Duration(1), default=None,
                     help="Stop every rank after this long (90, 90s, 30m, 2h)."),
    ]

    def decorate(command):
        for option in reversed(options):  # click lists options in decorator order, top first
            command = option(command)
        return command

    return decorate


def launch_flags(hostfile, inventory_path, local_ranks, backend, python, mpi_args, connections_per_ip,
                 no_preflight, no_openblas, no_sync_code) -> LaunchFlags:
    """The launch session's ``LaunchFlags`` from ``launch_options``' values
    (all but --timeout, which the launch itself takes)."""
    return LaunchFlags(JobSource(hostfile, inventory_path, local_ranks, backend, python,
                                 tuple(mpi_args), connections_per_ip),
                       preflight=not no_preflight, openblas=not no_openblas,
                       send_code=not no_sync_code)


LOCAL_RANKS_DEFAULT = 2  # `--local` without N, where a command runs ranks


def local_spelled_one_way(args: list[str], *, runs_ranks: bool) -> list[str]:
    """``--local [N]`` means "on this machine" on every command: ``N`` ranks
    where the command runs ranks (smoke, train, run, serve; ``--local`` alone
    is LOCAL_RANKS_DEFAULT), and where it only looks there (doctor, jobs,
    attach, stop) the N a job was started with is taken and not needed. N is
    the word after ``--local`` only when it is a number, so ``stop --local
    RUN_ID`` and ``serve --local MODEL`` read as typed. What follows ``--``
    is the program's and is left alone."""
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return out + args[i:]
        if word == "--local" or word.startswith("--local="):
            given = word.partition("=")[2] if "=" in word else None
            if given is None and i + 1 < len(args) and args[i + 1].isdigit():
                given, i = args[i + 1], i + 1
            if runs_ranks:
                out += ["--local", given or str(LOCAL_RANKS_DEFAULT)]
            else:
                if given is not None and not given.isdigit():
                    raise click.BadParameter(f"{given!r} is not a number of ranks",
                                             param_hint="'--local'")
                out.append("--local")
            i += 1
            continue
        out.append(word)
        i += 1
    return out


class LocalMeansHere(click.Command):
    """A command whose ``--local [N]`` is read as ``local_spelled_one_way``
    says; ``runs_ranks``: whether N is its rank count."""

    def __init__(self, *args, runs_ranks: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs_ranks = runs_ranks

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, local_spelled_one_way(args, runs_ranks=self.runs_ranks))


class ProgramAfterDashDash(LocalMeansHere):
    """A command that hands a program its arguments (train's trainer, run's
    script, serve's mlx_lm.server): what follows the first `--`, and only
    that, is the program's (the parameter ``program_param``). Before `--`,
    mlxcluster's options are its own wherever they stand, before or after
    MODEL_DIR; one it does not know is refused with click's "did you mean",
    never handed on in silence."""

    def __init__(self, *args, program_param: str, program: str, example: str,
                 program_flags: Callable[[], set[str]] = set, **kwargs):
        super().__init__(*args, runs_ranks=True, **kwargs)
        self.program_param, self.program, self.example = program_param, program, example
        self.program_flags = program_flags  # the program's own options, when known here

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        own, theirs = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args \
            else (args, [])
        try:
            rest = super().parse_args(ctx, own)  # --local read first (LocalMeansHere)
        except click.NoSuchOption as err:
            theirs = self.program_flags()
            close = difflib.get_close_matches(err.option_name, sorted(theirs), n=1)
            if err.option_name in theirs:
                err.message = f"{err.option_name} is {self.program}'s option, not mlxcluster's"
                err.possibilities = None
            elif close and not err.possibilities:
                err.message = (f"No such option '{err.option_name}'. Did you mean {self.program}'s "
                               f"'{close[0]}' (after '--')?")
            err.hint = (f"options for {self.program} go after '--' "
                        f"(e.g. {self.example}); 'mlxcluster {self.name} --help' lists mlxcluster's")
            raise
        except click.UsageError as err:
            if "unexpected extra argument" in err.message:
                err.hint = f"arguments for {self.program} go after '--' (e.g. {self.example})"
            raise
        ctx.params[self.program_param] = tuple(theirs)
        return rest
