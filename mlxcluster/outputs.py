"""Files the commands write: check an output path before any work, then
write every file or none (temporary file + rename).

Checked up front so that a bad path costs nothing: not after a probe of
every host, a smoke run or a browse."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mlxcluster.errors import InputError


def check_output_path(path: str | Path, *, what: str = "", inputs: dict[str, str | None] | None = None,
                      force: bool = True) -> Path:
    """Refuse, before any work, an output that is empty, a directory, in a
    folder that does not exist or cannot be written, not writable itself,
    the same file as an input (``inputs``: flag -> path), or (unless
    ``force``) an existing file. ``what`` leads the message ("the PNG to ")."""
    text = str(path)
    if not text.strip():
        raise InputError("the output path is empty", "pass a file name, or leave -o out to print to stdout")
    target = Path(text)
    for flag, given in (inputs or {}).items():
        if given and target.resolve() == Path(given).resolve():
            raise InputError(f"{text} is the {flag} file: writing it would replace its input",
                             "pass another output path")
    where = f"cannot write {what}{text}"
    if target.is_dir():
        raise InputError(f"{where}: it is a directory", "pass a file name")
    folder = target.resolve().parent
    if not folder.is_dir():
        raise InputError(f"{where}: the folder {target.parent} does not exist",
                         f"create it first (mkdir -p {target.parent}) or pass a path in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{where}: the folder {target.parent} is not writable",
                         "pass a path in a folder you can write")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise InputError(f"{where}: it is not writable", "pass a path you can write")
        if not force:
            raise InputError(f"{text} already exists", "pass --force to replace it, or another path")
    return target


def check_output_paths(paths: list[str], inputs: dict[str, str | None], *, force: bool = True) -> None:
    """check_output_path for each of ``paths``."""
    for path in paths:
        check_output_path(path, inputs=inputs, force=force)


def write_files(texts: dict[str, str]) -> None:
    """Write every file or none: each to a temporary file beside it first, then
    renamed over its target (a reader never sees a half-written file, and a
    failure leaves earlier versions in place)."""
    written: list[tuple[str, Path, str]] = []
    current = ""
    try:
        for current, text in texts.items():
            target = Path(os.path.realpath(current))  # through a symlink, as a plain write does
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            written.append((tmp, target, current))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, _file_mode(target))
        for tmp, target, path in written:
            current = path  # named if the rename fails
            os.replace(tmp, target)
    except OSError as exc:
        raise InputError(f"cannot write {current}: {exc.strerror or exc}",
                         "pass a path in a writable folder") from None
    finally:
        for tmp, _, _ in written:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _file_mode(target: Path) -> int:
    """The target's mode when it exists, else what a plain write would give (0666 less the umask)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask
