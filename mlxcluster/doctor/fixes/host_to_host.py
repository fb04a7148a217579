"""The fix for ``host-to-host-ssh``: every host may ssh to every other.

For each pair the check found broken, a source host S that cannot reach a
target host T (an mpirun may be started on any host, and with tree spawn a
daemon on any host ssh's onward), in this order:

1. on S: its public key (``~/.ssh/id_ed25519``, ``id_ecdsa`` or ``id_rsa``);
   on a host with none, ``ssh-keygen -t ed25519 -N '' -f ~/.ssh/id_ed25519``
   (once: S's later pairs find that key);
2. on T: that public key appended once to ``~/.ssh/authorized_keys``;
3. on S: T's host key appended once to ``~/.ssh/known_hosts``, under the
   name S's ssh is given for T (the inventory's ``ssh``, ``[ssh]:port`` off
   port 22). The key is the one this machine's connection to T verified
   against its own known_hosts, not one fetched anew from S.

So with no keys between the hosts, every host's public key ends up once in
every other host's authorized_keys and every host's key in every other
host's known_hosts. Only public keys travel; a private key never leaves its
host. Each step is idempotent (a line already there is not added again) and
says what it did, so the undo removes exactly the lines added (and the key,
the file or the ``~/.ssh`` folder it created). Every value from the
inventory or a host that reaches a shell is ``shlex``-quoted; the scripts
run under ``sh -c`` whatever the login shell is.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from mlxcluster.doctor.fixes.apply import APPLIERS, ApplyContext
from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput

# Prints the host's public key; with none, makes one first (@@created).
ENSURE_KEY = (
    'd="$HOME/.ssh"; for k in id_ed25519 id_ecdsa id_rsa; do '
    'if [ -f "$d/$k.pub" ]; then cat "$d/$k.pub"; exit 0; fi; '
    'if [ -f "$d/$k" ]; then ssh-keygen -y -f "$d/$k" </dev/null; exit $?; fi; done; '
    '[ -d "$d" ] || { mkdir -p "$d" && chmod 700 "$d" && echo @@made-dir; }; '
    'ssh-keygen -q -t ed25519 -N "" -f "$d/id_ed25519" </dev/null >/dev/null && echo @@created '
    '&& cat "$d/id_ed25519.pub"')

# Reads the host's public key, changing nothing (planning).
READ_KEY = ('d="$HOME/.ssh"; for k in id_ed25519 id_ecdsa id_rsa; do '
            'if [ -f "$d/$k.pub" ]; then cat "$d/$k.pub"; exit 0; fi; done; exit 0')

# $1: a file under ~/.ssh; $2: one line, appended unless already there. Says
# what it made: @@made-dir, @@made-file, @@newline (the file's last line had
# none), @@added or @@present.
APPEND = (
    'd="$HOME/.ssh"; f="$d/$1"; '
    '[ -d "$d" ] || { mkdir -p "$d" && chmod 700 "$d" && echo @@made-dir; }; '
    '[ -e "$f" ] || { : > "$f" && chmod 600 "$f" && echo @@made-file; }; '
    'if grep -qxF -- "$2" "$f"; then echo @@present; exit 0; fi; '
    'if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then printf "\\n" >> "$f" && echo @@newline; fi; '
    'printf "%s\\n" "$2" >> "$f" && echo @@added')

# The undo of APPEND (python: the hosts have the inventory's): the last
# occurrence of the line removed, then what APPEND made.
REMOVE = r"""
import json, os, sys
spec = json.loads(sys.argv[1])
d = os.path.join(os.path.expanduser("~"), ".ssh")
f = os.path.join(d, spec["file"])
if not os.path.exists(f):
    print("@@absent"); sys.exit(0)
data = open(f, "rb").read()
parts = data.splitlines(keepends=True)
want = spec["line"].encode()
for i in range(len(parts) - 1, -1, -1):
    if parts[i].rstrip(b"\r\n") == want:
        del parts[i]
        break
else:
    print("@@absent"); sys.exit(0)
out = b"".join(parts)
if spec.get("newline") and out.endswith(b"\n"):
    out = out[:-1]
if spec.get("made_file") and not out:
    os.unlink(f)
else:
    tmp = f + ".mlxcluster-tmp"
    with open(tmp, "wb") as w:
        w.write(out)
    os.chmod(tmp, os.stat(f).st_mode & 0o7777)
    os.replace(tmp, f)
if spec.get("made_dir") and not os.listdir(d):
    os.rmdir(d)
