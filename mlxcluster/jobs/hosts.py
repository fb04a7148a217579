"""Where a job's ranks run, and running a short script on each of those hosts.

One ``RankHost`` per rank, built from an inventory, an MLX hostfile or
``--local N``. Remote hosts are reached with the OpenSSH client
(``BatchMode=yes``: it never prompts) as ``mlx.launch`` reaches them; every
call has a timeout. A rank whose ssh target is 127.0.0.1 is on this machine:
``mlx.launch`` starts it without ssh, and so do we.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from mlxcluster.errors import InputError
from mlxcluster.hostfile.hostfile import load_launch_hostfile
from mlxcluster.inventory.inventory import LOCAL_TARGETS, local_inventory
from mlxcluster.ssh import openssh
from mlxcluster.ssh.results import CommandResult, SshError
from mlxcluster.ssh.runner import Input, ProcessRunner, StreamingRunner
from mlxcluster.transfer.link import ProcessLink

SSH_TIMEOUT_S = 20
SSH_CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class RankHost:
    """Where one rank runs: its display name, ssh target, data-path IPs and python."""

    name: str
    ssh: str
    ips: tuple[str, ...]
    python: str
    rdma: tuple = ()
    ssh_options: tuple[str, ...] = ()  # e.g. ("-F", "/path/ssh_config", "-p", "2222") from the inventory
    user: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the inventory's env for this host (cluster + host)
    port: int | None = None  # the inventory's ssh port (also in ssh_options, for our own calls)

    @property
    def is_local(self) -> bool:
        return self.ssh in LOCAL_TARGETS

    @property
    def ssh_target(self) -> str:
        """``user@host`` when a user is set (what ``ssh`` and mlx.launch take)."""
        return f"{self.user}@{self.ssh}" if self.user and not self.is_local else self.ssh

    @property
    def ip(self) -> str:
        """The first data-path IP, else the ssh target (which may be a name)."""
        return self.ips[0] if self.ips else self.ssh


def launcher_ports(hosts: tuple[RankHost, ...]) -> dict[str, int]:
    """The ssh port of every remote host that has one, under each name a
    launcher may ssh to it by: its ssh target (mlx.launch) and its data IP
    (an Open MPI hostfile names it)."""
    return {name: h.port for h in remote_hosts(hosts) if h.port for name in (h.ssh, h.ip)}


def hosts_from_inventory(inv) -> tuple[RankHost, ...]:
    """One rank per inventory host (``mlxcluster.inventory.inventory.Inventory``), in
    inventory order: its name, ssh target, data IPs, python and ssh options."""
    options: tuple[str, ...] = ("-F", os.path.expanduser(inv.ssh_config)) if inv.ssh_config else ()
    return tuple(
        RankHost(h.name, h.ssh, tuple(h.ips) or (h.ssh,), h.python,
                 ssh_options=options + (("-p", str(h.port)) if h.port else ()), user=h.user,
                 env=tuple(sorted(h.env.items())), port=h.port)
        for h in inv.hosts)


def local_hosts(n: int, python: str | None = None) -> tuple[RankHost, ...]:
    """``n`` ranks on this machine (mlx.launch runs 127.0.0.1 without ssh)."""
    return hosts_from_inventory(local_inventory(n, python))


def hosts_from_hostfile(path: str, python: str | None = None) -> tuple[tuple[RankHost, ...], str]:
    """Read and validate an MLX JSON hostfile (``{"backend", "envs", "hosts":
    [{"ssh", "ips", "rdma"}]}`` or a bare list of hosts) or an MPI one
    (``host slots=1``); returns the hosts and its backend."""
    hostfile = load_launch_hostfile(path)
    hosts = tuple(RankHost(h.ssh, h.ssh, h.ips, python or sys.executable, h.rdma)
                  for h in hostfile.hosts)
    return hosts, hostfile.backend


def single_python(hosts: Sequence[RankHost]) -> str:
    """mlx.launch takes one --python for every host."""
    pythons = sorted({h.python for h in hosts})
    if len(pythons) != 1:
        raise InputError(f"hosts use different pythons {pythons}; mlx.launch takes one --python",
                         "install the same venv path on every host")
    return pythons[0]


def inventory_ssh_config(hosts: Sequence[RankHost]) -> str | None:
    """The ``-F`` config the ranks' own ssh calls use (from the inventory)."""
    for host in hosts:
        options = list(host.ssh_options)
        if "-F" in options[:-1]:
            return options[options.index("-F") + 1]
    return None


