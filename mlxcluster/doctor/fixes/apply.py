"""Applying a fix plan, host by host, and undoing a journal.

Each action kind has an applier (``APPLIERS``) that makes the change, or
says it was already made (``unchanged``: a fix run twice changes nothing),
and returns what undoes it. Changes on this machine (host keys, the
inventory) come first, then the commands on each host, one host at a time
over the runner's connections, each with a timeout, never a prompt (the
runner sends no password; a fix that needs root uses ``sudo -n``). On a
host where a command fails, that host's later actions are skipped. Every
result is written to the journal as soon as it is known.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes.inventory_edit import set_env
from mlxcluster.doctor.fixes.journal import Journal
from mlxcluster.doctor.fixes.plan import Action, Plan
from mlxcluster.errors import InputError
from mlxcluster.inventory.inventory import parse_inventory

DEFAULT_TIMEOUT = 60.0


@dataclass
class ApplyContext:
    runner: Any = None  # .run(alias, command, user=, port=, timeout=) -> CommandResult
    timeout: float = DEFAULT_TIMEOUT
    backed_up: set[str] = field(default_factory=set)  # files saved as .bak in this run


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (temp + rename), keeping its mode."""
    tmp = path.with_name(path.name + ".mlxcluster-tmp")
    tmp.write_bytes(data)
    try:
        shutil.copymode(path, tmp)
    except OSError:
        pass
    os.replace(tmp, path)


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def check_inventory_writable(plan: Plan) -> None:
    """InputError (exit 2), before anything changes, when an inventory the
    plan edits cannot be written or its .bak cannot be made beside it."""
    for path in sorted({a.params["path"] for a in plan.actions if a.kind == "inventory-env"}):
        p = Path(path)
        if not _writable(p):
            raise InputError(f"the inventory {p} is not writable: --fix writes the env it needs there",
                             f"make it writable (chmod u+w {p}) or copy it somewhere writable and pass -i")
        if not _writable(p.parent):
            raise InputError(f"cannot write {p.name}.bak beside the inventory in {p.parent}",
                             "make the folder writable or copy the inventory somewhere writable and pass -i")


