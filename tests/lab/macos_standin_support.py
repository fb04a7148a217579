"""The macOS tools stood in for on the lab's Linux hosts: ``sudo`` and
``networksetup``, ``ifconfig``, ``route``, ``socketfilterfw``, ``sysctl``, each
logging its argv to the host's own disk (tests/lab/test_fix_macos_lab.py tells
what is real and what is stood in). Shared by that test and
tests/lab/test_model_split_lab.py."""

from __future__ import annotations

import json
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from mlxcluster.inventory.inventory import parse_inventory

NAMES = ("mbp", "studio", "mini")  # labhost1..3; mini has no passwordless sudo
TOOLS = ("socketfilterfw", "networksetup", "ifconfig", "route", "sysctl")

STANDIN = '''#!{python}
"""Stand-ins for sudo and macOS tools on a lab host (tests/lab/test_fix_macos_lab.py).
Every call is logged with its argv to {state}/calls.jsonl on the host's own disk."""
import json, os, sys

D = "{state}"
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
root = os.environ.get("STANDIN_ROOT") == "1"
os.makedirs(D, exist_ok=True)
with open(os.path.join(D, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"tool": name, "argv": args, "root": root}}) + "\\n")


def fail(text, code=1):
    sys.stderr.write(text + "\\n")
    sys.exit(code)


def load(file, default):
    path = os.path.join(D, file)
    return json.load(open(path)) if os.path.exists(path) else default


def save(file, value):
    json.dump(value, open(os.path.join(D, file), "w"))


if name == "sudo":
    if args[:1] != ["-n"]:
        fail("stand-in sudo: a call without -n could prompt for a password", 64)
    if os.path.exists(os.path.join(D, "no-passwordless-sudo")):
        fail("sudo: a password is required")
    if args[1:] == ["true"]:
        sys.exit(0)
    tool = os.path.join("{tools}", os.path.basename(args[1]))
    if not os.path.exists(tool):
        fail("stand-in sudo: no stand-in for " + args[1], 127)
    os.execve(tool, [tool] + args[2:], dict(os.environ, STANDIN_ROOT="1"))
elif name == "socketfilterfw":
    apps, out, it = load("alf.json", {{}}), [], iter(args)
    for a in it:
        if a == "--getglobalstate":
            out.append("Firewall is enabled. (State = 1)")
        elif a == "--getblockall":
            out.append("Firewall has block all state set to disabled.")
        elif a == "--listapps":
            out.append("Total number of apps = %d" % len(apps))
            for i, (p, rule) in enumerate(apps.items(), 1):
                out += ["%d : %s " % (i, p), "             (%s incoming connections)" % rule.capitalize()]
        elif a == "--getappblocked":
            p = next(it)
            out.append("Incoming connection to %s is %s." % (p, "blocked" if apps.get(p) == "block" else "permitted"))
        elif a in ("--add", "--remove", "--unblockapp", "--blockapp"):
            if not root:
                fail("stand-in socketfilterfw: " + a + " needs root")
            p = next(it)
            if a == "--add":
                apps.setdefault(p, "block")
            elif a == "--remove":
                apps.pop(p, None)
            else:
                apps[p] = "allow" if a == "--unblockapp" else "block"
            save("alf.json", apps)
        else:
            fail("stand-in socketfilterfw: unknown option " + a, 2)
    print("\\n".join(out))
elif name == "sysctl":  # reads as anyone; sets (name=value) as root, printing "name: old -> new" as macOS does
    values, out = load("sysctl.json", {{}}), []
    for a in args:
        key, sep, value = a.partition("=")
        if key not in values:
            fail("sysctl: unknown oid '" + key + "'")
        if sep and not root:
            fail("sysctl: " + a + ": Operation not permitted")
        out.append("%s: %s" % (key, values[key] + " -> " + value if sep else values[key]))
        if sep:
            values[key] = value
    save("sysctl.json", values)
    print("\\n".join(out))
elif not root:
    fail("stand-in " + name + ": needs root")
elif name == "networksetup" and args[:1] == ["-setnetworkserviceenabled"] and len(args) == 3:
    services = load("services.json", {{}})
    services[args[1]] = args[2]
    save("services.json", services)
'''

def install_standins(lab) -> Path:
    tools = lab.state / "macos-standins"
    tools.mkdir(exist_ok=True)  # the session's lab: another test may have installed them
    script = tools / "standin.py"
    script.write_text(STANDIN.format(python=sys.executable, state=lab.disk / "macos-standin", tools=tools))
    script.chmod(0o755)
    for link in [tools / tool for tool in TOOLS] + [lab.bin_dir / "sudo"]:  # sudo: first on every host's PATH
        link.unlink(missing_ok=True)
        link.symlink_to(script)
    return tools


@contextmanager
def macos_standins(lab):
    """The stand-ins installed (``install_standins``), every host's state empty; the
    stand-in sudo taken off the hosts' PATH after. Yields the stand-ins' folder."""
    tools = install_standins(lab)
    try:
        for i in range(len(NAMES)):
            fresh_state(lab, i)
        yield tools
    finally:
        (lab.bin_dir / "sudo").unlink(missing_ok=True)


def host_state(lab, i: int) -> Path:
    return lab.host_disk(lab.hosts[i]) / "macos-standin"


def fresh_state(lab, i: int) -> Path:
    """Host i's stand-in state, empty (another test of the session's lab may have left some)."""
    shutil.rmtree(host_state(lab, i), ignore_errors=True)
    host_state(lab, i).mkdir()
    return host_state(lab, i)


def calls(lab, i: int) -> list[dict]:
    log = host_state(lab, i) / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def lab_inventory(lab):
    lines = ["cluster: labmac", "user: root", f"python: {lab.python}", f"ssh_config: {lab.ssh_config}", "hosts:"]
    for name, h in zip(NAMES, lab.hosts, strict=True):
        lines += [f"  - name: {name}", f"    ssh: {h.ip}", f"    ips: [{h.ip}]"]
    return parse_inventory("\n".join(lines) + "\n")
