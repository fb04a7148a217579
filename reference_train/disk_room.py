"""Room on this host's disk for what the trainer writes, and what it says when there is none.

A Mac whose disk fills mid-run made MLX stop the rank with its own words
only (`[write] Unable to write 8 bytes to file.`), naming neither the host,
the folder nor the cause. Here, every write the trainer does to --out
(checkpoints, a checkpoint received on resume, the exported model) runs in
`said_when_full`, which turns MLX's failed write (a RuntimeError) or an
OSError ENOSPC / EDQUOT into a DataError the trainer prints as one line:

    error: labhost2: no room to write checkpoint step_000004 in /runs/demo/checkpoints:
    12.0 KiB free there (mlx: unable to write 8 bytes to file) (hint: free room on labhost2
    (df -h /runs/demo/checkpoints) or train with another --out, then run again with
    --resume auto: it goes on from the newest whole checkpoint)

The half-written folder is removed by the writer (checkpoint.py, hf_io.py),
so the previous checkpoint and the newest whole one on the other hosts are
what a resume starts from.

Before each checkpoint after the first, `RoomWatch` compares the room left
with the size of the last one (the sum of its files), `room_verdict`:

- less than one checkpoint's size plus `MARGIN`: the same DataError, before
  anything is written (a new checkpoint is written whole before the oldest
  is pruned, so it needs its full size free);
- less than twice that: a warning, once a run (on every host that writes).
"""

from __future__ import annotations

import errno
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError

MARGIN = 64 << 10  # beyond the files' bytes: `latest`, the temporary folder, the file system's blocks
WARN_TIMES = 2  # warn when less than this many checkpoints' room is left
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MLX_WRITE_FAILED = "[write] Unable to write"  # mlx/io/load.h, FileWriter::write


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write that found no room: an OSError ENOSPC or
    EDQUOT, or MLX's failed write (its message gives no errno; a full disk or
    quota is what makes a regular file's write(2) fail)."""
    if isinstance(error, OSError):
        return error.errno in FULL_ERRNOS
    return isinstance(error, RuntimeError) and MLX_WRITE_FAILED in str(error)


def free_bytes(folder: str | Path) -> int | None:
    """Bytes free to this user in ``folder``'s file system (its nearest existing
    parent when it is not there yet); None when that cannot be read."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def human(n: int) -> str:
    """Bytes as a person reads them: 512 bytes, 12.0 KiB, 3.4 MiB, 1.2 GiB."""
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def cause_of(error: BaseException) -> str:
    """The failed write in a few words, without MLX's bracketed prefix (which
    the launcher's known errors match: mlxcluster/doctor/known_errors.py)."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return "mlx: " + str(error).replace(MLX_WRITE_FAILED, "unable to write").rstrip(".")


def no_room(folder: str | Path, what: str, *, free: int | None, cause: str = "",
            needed: int | None = None, host: str | None = None) -> DataError:
    """The DataError for a disk without room for ``what`` in ``folder``: the
    host, the folder, the bytes free there (and needed, when known), the fix."""
    host = host or socket.gethostname()
    room = "the room left could not be read" if free is None else f"{human(free)} free there"
    if needed is not None:
        room += f", {human(needed)} needed"
    said = f"{host}: no room to write {what} in {folder}: {room}"
    if cause:
        said += f" ({cause})"
    return DataError(said, f"free room on {host} (df -h {folder}) or train with another --out, "
                           "then run again with --resume auto: it goes on from the newest whole "
                           "checkpoint")


@contextmanager
def said_when_full(folder: str | Path, what: str) -> Iterator[None]:
    """Run a write to ``folder``; a write that found no room becomes `no_room`'s
    DataError (other errors pass through as they are)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if not is_disk_full(e):
            raise
        raise no_room(folder, what, free=free_bytes(folder), cause=cause_of(e)) from None


def full_disk_error(error: OSError, out: str | Path) -> DataError:
    """no_room's DataError for a write that found no room outside `said_when_full`
    (a metrics file): in its file's folder, else in --out."""
    folder = Path(error.filename).parent if error.filename else Path(out)
    what = Path(error.filename).name if error.filename else "the run's files"
    return no_room(folder, what, free=free_bytes(folder), cause=cause_of(error))


def room_verdict(free: int, size: int, margin: int = MARGIN) -> str:
    """'ok', 'low' (less than WARN_TIMES checkpoints of ``size`` bytes fit in
    ``free``) or 'full' (not even one: writing it would fail)."""
    if free < size + margin:
        return "full"
    if free < WARN_TIMES * size + margin:
        return "low"
    return "ok"


def folder_bytes(path: Path) -> int:
    """The sum of the sizes of the files in ``path`` (a checkpoint's)."""
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


@dataclass
class RoomWatch:
    """One writing rank's look at its checkpoint folder before each save."""

    size: int | None = None  # the last checkpoint's bytes (None before the first)
    warned: bool = False

    def saw(self, checkpoint: Path) -> None:
        """Remember the size of a checkpoint written (or loaded) on this host."""
        self.size = folder_bytes(checkpoint)

    def before(self, folder: Path, what: str, free: int | None = None) -> str | None:
        """Before writing ``what`` to ``folder``: raise no_room's DataError when
        it cannot fit; return a warning the first time room runs low."""
        if self.size is None:
            return None
        free = free_bytes(folder) if free is None else free
        if free is None:
            return None
        verdict = room_verdict(free, self.size)
        if verdict == "full":
            raise no_room(folder, what, free=free, needed=self.size + MARGIN,
                          cause="checked before writing; nothing was written")
        if verdict == "low" and not self.warned:
            self.warned = True
            return (f"{socket.gethostname()}: {human(free)} free in {folder}, room for fewer than "
                    f"{WARN_TIMES} checkpoints of {human(self.size)}: free room on "
                    f"{socket.gethostname()} before the disk fills (the run stops, with its "
                    "last checkpoint intact, when one no longer fits)")
        return None