print("@@removed")
"""

# $1: the public key made by ENSURE_KEY; both files removed only if it is still that key.
REMOVE_KEY = ('d="$HOME/.ssh"; if [ "$(cat "$d/id_ed25519.pub" 2>/dev/null)" = "$1" ]; then '
              'rm -f "$d/id_ed25519" "$d/id_ed25519.pub"; echo @@removed; fi; '
              'if [ -n "$2" ] && [ -d "$d" ] && [ -z "$(ls -A "$d")" ]; then rmdir "$d"; fi')


def sh(script: str, *args: str) -> str:
    """``sh -c SCRIPT sh ARGS...``, each word quoted."""
    return " ".join(shlex.quote(w) for w in ("sh", "-c", script, "sh", *args))


def python_cmd(python: str, script: str, spec: dict) -> str:
    return " ".join(shlex.quote(w) for w in (python, "-c", script, json.dumps(spec, sort_keys=True)))


def known_name(target: str, port: int | None) -> str:
    """How ssh names a host in known_hosts."""
    return f"[{target}]:{port}" if port and port != 22 else target


def _where(host) -> dict[str, Any]:
    return {"name": host.name, "ssh": host.ssh, "user": host.user, "port": host.port, "python": host.python}


def plan_host_to_host(fix: FixInput) -> list[Action]:
    """One action per broken pair (source -> target), sources in inventory
    order, each pair's action for its target (the host the check blamed)."""
    inv = fix.inventory
    if fix.host_key is None:
        return []
    order = {h.name: i for i, h in enumerate(inv.hosts)}
    pairs = sorted(((src, target_name) for target_name, d in fix.result.fix_data.items()
                    for src in (d.get("sources") or [d["source"]])),
                   key=lambda p: (order[p[0]], order[p[1]]))
    keys: dict[str, str] = {}  # source -> its public key now ("" when it has none)
    actions = []
    for source_name, target_name in pairs:
        source, target = inv.host(source_name), inv.host(target_name)
        key_type, key_b64 = fix.host_key(target_name)
        known_line = f"{known_name(target.ssh, target.port)} {key_type} {key_b64}"
        if source.name not in keys:
            keys[source.name] = ""
            if fix.lookup is not None:
                found = fix.lookup(source.name, sh(READ_KEY))
                if found.exit_status == 0 and found.stdout.strip():
                    keys[source.name] = found.stdout.strip().splitlines()[0]
            first_use = True
        else:
            first_use = False
        pub = keys[source.name]
        shown_pub = pub or f"<the key made on {source.name}>"
        made = (f"a new key made on {source.name} (ssh-keygen -t ed25519 -N '')" if first_use
                else f"the key made on {source.name}")
        actions.append(Action(
            fix.result.id, (target_name,), "ssh-trust",
            f"{source.name} -> {target_name}: " + (f"{source.name}'s key" if pub else made)
            + f" in {target_name}'s ~/.ssh/authorized_keys, {target_name}'s host key in {source.name}'s "
              "~/.ssh/known_hosts",
            [f"on {source.name}: {sh(ENSURE_KEY)}",
             f"on {target_name}: {sh(APPEND, 'authorized_keys', shown_pub)}",
             f"on {source.name}: {sh(APPEND, 'known_hosts', known_line)}"],
            where="hosts",
            params={"source": _where(source), "target": _where(target), "known_line": known_line}))
    return actions


def _marks(text: str) -> set[str]:
    return {ln.strip() for ln in text.splitlines() if ln.strip().startswith("@@")}


def _step(ctx: ApplyContext, host: dict, command: str, log: list[str]):
    result = ctx.runner.run(host["ssh"], command, user=host.get("user"), port=host.get("port"),
                            timeout=ctx.timeout)
    log.append(f"{host['name']}$ {command}\n{(result.stdout + result.stderr).strip()}".rstrip())
    if result.exit_status != 0:
        log.append(f"(exit {result.exit_status})")
    return result


def _undo_append(host: dict, file: str, line: str, marks: set[str]) -> dict[str, Any]:
    spec = {"file": file, "line": line, "newline": "@@newline" in marks,
            "made_file": "@@made-file" in marks, "made_dir": "@@made-dir" in marks}
    return {"ssh": host["ssh"], "user": host.get("user"), "port": host.get("port"),
            "commands": [python_cmd(host["python"], REMOVE, spec)]}


def apply_ssh_trust(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """The three steps; what each added is undone in reverse, also when a
    later step failed."""
    p = action.params
    source, target = p["source"], p["target"]
    log: list[str] = []
    undo_steps: list[dict[str, Any]] = []
    changed = False

    def done(status: str) -> dict[str, Any]:
        undo = {"kind": "remote", "steps": list(reversed(undo_steps))} if undo_steps else None
        return {"status": status, "output": "\n".join(log), "undo": undo}

    key = _step(ctx, source, sh(ENSURE_KEY), log)
    lines = [ln for ln in key.stdout.splitlines() if ln.strip() and not ln.startswith("@@")]
    if key.exit_status != 0 or not lines:
        return done("failed")
    pub = lines[-1].strip()
    made = _marks(key.stdout)
    if "@@created" in made:
        changed = True
        undo_steps.append({"ssh": source["ssh"], "user": source.get("user"), "port": source.get("port"),
                           "commands": [sh(REMOVE_KEY, pub, "1" if "@@made-dir" in made else "")]})
    for host, file, line in ((target, "authorized_keys", pub), (source, "known_hosts", p["known_line"])):
        result = _step(ctx, host, sh(APPEND, file, line), log)
        marks = _marks(result.stdout)
        if "@@added" in marks:
            changed = True
            undo_steps.append(_undo_append(host, file, line, marks))
        if result.exit_status != 0:
            return done("failed")
    return done("applied" if changed else "unchanged")


APPLIERS["ssh-trust"] = apply_ssh_trust

HOST_TO_HOST_KEYS = Fix("each host's key in the others' authorized_keys, their host keys in its known_hosts",
                        plan_host_to_host)
