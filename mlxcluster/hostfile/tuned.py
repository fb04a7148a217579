"""The tuned launcher settings recorded beside a hostfile, as ``smoke``,
``train`` and ``run`` pick them up.

``mlxcluster tune -o OUT`` (and ``hostfile generate --backend mpi``) write
``OUT.args`` beside the hostfile: the launcher arguments that go with it,
because neither mlx.launch's JSON hostfile nor Open MPI's ``host slots=1``
file has a field for them. The knobs in it are the tuned ones:

    # hostfile-ring.json.args (ring: an mlx.launch flag)
    --connections-per-ip 2

    # hostfile-mpi.txt.args (mpi: mpirun arguments; btl_tcp_links and the
    # allreduce algorithm are taken)
    -x MLX_MPI_LIBNAME=/opt/venv/lib/libmpi.so --mca btl tcp,self --mca btl_tcp_links 2
    --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4

Given ``--hostfile OUT``, the commands read ``OUT.args`` (when it exists)
and use those values unless the command line sets them itself
(``--connections-per-ip N``; ``--mpi-arg "--mca btl_tcp_links N"``;
``--mpi-arg "--mca coll_tuned_allreduce_algorithm N"``). The rest of an mpi
``.args`` (interfaces, env) is left to mpirun users: our launchers build
their own.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.facts.mpi import (
    ALLREDUCE_ALGORITHMS,
    ALLREDUCE_PARAM,
    DYNAMIC_RULES_PARAM,
    allreduce_args,
)

MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class TunedSettings:
    """What ``source`` (a hostfile's ``.args``) sets; None: not set there."""

    source: str
    connections_per_ip: int | None = None
    tcp_links: int | None = None
    allreduce_algorithm: int | None = None  # Open MPI's coll_tuned_allreduce_algorithm


@dataclass(frozen=True)
class Applied:
    """The settings a launch uses and where each came from (one line per
    setting, for the user: what was picked up, what the command line overrode)."""

    connections_per_ip: int
    mpi_args: tuple[str, ...]
    notes: tuple[str, ...] = ()


def args_path(hostfile: str | Path) -> Path:
    """The launcher-arguments file beside a hostfile: ``OUT`` -> ``OUT.args``."""
    return Path(f"{hostfile}.args")


def parse_tuned_args(text: str, source: str) -> TunedSettings:
    """The tuned knobs in the text of a ``.args`` file (other arguments are ignored)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise InputError(f"{source}: cannot split into arguments ({err})",
                         "fix the quoting, or regenerate it with mlxcluster tune") from None
    connections = links = algorithm = None
    for i, word in enumerate(words):
        if word == "--connections-per-ip" or word.startswith("--connections-per-ip="):
            value = word.split("=", 1)[1] if "=" in word else _next(words, i, source, word)
            connections = _count(value, source, "--connections-per-ip")
        elif _is_mca(words, i, "btl_tcp_links"):
            links = _count(_next(words, i, source, "--mca btl_tcp_links"), source, "btl_tcp_links")
        elif _is_mca(words, i, ALLREDUCE_PARAM):
            algorithm = _algorithm(_next(words, i, source, f"--mca {ALLREDUCE_PARAM}"), source)
    return TunedSettings(source, connections, links, algorithm)


def _is_mca(words: list[str] | tuple[str, ...], i: int, name: str) -> bool:
    """Whether ``words[i]`` is the parameter ``name`` of a ``--mca NAME VALUE``."""
    return words[i] == name and i > 0 and words[i - 1] in ("--mca", "-mca")


def _algorithm(value: str, source: str) -> int:
    """An allreduce algorithm as Open MPI takes it: its number or its name."""
    if value in ALLREDUCE_ALGORITHMS:
        return ALLREDUCE_ALGORITHMS[value]
    if value.isdigit() and int(value) in ALLREDUCE_ALGORITHMS.values():
        return int(value)
    raise InputError(f"{source}: {ALLREDUCE_PARAM} {value!r} is not one of Open MPI's allreduce "
                     f"algorithms (0-{max(ALLREDUCE_ALGORITHMS.values())}: "
                     f"{', '.join(f'{n} {k}' for k, n in ALLREDUCE_ALGORITHMS.items())})",
                     "fix the value (4 is the ring), or regenerate the file with mlxcluster tune")


def _next(words: list[str], i: int, source: str, flag: str) -> str:
    if i + 1 >= len(words):
        raise InputError(f"{source}: {flag} has no value", "give it a number, e.g. "
                         f"{flag} 2, or regenerate the file with mlxcluster tune")
    return words[i + 1]


def _count(value: str, source: str, flag: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_CONNECTIONS:
        raise InputError(f"{source}: {flag} {value!r} is not a whole number from 1 to {MAX_CONNECTIONS}",
                         "fix the value, or regenerate the file with mlxcluster tune")
    return int(value)


def read_tuned(hostfile: str | Path | None) -> TunedSettings | None:
    """The settings recorded beside ``hostfile``; None when there is no ``.args``."""
    if not hostfile:
        return None
    path = args_path(hostfile)
    if not path.is_file():
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read {path}: {err}",
                         "fix its permissions, or remove it to launch with the defaults") from None
    return parse_tuned_args(text, str(path))


def split_words(args: tuple[str, ...]) -> tuple[str, ...]:
    """Arguments given as strings of several words ("--mca a b") as single words."""
    return tuple(w for arg in args for w in shlex.split(arg))


def sets_mca(mpi_args: tuple[str, ...], name: str) -> bool:
    """Whether the user's mpirun arguments (each maybe several words) set the MCA parameter ``name``."""
    words = split_words(mpi_args)
    return any(_is_mca(words, i, name) for i in range(len(words)))


def apply_tuned(tuned: TunedSettings | None, backend: str, connections_flag: int | None,
                mpi_args: tuple[str, ...] = ()) -> Applied:
    """The connections per IP and mpirun arguments of a launch: the command
    line's when given, else the tuned ones for this backend, else the defaults
    (1 connection per IP; no btl_tcp_links or allreduce argument, the
    launcher's own)."""
    notes: list[str] = []
    connections = connections_flag or 1
    if backend == "ring" and tuned and tuned.connections_per_ip:
        if connections_flag is None:
            connections = tuned.connections_per_ip
            notes.append(f"tuned: --connections-per-ip {connections} (from {tuned.source}; "
                         "override with --connections-per-ip N)")
        elif connections_flag != tuned.connections_per_ip:
            notes.append(f"--connections-per-ip {connections_flag} given: not the "
                         f"{tuned.connections_per_ip} of {tuned.source}")
    picked: list[str] = []  # tuned mpirun arguments, before the user's own
    if backend == "mpi" and tuned and tuned.tcp_links:
        if not sets_mca(mpi_args, "btl_tcp_links"):
            picked.append(f"--mca btl_tcp_links {tuned.tcp_links}")
            notes.append(f"tuned: --mca btl_tcp_links {tuned.tcp_links} (from {tuned.source}; "
                         "override with --mpi-arg \"--mca btl_tcp_links N\")")
        else:
            notes.append(f"btl_tcp_links given with --mpi-arg: not the {tuned.tcp_links} of {tuned.source}")
    if backend == "mpi" and tuned and tuned.allreduce_algorithm is not None:
        if not sets_mca(mpi_args, ALLREDUCE_PARAM):
            forced = allreduce_args(tuned.allreduce_algorithm)
            if sets_mca(mpi_args, DYNAMIC_RULES_PARAM):  # mpirun refuses a parameter twice: theirs stays
                forced = forced[3:]
            picked.append(shlex.join(forced))
            notes.append(f"tuned: {picked[-1]} (from {tuned.source}; override with "
                         f"--mpi-arg \"--mca {ALLREDUCE_PARAM} N\", 0 for Open MPI's own choice)")
        else:
            notes.append(f"{ALLREDUCE_PARAM} given with --mpi-arg: not the "
                         f"{tuned.allreduce_algorithm} of {tuned.source}")
    return Applied(connections, (*picked, *mpi_args), tuple(notes))


def tuned_job(job, hostfile: str | Path | None, connections_flag: int | None):
    """A train/run job (``TrainJob``) with the settings recorded beside
    ``hostfile`` applied (apply_tuned); returns it and the notes to show."""
    applied = apply_tuned(read_tuned(hostfile), job.backend, connections_flag, job.mpi_args)
    return replace(job, connections_per_ip=applied.connections_per_ip,
                   mpi_args=applied.mpi_args), applied.notes
