"""`mlxcluster run`'s program and its output: which argv every rank runs,
which rank wrote each line, and one log file per rank.

Every rank runs under mlxcluster.jobs.rank_wrapper with ``MLXCLUSTER_TAG_OUTPUT=1``,
so each line it writes (stdout or stderr, Python or C) reaches the launcher as
``[R] text``. Lines without that prefix come from the launcher itself
(mlx.launch's warnings, mpirun's messages) or from a rank before the wrapper
ran (a python that cannot start)::

    [0] loss 2.31          -> rank 0: runs/run-mlxtrain-1a2b3c4d5e/rank0.log
    [2] Traceback (...)    -> rank 2: .../rank2.log
    [WARN] Node with rank 2 exited with code 3   -> .../launcher.log
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from pathlib import Path
from typing import TextIO

from mlxcluster.errors import InputError

RANK_LINE_RE = re.compile(r"^\[(\d+)\] ?(.*)$", re.S)
TAIL_LINES = 20  # kept per rank: shown when a rank hidden by --rank0-only fails
USAGE_HINT = "e.g. mlxcluster run --local 2 -- python train.py --lr 0.1, or -- -m my.module ARGS"


def program_argv(words: tuple[str, ...] | list[str], cwd: str | None = None) -> tuple[str, ...]:
    """The python arguments every rank runs, from what followed ``--``:
    ``[python] script.py ARGS`` or ``[python] -m module ARGS``. A leading
    ``python``/``python3``/a path to a python is dropped (the job's python
    runs it on every host); a script path is made absolute against ``cwd``
    (default: the current directory), so it names the same file whatever
    directory a rank starts in."""
    words = list(words)
    if words and is_python_word(words[0]):
        words = words[1:]
    if not words:
        raise InputError("no program to run", f"give it after '--': {USAGE_HINT}")
    if words[0] == "-m":
        if len(words) < 2 or words[1].startswith("-"):
            raise InputError("-m needs a module name", f"{USAGE_HINT}")
        return tuple(words)
    if words[0].startswith("-"):
        raise InputError(f"run starts a script or a module, not python {words[0]!r}",
                         f"put the code in a file: {USAGE_HINT}")
    script = os.path.normpath(os.path.join(cwd or os.getcwd(), words[0]))
    return (script, *words[1:])


def is_python_word(word: str) -> bool:
    """``python``, ``python3``, ``python3.12`` or a path to one."""
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(word)) is not None


def script_of(program: tuple[str, ...]) -> str | None:
    """The script path a program runs (None for ``-m module``)."""
    return None if not program or program[0] == "-m" else program[0]


def split_rank(line: str) -> tuple[int | None, str]:
    """(rank, text) of one output line; (None, line) for a launcher's own line."""
    found = RANK_LINE_RE.match(line)
    if not found:
        return None, line
    return int(found.group(1)), found.group(2)


class RankLogs:
    """One file per rank (``rank<R>.log``) plus ``launcher.log`` for the
    lines no rank wrote, in ``folder``. Thread-safe (stdout and stderr are
    pumped by two threads); each file is opened, emptied, as its first line
    arrives (a reused folder: each file written holds this run's lines)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, TextIO] = {}
        self._tails: dict[int, deque[str]] = {}
        self._lock = threading.Lock()

    def write(self, line: str) -> tuple[int | None, str]:
        """Append ``line`` to its rank's file; returns ``split_rank(line)``."""
        rank, text = split_rank(line)
        name = "launcher.log" if rank is None else f"rank{rank}.log"
        with self._lock:
            f = self._files.get(name)
            if f is None:
                f = self._files[name] = open(self.folder / name, "w", encoding="utf-8")  # noqa: SIM115
            f.write(text.rstrip("\r") + "\n")
            f.flush()
            if rank is not None:
                self._tails.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text.rstrip("\r"))
        return rank, text

    def tail(self, rank: int) -> list[str]:
        """The last lines (up to ``TAIL_LINES``) rank ``rank`` wrote."""
        with self._lock:
            return list(self._tails.get(rank, ()))

    def files(self) -> list[Path]:
        with self._lock:
            return sorted(self.folder / name for name in self._files)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


def open_rank_logs(logs_dir: str | None, run_id: str) -> tuple[Path, RankLogs]:
    """The logs folder (``--logs``, default ./runs/RUN_ID) and its RankLogs;
    InputError (exit 2) when it cannot be made."""
    folder = Path(logs_dir) if logs_dir else Path("runs") / run_id
    try:
        return folder, RankLogs(folder)
    except OSError as err:
        raise InputError(f"cannot create the logs folder {folder}: {err.strerror}",
                         "give --logs a folder you can write to") from None
