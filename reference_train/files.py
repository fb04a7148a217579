"""Files and folders the trainer writes whole or not at all, and the hash that vouches for them.

Token directories (data.py), exported model folders (hf_io.py) and
checkpoints (checkpoint.py) are each written under a temporary name beside
their place and renamed into it, so a reader never sees half of one; their
files' sha256 lets a copy on another host, or after a crash, be checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, as hex (read 1 MiB at a time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the finished folder `tmp` to `final`, replacing an older one (moved
    aside first, so `final` is never half old, half new).

    When another process put its own `final` in place meanwhile (ranks preparing
    the default corpus side by side), its copy wins and ours is discarded: both
    were written whole, by the same code.
    """
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        try:
            final.rename(old)
        except FileNotFoundError:  # another process moved it aside first
            old = None
    try:
        tmp.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
