"""The Thunderbolt IP plan: one /30 per cable, like mlx.distributed_config's
auto-setup (``192.168.{a}.{b+1}`` and ``.{b+2}``, netmask 255.255.255.252,
b stepping by 4), printed as per-host commands and optionally applied over SSH.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from mlxcluster.errors import InputError, RemoteError
from mlxcluster.ssh.openssh import ssh_argv
from mlxcluster.topology.topology import Link, Topology

NETMASK = "255.255.255.252"
SSH_TIMEOUT_S = 30


@dataclass(frozen=True)
class CableAddresses:
    link: Link
    a_ip: str
    b_ip: str
    network: str  # "192.168.0.0/30"


@dataclass(frozen=True)
class IpPlan:
    cables: tuple[CableAddresses, ...]

    def address(self, host: str, link: Link) -> str:
        """The planned address of ``host``'s end of ``link``."""
        for c in self.cables:
            if c.link == link:
                return c.a_ip if host == link.a else c.b_ip
        raise KeyError((host, link))

    def subnets(self) -> list[str]:
        return [c.network for c in self.cables]

    def commands(self, host: str, sudo: str = "sudo") -> list[str]:
        """The shell commands that set ``host``'s addresses (macOS). ``sudo``
        prefixes each: "sudo" to print for a person, "sudo -n" over SSH (fail,
        never wait for a password no one can type)."""
        cmds = [f"{sudo} ifconfig bridge0 down"]
        for c in self.cables:
            for end, iface, mine, peer in ((c.link.a, c.link.a_interface, c.a_ip, c.b_ip),
                                           (c.link.b, c.link.b_interface, c.b_ip, c.a_ip)):
                if end == host:
                    cmds += address_commands(iface, mine, peer, sudo)
        return cmds


def address_commands(iface: str, mine: str, peer: str, sudo: str = "sudo") -> list[str]:
    """One cable end's two commands of the plan: its address, and the route
    to the other end through it (as mlx.distributed_config's auto-setup)."""
    return [f"{sudo} ifconfig {shlex.quote(iface)} inet {mine} netmask {NETMASK}",
            f"{sudo} route change {peer} -interface {shlex.quote(iface)}"]


def plan_ips(topology: Topology) -> IpPlan:
    """Assign a /30 to every cable, in the topology's link order."""
    cables = []
    third, fourth = 0, 0
    for link in topology.links:
        if not link.a_interface or not link.b_interface:
            raise InputError(
                f"cable {link.a} <-> {link.b} has an end with no known interface",
                "capture networksetup -listallhardwareports on both hosts",
            )
        if third > 255:
            raise InputError("more cables than 192.168.0.0/16 has /30 networks")
        cables.append(CableAddresses(link, f"192.168.{third}.{fourth + 1}",
                                     f"192.168.{third}.{fourth + 2}", f"192.168.{third}.{fourth}/30"))
        fourth += 4
        if fourth > 252:
            third, fourth = third + 1, 0
    return IpPlan(tuple(cables))


Runner = Callable[..., subprocess.CompletedProcess]


def _ssh(inventory, host, command: str) -> list[str]:
    return ssh_argv(host.ssh, command, ssh_config=inventory.ssh_config, connect_timeout=5,
                    user=host.user, port=host.port)


def apply_ip_plan(inventory, plan: IpPlan, run: Runner = subprocess.run) -> dict[str, str]:
    """Run each host's commands over SSH (the inventory's ssh_config, ``sudo -n``),
    after checking passwordless sudo on every host first (nothing is changed
    unless all hosts pass)."""
    no_sudo = []
    for host in inventory.hosts:
        try:
            r = run(_ssh(inventory, host, "sudo -n true"), capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            no_sudo.append(f"{host.name} (ssh timed out)")
            continue
        if r.returncode != 0:
            no_sudo.append(host.name)
    if no_sudo:
        raise RemoteError(
            f"passwordless sudo is not available on {', '.join(no_sudo)}; nothing was changed",
            "allow 'sudo -n' for ifconfig/route on those hosts, or run the printed commands yourself",
        )
    done = {}
    for host in inventory.hosts:
        command = " && ".join(plan.commands(host.name, sudo="sudo -n"))
        try:
            r = run(_ssh(inventory, host, command), capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise RemoteError(f"{host.name}: applying the IP plan timed out") from exc
        if r.returncode != 0:
            raise RemoteError(f"{host.name}: applying the IP plan failed: {r.stderr.strip()}",
                              "run the printed commands on that host by hand")
        done[host.name] = command
    return done
