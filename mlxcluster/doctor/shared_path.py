"""``doctor --shared-path DIR``: which hosts see the same DIR (a NAS, an NFS or SMB home).

The path alone cannot tell: /Volumes/nas/run is one folder for every Mac
that mounts the NAS there, and ~/runs is one folder per Mac on their own
disks, or one for all with a network home. So each host (and this machine,
when DIR is there) writes a token of its own, the others look for it, and
hosts that found one another's token see one folder. The tokens are the
trainer's (reference_train/storage.py), over ssh instead of the job's group:

1. every host: `mkdir -p DIR` (as the trainer does with --out; what doctor
   made is removed again when it is still empty) and an empty file
   DIR/.mlxcluster-storage/<its token, 32 hex digits>;
2. every host, once all tokens are written: which of the others' tokens it
   sees, each looked up by its exact name;
3. every host removes its token, then the folder of tokens.

Nothing here prints; the CLI renders the ``SharedPathReport``.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.ssh.remote import run_parallel
from reference_train.storage import STORAGE_DIR, TOKEN_BYTES, linked_groups

HERE = "this machine"
LOOK_TIMEOUT_S = 30.0  # a mkdir, a touch, a few lookups: a NAS that takes longer is hung


@dataclass
class SharedPathReport:
    """Which of the hosts (and this machine) see one folder at ``path``."""

    path: str
    folders: list[list[str]]  # each: the names that see one folder, in inventory order
    failed: dict[str, str] = field(default_factory=dict)  # host -> why it could not be asked
    seconds: float = 0.0

    def shared(self) -> list[list[str]]:
        """The folders more than one name sees."""
        return [f for f in self.folders if len(f) > 1]

    def to_json(self) -> dict:
        return {"path": self.path, "folders": self.folders, "shared": self.shared(),
                "failed": self.failed}


def shell_path(path: str) -> str:
    """``path`` for sh on the host: ~ is that host's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (("/" + shlex.quote(path[2:])) if path[2:] else "")
    return shlex.quote(path)


def in_sh(script: str) -> str:
    """The script run by sh whatever the login shell is (zsh, fish, bash)."""
    return "sh -c " + shlex.quote(script)


def look_over_ssh(inventory, path: str, *, connect_timeout: float,
                  accept_new_host_keys: bool) -> SharedPathReport:
    """``find_shared_path`` over paramiko connections of its own, closed after."""
    from mlxcluster.ssh import remote

    with remote.open_runner(inventory.ssh_config, connect_timeout=connect_timeout,
                            accept_new_host_keys=accept_new_host_keys) as runner:
        return find_shared_path(inventory, path, runner)


def find_shared_path(inventory, path: str, runner, *, here: bool = True) -> SharedPathReport:
    """Steps 1-3 above on every inventory host over ``runner`` (a ParamikoRunner),
    and on this machine when ``here`` and ``path`` is a folder here."""
    started = time.monotonic()
    hosts = {h.name: h for h in inventory.hosts}
    tokens = {name: secrets.token_hex(TOKEN_BYTES) for name in hosts}
    folder = shell_path(path)
    tokens_dir = f"{folder}/{STORAGE_DIR}"
    failed: dict[str, str] = {}
    local = Path(path).expanduser()
    if here and local.is_dir():
        tokens[HERE] = secrets.token_hex(TOKEN_BYTES)

    def on_host(name: str, script: str) -> str:
        h = hosts[name]
        result = runner.run(h.ssh, in_sh(script), user=h.user, port=h.port, timeout=LOOK_TIMEOUT_S)
        if result.exit_status != 0:
            said = (result.stderr.strip().splitlines() or [f"exit code {result.exit_status}"])[-1]
            raise OSError(said)
        return result.stdout

    def each(script_for, names) -> dict[str, str]:
        outcomes = run_parallel(names, lambda n: on_host(n, script_for(n)))
        out = {}
        for name, outcome in outcomes.items():
            if outcome.ok:
                out[name] = outcome.value
            else:
                failed.setdefault(name, str(outcome.error))
        return out

    # 1: every token written (this machine's too) before anyone looks
    # (what mkdir -p makes is said: the topmost folder it made, removed again if still empty)
    made = each(lambda n: (f'p={folder}; while [ ! -e "$p" ]; do top=$p; p=$(dirname "$p"); '
                           f'done; mkdir -p {tokens_dir} && : > {tokens_dir}/{tokens[n]} && '
                           'echo "${top:-}"'), list(hosts))
    looking = [n for n in hosts if n in made]
    if HERE in tokens:
        try:
            (local / STORAGE_DIR).mkdir(exist_ok=True)
            (local / STORAGE_DIR / tokens[HERE]).touch()
            looking.append(HERE)
        except OSError as e:  # read-only here: the hosts are still compared
            failed[HERE] = f"cannot write in {path} here: {e.strerror or e}"
    try:
        # 2: who sees whom
        others = {n: [t for m, t in tokens.items() if m != n and m in looking] for n in looking}
        seen = each(lambda n: "".join(f"[ -e {tokens_dir}/{t} ] && echo {t}; " for t in others[n])
                    + "true", [n for n in looking if n != HERE])
        if HERE in looking:
            seen[HERE] = "\n".join(t for t in others[HERE] if (local / STORAGE_DIR / t).exists())
    finally:
        # 3: tokens removed, then their folder (and DIR, where doctor made it)
        each(lambda n: f"rm -f {tokens_dir}/{tokens[n]}", [n for n in looking if n != HERE])
        if HERE in looking:
            (local / STORAGE_DIR / tokens[HERE]).unlink(missing_ok=True)
        each(lambda n: f"rmdir {tokens_dir} 2>/dev/null; "
                       + (f'p={folder}; while rmdir "$p" 2>/dev/null && '
                          f'[ "$p" != {shlex.quote(made[n].strip())} ]; do p=$(dirname "$p"); '
                          "done; " if made.get(n, "").strip() else "")
                       + "true", [n for n in looking if n != HERE])
        if HERE in looking:
            try:
                (local / STORAGE_DIR).rmdir()
            except OSError:
                pass
    answered = [n for n in looking if n in seen]
    by_token = {tokens[n]: i for i, n in enumerate(answered)}
    sees = [[False] * len(answered) for _ in answered]
    for i, n in enumerate(answered):
        for t in seen[n].split():
            if t in by_token:
                sees[i][by_token[t]] = True
    group = linked_groups(sees, list(range(len(answered))))
    folders: dict[int, list[str]] = {}
    for i, n in enumerate(answered):
        folders.setdefault(group[i], []).append(n)
    return SharedPathReport(path, list(folders.values()), failed, time.monotonic() - started)
