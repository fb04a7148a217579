"""macOS fixes that need root, as commands run with ``sudo -n`` (never a
password prompt: where sudo wants one, nothing is changed on that host and
the commands are printed for the user, ``apply.apply_remote``).

- ``thunderbolt-bridge``: the "Thunderbolt Bridge" network service turned off
  (``networksetup -setnetworkserviceenabled``); undone by turning it on.
- the application firewall letting the inventory's python accept
  connections (``socketfilterfw --add PY --unblockapp PY``); undone with
  ``--remove PY``. No check judges the firewall yet: the builder waits for it.

Never run on a Mac here: built from the captured outputs in
``tests/fixtures/macos`` and checked on them (``tests/test_fix_macos.py``).
"""

from __future__ import annotations

import shlex

from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput

BRIDGE_SERVICE = "Thunderbolt Bridge"  # the service name networksetup knows bridge0 by
SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"


def bridge_enabled_commands(enabled: bool, service: str = BRIDGE_SERVICE) -> list[str]:
    return [f"sudo -n networksetup -setnetworkserviceenabled {shlex.quote(service)} {'on' if enabled else 'off'}"]


def firewall_unblock_commands(python: str) -> list[str]:
    q = shlex.quote(python)
    return [f"sudo -n {SOCKETFILTERFW} --add {q} --unblockapp {q}"]


def firewall_undo_commands(python: str) -> list[str]:
    return [f"sudo -n {SOCKETFILTERFW} --remove {shlex.quote(python)}"]


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