def apply_inventory_env(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Set env[key] in the inventory's text (``inventory_edit``), a .bak of
    the file as it was before this run beside it."""
    p = Path(action.params["path"])
    before = p.read_bytes()
    text = before.decode("utf-8")
    after_text = set_env(text, action.params.get("host"), action.params["key"], action.params["value"], str(p))
    if after_text == text:
        return {"status": "unchanged", "output": "already set", "undo": None}
    parse_inventory(after_text, source=str(p))  # the edit must leave a valid inventory
    backup = p.with_name(p.name + ".bak")
    if str(p) not in ctx.backed_up:
        backup.write_bytes(before)
        ctx.backed_up.add(str(p))
    after = after_text.encode("utf-8")
    _write_bytes(p, after)
    original = backup.read_bytes()
    return {"status": "applied", "output": f"{p}: {action.params['key']} set (backup {backup})",
            "undo": {"kind": "restore-file", "path": str(p), "backup": str(backup),
                     "backup_sha256": _sha(original), "sha256": _sha(after),
                     "original_b64": base64.b64encode(original).decode("ascii")}}


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines()


def apply_known_host(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Append the host key shown in the plan to the known_hosts file."""
    p = Path(action.params["file"])
    line = action.params["line"].encode()
    data = p.read_bytes() if p.exists() else b""
    if line in _lines(data):
        return {"status": "unchanged", "output": f"already in {p}", "undo": None}
    if not p.parent.exists():
        p.parent.mkdir(parents=True, mode=0o700)
    with p.open("ab") as f:
        f.write((b"\n" if data and not data.endswith(b"\n") else b"") + line + b"\n")
    return {"status": "applied", "output": f"added to {p}",
            "undo": {"kind": "remove-lines", "file": str(p), "lines": [action.params["line"]]}}


def apply_remote(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Each command on the host in turn, with the timeout; the first that
    exits non-zero stops it (failed). An action that needs root first checks
    that ``sudo -n`` works there: if not, nothing is run and the output
    gives the commands to run by hand."""
    p = action.params
    if action.sudo:
        # Root without a password, or nothing: then the user runs the commands.
        probe = ctx.runner.run(p["ssh"], "sudo -n true", user=p.get("user"), port=p.get("port"),
                               timeout=ctx.timeout)
        if probe.exit_status != 0:
            by_hand = "\n".join(f"  {c.replace('sudo -n ', 'sudo ', 1)}" for c in action.commands)
            why = (probe.stderr or probe.stdout).strip().splitlines()
            return {"status": "failed", "undo": None,
                    "output": f"sudo needs a password on {', '.join(action.hosts)} (sudo -n true: "
                              f"{why[-1] if why else 'exit ' + str(probe.exit_status)}): nothing was changed "
                              f"there; run these on it yourself:\n{by_hand}"}
    outputs, status = [], "applied"
    for command in action.commands:
        result = ctx.runner.run(p["ssh"], command, user=p.get("user"), port=p.get("port"), timeout=ctx.timeout)
        text = (result.stdout + result.stderr).strip()
        outputs.append(f"$ {command}\n{text}".rstrip())
        if result.exit_status != 0:
            status = "failed"
            outputs.append(f"(exit {result.exit_status})")
            break
    undo = None
    if status == "applied" and p.get("undo"):
        undo = {"kind": "remote", "ssh": p["ssh"], "user": p.get("user"), "port": p.get("port"),
                "commands": list(p["undo"])}
    return {"status": status, "output": "\n".join(outputs), "undo": undo}


APPLIERS: dict[str, Callable[[Action, ApplyContext], dict[str, Any]]] = {
    "known-host": apply_known_host,
    "inventory-env": apply_inventory_env,
    "remote": apply_remote,
}


def apply_plan(plan: Plan, journal: Journal, ctx: ApplyContext,
               on_entry: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Apply every action in plan order; each result journalled at once and
    passed to ``on_entry`` (the CLI shows it). A failed action makes the
    later actions of the same host(s) ``skipped``."""
    failed_hosts: set[str] = set()
    entries = []
    for action in plan.actions:
        entry = {**action.to_json(), "status": "skipped", "output": "", "undo": None}
        if action.where == "host" and failed_hosts & set(action.hosts):
            entry["output"] = "skipped: an earlier fix failed on this host"
        else:
            try:
                entry.update(APPLIERS[action.kind](action, ctx))
            except Exception as exc:  # one host's failure is reported, the rest still run
                entry.update(status="failed", output=f"{type(exc).__name__}: {exc}", undo=None)
        if entry["status"] == "failed":
            failed_hosts.update(action.hosts)
        journal.record(entry)
        entries.append(entry)
        if on_entry:
            on_entry(entry)
    return entries


# ---- undo ----

def undo_restore_file(undo: dict[str, Any], runner_for) -> tuple[str, str]:
    p = Path(undo["path"])
    original = base64.b64decode(undo["original_b64"])
    current = p.read_bytes() if p.exists() else None
    if current == original:
        return "unchanged", f"{p} is already as before the fix"
    if current is not None and _sha(current) != undo["sha256"]:
        return "failed", (f"{p} changed after the fix: not restored (the file before it is "
                          f"{undo['backup']})")
    backup = Path(undo["backup"])
    data = backup.read_bytes() if backup.exists() else b""
    source = str(backup)
    if _sha(data) != undo["backup_sha256"]:
        data, source = original, "the journal's copy"  # the .bak was replaced since
    _write_bytes(p, data)
    return "restored", f"{p} restored from {source}"


def remove_lines(data: bytes, lines: list[str]) -> bytes:
    """``data`` without one occurrence of each of ``lines`` (the ones a fix added)."""
    kept = data.splitlines(keepends=True)
    for line in lines:
        want = line.encode()
        for i, have in enumerate(kept):
            if have.rstrip(b"\r\n") == want:
                del kept[i]
                break
    return b"".join(kept)


def undo_remove_lines(undo: dict[str, Any], runner_for) -> tuple[str, str]:
    p = Path(undo["file"])
    data = p.read_bytes() if p.exists() else b""
    after = remove_lines(data, undo["lines"])
    if after == data:
        return "unchanged", f"the lines added to {p} are no longer there"
    _write_bytes(p, after)
    return "restored", f"{len(undo['lines'])} line(s) removed from {p}"


def undo_remote(undo: dict[str, Any], runner_for) -> tuple[str, str]:
    """Commands on a host (``ssh``, ``commands``), or on several in turn (``steps``)."""
    runner = runner_for()
    outputs = []
    for step in undo.get("steps") or [undo]:
        for command in step["commands"]:
            result = runner.run(step["ssh"], command, user=step.get("user"), port=step.get("port"),
                                timeout=DEFAULT_TIMEOUT)
            outputs.append(f"{step['ssh']}$ {command}\n{(result.stdout + result.stderr).strip()}".rstrip())
            if result.exit_status != 0:
                return "failed", "\n".join(outputs + [f"(exit {result.exit_status})"])
    return "restored", "\n".join(outputs)


UNDOERS = {"restore-file": undo_restore_file, "remove-lines": undo_remove_lines, "remote": undo_remote}


def undo_journal(journal: Journal, runner_for: Callable[[], Any]) -> list[tuple[dict, str, str]]:
    """Undo every change the journal records, last first: (entry, status,
    message) each; status ``restored``, ``unchanged`` (already undone),
    ``failed`` or ``none`` (no way back was recorded). ``runner_for`` gives
    the SSH runner, made only when a change on a host is undone."""
    done = []
    for entry in reversed(journal.entries):
        undo = entry.get("undo")  # a failed fix may have changed something before it failed
        if not undo:
            if entry.get("status") == "applied":
                done.append((entry, "none", "no way back was recorded"))
            continue
        try:
            status, message = UNDOERS[undo["kind"]](undo, runner_for)
        except Exception as exc:  # the other changes are still undone
            status, message = "failed", f"{type(exc).__name__}: {exc}"
        done.append((entry, status, message))
    return done
