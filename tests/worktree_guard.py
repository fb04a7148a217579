"""No test writes into the working tree: what a test run left in the repository.

tests/conftest.py takes a snapshot of the checkout when the session starts and
another when it ends; a path that appeared in between and looks like a run's
output fails the session, named (a test must write into a temporary folder:
``tmp_path``, ``cwd=tmp_path``, ``monkeypatch.chdir(tmp_path)``).

Other people may edit the checkout while the tests run, so only the files
that APPEARED and git does not know count (never an edit, a deletion or a
staged file), and of those only output, never a source file someone added:

- anything .gitignore covers (``runs/``, ``out/``, ``stall-*/``, a tuned
  hostfile...): what a run leaves, by the ignore file's own account;
- a new entry at the repository's root (``loss.png``, ``metrics.jsonl``);
- anything under ``runs/``, ``out/`` or a ``stall-*`` folder, at any depth.

Caches and the virtualenv are never counted. A tree that is not a git
checkout (an sdist, a copied folder) is not checked.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Never output of a test: interpreters, tools and packaging leave these.
NOISE_PARTS = {".venv", "venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
               ".git", "build", "dist", ".hypothesis"}
NOISE_NAMES = ("*.egg-info", "*.pyc", ".coverage", ".coverage.*", ".DS_Store")
# What a run writes by default (run, demo, train: runs/; smoke's hangs: stall-RUN_ID/).
OUTPUT_PARTS = ("runs", "out", "stall-*")


@dataclass(frozen=True)
class Snapshot:
    entries: dict[str, str]  # path -> porcelain status ("??" untracked, "!!" ignored, " M"...)
    top: frozenset[str]  # the names at the repository's root


def is_noise(path: str) -> bool:
    parts = path.rstrip("/").split("/")
    return any(p in NOISE_PARTS or any(fnmatch.fnmatch(p, n) for n in NOISE_NAMES) for p in parts)


def parse_porcelain(text: str) -> dict[str, str]:
    """``git status --porcelain -z`` output as {path: status}; a rename's
    origin (its second NUL-separated field) is skipped."""
    entries: dict[str, str] = {}
    fields = iter(text.split("\0"))
    for field in fields:
        if len(field) < 4:
            continue
        status, path = field[:2], field[3:]
        entries[path] = status
        if "R" in status or "C" in status:
            next(fields, None)
    return entries


def snapshot(repo: Path) -> Snapshot | None:
    """The checkout's untracked, ignored and changed paths (each file, also
    inside ignored folders); None when ``repo`` is not a git checkout."""
    if not (repo / ".git").exists():
        return None
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "-z", "--ignored",
             "--untracked-files=all", "--", ".", ":(exclude).venv", ":(exclude,glob)**/__pycache__/**"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return Snapshot({p: s for p, s in parse_porcelain(proc.stdout).items() if not is_noise(p)},
                    frozenset(os.listdir(repo)))


def is_output(path: str, status: str, top_before: frozenset[str]) -> bool:
    """Whether a path that appeared during the run is a test's output: a
    file git does not know (untracked or ignored). A tracked file edited,
    deleted or staged meanwhile is someone's work, never a test's output."""
    if status not in ("??", "!!") or is_noise(path):
        return False
    parts = path.rstrip("/").split("/")
    if status == "!!":  # ignored: .gitignore lists it as what a run leaves
        return True
    if parts[0] not in top_before:  # a new file or folder at the root
        return True
    return any(fnmatch.fnmatch(p, pattern) for p in parts[:-1] for pattern in OUTPUT_PARTS)


def left_behind(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths a test run left in the working tree: in ``after``, not in
    ``before``, and output (``is_output``); and a new entry at the root that
    git does not list (an empty folder), as ``NAME/``. Changes to files that
    were there before (someone's edits) never count."""
    left = {p for p, status in after.entries.items()
            if p not in before.entries and is_output(p, status, before.top)}
    listed = {p.split("/")[0] for p in after.entries}
    left |= {f"{name}/" for name in after.top - before.top - listed if not is_noise(name)}
    return sorted(left)
