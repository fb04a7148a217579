"""macOS fixes that need root, as commands run with ``sudo -n`` (never a
password prompt: where sudo wants one, nothing is changed on that host and
the commands are printed for the user, ``apply.apply_remote``).

- ``thunderbolt-bridge``: the "Thunderbolt Bridge" network service turned off
  (``networksetup -setnetworkserviceenabled``); undone by turning it on.
- ``thunderbolt-ipv4``: the IP plan of ``hostfile generate --plan-ips`` (one
  /30 per cable, mlx.distributed_config's auto-setup) on both ends of each
  cable with an end without IPv4: ``ifconfig bridge0 down`` where the host
  has a bridge0, then per end ``ifconfig IF inet A netmask 255.255.255.252``
  and ``route change PEER -interface IF``. Undone by removing exactly the
  address it set (``ifconfig IF inet A -alias``), putting back the addresses
  the end had before (``... alias``) and bridge0 up where it was up. Nothing
  of the network services' stored settings is touched (ifconfig, not
  networksetup): a reboot also undoes it, and ``networksetup -setdhcp`` as
  the undo would change what the fix never changed.
- ``macos-firewall``: the application firewall letting the inventory's
  python accept connections: ``socketfilterfw --add PY --unblockapp PY``
  where the python is not in the firewall's list (undone with ``--remove
  PY``), ``--unblockapp PY`` where it is listed as blocked (undone with
  ``--blockapp PY``): the undo takes away only what the fix did.
- ``model-split``: the GPU wired-memory limit raised where a model's share
  does not fit under it (``doctor --model DIR``):
  ``sysctl iogpu.wired_limit_mb=N``, N the model's share with its margin in
  whole GiB, never more than RAM less macOS's reserve
  (``mlxcluster/fit/split.py``). Undone by setting the value it had
  before (0: macOS's default). It does not survive a reboot: macOS starts
  at 0 again.

Never run on a Mac here: built from the captured outputs in
``tests/fixtures/macos`` and checked on them (``tests/test_fix_macos.py``).
"""

from __future__ import annotations

import ipaddress
import shlex

from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.hostfile.ipplan import address_commands

BRIDGE_SERVICE = "Thunderbolt Bridge"  # the service name networksetup knows bridge0 by
SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
WIRED_LIMIT = "iogpu.wired_limit_mb"


def bridge_enabled_commands(enabled: bool, service: str = BRIDGE_SERVICE) -> list[str]:
    return [f"sudo -n networksetup -setnetworkserviceenabled {shlex.quote(service)} {'on' if enabled else 'off'}"]


def firewall_unblock_commands(python: str) -> list[str]:
    q = shlex.quote(python)
    return [f"sudo -n {SOCKETFILTERFW} --add {q} --unblockapp {q}"]


def firewall_undo_commands(python: str) -> list[str]:
    return [f"sudo -n {SOCKETFILTERFW} --remove {shlex.quote(python)}"]


def firewall_rule_commands(python: str, allow: bool) -> list[str]:
    """Change the rule of a python already in the firewall's list."""
    return [f"sudo -n {SOCKETFILTERFW} --{'unblockapp' if allow else 'blockapp'} {shlex.quote(python)}"]


def remote_action(check: str, host, what: str, commands: list[str], undo: list[str]) -> Action:
    """An action of sudo -n commands on one inventory host."""
    return Action(check, (host.name,), "remote", what, commands, sudo=True,
                  params={"ssh": host.ssh, "user": host.user, "port": host.port, "undo": undo})


def plan_bridge_off(fix: FixInput) -> list[Action]:
    actions = []
    for name, d in fix.result.fix_data.items():
        host = fix.inventory.host(name)
        actions.append(remote_action(
            fix.result.id, host,
            f"Thunderbolt Bridge service off on {name} (bridge0 holds {', '.join(d.get('members', []))})",
            bridge_enabled_commands(False), bridge_enabled_commands(True)))
    return actions


BRIDGE_OFF = Fix("the Thunderbolt Bridge service turned off (sudo -n networksetup)", plan_bridge_off)


