"""The journal of one ``doctor --fix`` run: every change, and how to undo it.

Kept at ``$XDG_CONFIG_HOME/mlxcluster/fixes/TIME.json`` (else
``~/.config/...``), rewritten (temp file + rename) after each change, so a run
that stops halfway still says what it did. One entry per action:

    {"version": 1, "started": "2026-11-26T04:10:00Z", "inventory": "/abs/cluster.yaml",
     "ssh_config": null,
     "entries": [
       {"check": "libmpi-by-hand", "hosts": ["h1", "h2"], "kind": "inventory-env",
        "what": "...", "commands": ["..."], "status": "applied", "output": "...",
        "undo": {"kind": "restore-file", "path": "/abs/cluster.yaml",
                 "backup": "/abs/cluster.yaml.bak", "sha256": "<the file after the change>"}}]}

``status``: ``applied`` (changed), ``unchanged`` (already as wanted: a fix
run twice changes nothing), ``failed`` (with the output saying why) or
``skipped`` (an earlier action on that host failed). ``undo`` is null where
there is no way back.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcluster.errors import InputError

VERSION = 1


def fixes_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/mlxcluster/fixes``, else ``$HOME/.config/mlxcluster/fixes``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".config")
    return Path(base) / "mlxcluster" / "fixes"


def check_writable(folder: Path) -> None:
    """Raise InputError (exit 2) when the journal cannot be written there:
    before anything is changed on any host."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the fix journal folder {folder}: {exc.strerror}",
                         "set XDG_CONFIG_HOME to a writable folder") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"the fix journal folder {folder} is not writable",
                         "set XDG_CONFIG_HOME to a writable folder") from None


@dataclass
class Journal:
    path: Path
    inventory: str | None = None
    ssh_config: str | None = None
    started: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def create(cls, folder: Path, inventory: str | None, ssh_config: str | None = None,
               clock=time.time) -> Journal:
        """A new journal named by the UTC time (``-2``... when that name is taken)."""
        check_writable(folder)
        now = clock()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        path, n = folder / f"{stamp}.json", 1
        while path.exists():
            n += 1
            path = folder / f"{stamp}-{n}.json"
        journal = cls(path, inventory, ssh_config, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
        journal.save()
        return journal

    def record(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self.save()

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "started": self.started, "inventory": self.inventory,
                "ssh_config": self.ssh_config, "entries": self.entries}

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def read_journal(path: str | os.PathLike) -> Journal:
    """A journal written by ``doctor --fix``; InputError (exit 2) when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"no journal at {p}", f"the journals are in {fixes_dir()}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read the journal {p}: {exc}",
                         "pass a file written by 'mlxcluster doctor --fix'") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("entries"), list):
        raise InputError(f"{p} is not a doctor --fix journal (version {VERSION})",
                         "pass a file written by 'mlxcluster doctor --fix'")
    return Journal(p, doc.get("inventory"), doc.get("ssh_config"), doc.get("started", ""), doc["entries"])