def distinct_hosts(hosts: Sequence[RankHost]) -> list[RankHost]:
    """Each host once, in rank order (ranks may share a host)."""
    seen: dict[str, RankHost] = {}
    for h in hosts:
        seen.setdefault(h.ssh, h)
    return list(seen.values())


def remote_hosts(hosts: Sequence[RankHost]) -> list[RankHost]:
    """Each distinct host that is not this machine, once."""
    return [h for h in distinct_hosts(hosts) if not h.is_local]


def require_python_here(python: str) -> None:
    """Ranks on this machine run ``python``: it must exist here (a path, or a
    name on PATH). A missing one is bad input (exit 2), not a launch whose
    ranks exit with code 127. Remote hosts' pythons are asked over ssh."""
    if shutil.which(python) is None:
        raise InputError(f"python not found: {python} (the python the local ranks run)",
                         "pass --python with the path of a python that has mlx installed, "
                         "or leave it out to use this one")


def require_local_pythons(hosts: Sequence[RankHost]) -> None:
    """require_python_here for every python of a rank on this machine."""
    for python in sorted({h.python for h in hosts if h.is_local}):
        require_python_here(python)


# ---------------------------------------------------------------- a script on every host


@dataclass(frozen=True)
class HostResult:
    """Outcome of one chore on one host: ok, output, or the reason it failed."""

    host: str
    ok: bool
    output: str
    error: str = ""


def ssh_argv(host: RankHost, script: str) -> list[str]:
    """``ssh`` that never prompts and gives up connecting after 5 s."""
    return openssh.ssh_argv(host.ssh_target, script, connect_timeout=SSH_CONNECT_TIMEOUT_S,
                            options=host.ssh_options)


def host_runner(host: RankHost, env: dict[str, str] | None = None) -> StreamingRunner:
    """The one way every layer runs a command on a rank's host
    (ssh/runner.py), streams included: ``host_argv`` run here, with ``env``,
    and the same ssh, without a target, for rsync's ``-e``. The unit tests
    put their fake (tests/fakes.FakeSsh) here, for every layer at once."""
    rsh = () if host.is_local else tuple(openssh.ssh_client_argv(
        connect_timeout=SSH_CONNECT_TIMEOUT_S, options=host.ssh_options))
    return ProcessRunner(partial(host_argv, host), env=env, rsh=rsh)


def run_on(host: RankHost, command: str, *, stdin: Input | None = None, timeout: float,
           env: dict[str, str] | None = None) -> CommandResult:
    """``command`` on ``host`` through its runner (``host_runner``): the
    result, ssh's exit 255 included; SshError when it did not end in time or
    the client could not start."""
    return host_runner(host, env).run(host.name, command, user=None, port=None,
                                      timeout=timeout, stdin=stdin)


def host_link(host: RankHost, env: dict[str, str] | None = None) -> ProcessLink:
    """How a transfer reaches ``host``, all through the host's runner
    (``host_runner``): its plain commands, the argv its streams run by
    (``host_argv``: bash here for a local rank), and its ssh for rsync's ``-e``."""
    return ProcessLink(host.name, host.python, host_runner(host, env), host.ssh_target)


def host_argv(host: RankHost, script: str) -> list[str]:
    """``script`` run by bash here for a local rank, else over ssh."""
    return ["bash", "-c", script] if host.is_local else ssh_argv(host, script)


def run_script(host: RankHost, script: str, stdin: str | None = None,
               timeout: float = SSH_TIMEOUT_S, env: dict[str, str] | None = None) -> HostResult:
    """Run a bash script on ``host`` (locally for 127.0.0.1), with a timeout."""
    try:
        result = run_on(host, script, stdin=stdin, timeout=timeout, env=env)
    except SshError as err:
        why = f"timed out after {timeout:.0f} s" if err.kind == "command-timeout" else err.message
        return HostResult(host.name, False, "", why)
    if result.exit_status != 0:
        return HostResult(host.name, False, result.stdout,
                          (result.stderr.strip() or f"exit code {result.exit_status}")[-500:])
    return HostResult(host.name, True, result.stdout)


Result = TypeVar("Result")


def for_each_host(hosts: Sequence[RankHost], fn: Callable[[RankHost], Result]) -> list[Result]:
    """Run ``fn(host)`` on every host at once; one result per host, in order."""
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        return list(pool.map(fn, hosts))