def ip_plan_commands(data: dict) -> tuple[list[str], list[str]]:
    """(commands, undo) of one host's part of the IP plan, from the
    ``thunderbolt-ipv4`` verdict's ``fix_data`` for it: ``bridge`` (its name
    when the host has one), ``bridge_up``, and ``ends``: each cable end's
    ``interface``, planned ``address``, the ``peer``'s address and the IPv4
    addresses (a.b.c.d/prefix) it had ``before``."""
    commands, undo = [], []
    bridge = data.get("bridge")
    if bridge:
        commands.append(f"sudo -n ifconfig {shlex.quote(bridge)} down")
    for end in data["ends"]:
        commands += address_commands(end["interface"], end["address"], end["peer"], sudo="sudo -n")
        iface = shlex.quote(end["interface"])
        undo.append(f"sudo -n ifconfig {iface} inet {end['address']} -alias")
        for old in end.get("before", []):
            net = ipaddress.IPv4Interface(old)
            undo.append(f"sudo -n ifconfig {iface} inet {net.ip} netmask {net.netmask} alias")
    if bridge and data.get("bridge_up"):
        undo.append(f"sudo -n ifconfig {shlex.quote(bridge)} up")
    return commands, undo


def plan_ip_plan(fix: FixInput) -> list[Action]:
    actions = []
    for name, data in fix.result.fix_data.items():
        commands, undo = ip_plan_commands(data)
        ends = ", ".join(f"{e['interface']} {e['address']}/30 (to {e['peer']})" for e in data["ends"])
        actions.append(remote_action(
            fix.result.id, fix.inventory.host(name),
            f"the IP plan of hostfile --plan-ips on {name}: {ends}"
            + (f"; {data['bridge']} down" if data.get("bridge") else ""), commands, undo))
    return actions


def plan_firewall(fix: FixInput) -> list[Action]:
    """For each host the ``macos-firewall`` check blamed for its python
    (``fix_data``: ``path``, the file the firewall judges, and ``listed``):
    allow incoming connections to it; block-all is never changed here."""
    actions = []
    for name, d in fix.result.fix_data.items():
        path = d["path"]
        if d.get("listed"):
            what, commands, undo = "blocked -> allowed", firewall_rule_commands(path, True), \
                firewall_rule_commands(path, False)
        else:
            what, commands, undo = "added, allowed", firewall_unblock_commands(path), firewall_undo_commands(path)
        actions.append(remote_action(
            fix.result.id, fix.inventory.host(name),
            f"macOS firewall on {name}: incoming connections to {path} {what}", commands, undo))
    return actions


FIREWALL_ALLOW = Fix("the inventory python allowed through the macOS firewall (sudo -n socketfilterfw)",
                     plan_firewall)


IP_PLAN = Fix("the Thunderbolt IP plan (hostfile generate --plan-ips) set with sudo -n ifconfig", plan_ip_plan)


def wired_limit_commands(mb: int) -> list[str]:
    return [f"sudo -n sysctl {WIRED_LIMIT}={int(mb)}"]


def plan_wired_limit(fix: FixInput) -> list[Action]:
    """For each Mac the ``model-split`` check found short of GPU memory
    (``fix_data``: ``wired_limit_mb``, the limit that fits the model's share,
    and ``before_mb``, the limit now): the limit raised, until the next reboot."""
    actions = []
    for name, d in fix.result.fix_data.items():
        actions.append(remote_action(
            fix.result.id, fix.inventory.host(name),
            f"GPU wired-memory limit on {name}: {d['before_mb'] or 'the default'} -> {d['wired_limit_mb']} MiB "
            f"for {d['model']} (does not survive a reboot: run doctor --model --fix again after one)",
            wired_limit_commands(d["wired_limit_mb"]), wired_limit_commands(d["before_mb"])))
    return actions


WIRED_LIMIT_RAISE = Fix("the GPU wired-memory limit raised for the model (sudo -n sysctl iogpu.wired_limit_mb; "
                        "until the next reboot)", plan_wired_limit)
