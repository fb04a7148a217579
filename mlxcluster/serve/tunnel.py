"""The way from this machine to rank 0's server.

mlx-lm's server listens on rank 0's own loopback (``--host 127.0.0.1``): on
a Mac that is not the one the user types on, nothing here can reach it. An
``ssh -N -L`` to rank 0's host forwards a port of this machine's loopback to
it. The forward has a connection of its own (not the job's shared master:
a forward asked through a master outlives the client that asked for it) with
its own keepalive, BatchMode and host key checks (``openssh.ssh_argv``).

A rank 0 on this machine needs no forward: its port is reached as it is.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
from dataclasses import dataclass

from mlxcluster import interrupts
from mlxcluster.errors import MlxclusterError
from mlxcluster.jobs.hosts import SSH_CONNECT_TIMEOUT_S, RankHost, run_script
from mlxcluster.jobs.plan import free_port_block
from mlxcluster.ssh import openssh, shared

KEEPALIVE = ("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
STOP_GRACE_S = 3.0

# Run with the host's python: a port free on its loopback now.
FREE_PORT_SCRIPT = ("import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
                    "print(s.getsockname()[1])")


def free_port_on(host: RankHost, env: dict[str, str] | None = None) -> int:
    """A TCP port free on ``host``'s loopback now (bound and released by its
    python: the server binds it a few seconds later; taken meanwhile, the
    server fails, and the restart asks again)."""
    if host.is_local:
        return free_port_block(1)
    got = run_script(host, f"{shlex.quote(host.python)} -c {shlex.quote(FREE_PORT_SCRIPT)}", env=env)
    if not got.ok or not got.output.strip().isdigit():
        raise MlxclusterError(f"{host.name}: could not find a free port for the server "
                              f"({got.error or got.output.strip() or 'no answer'})",
                              "check that the host answers over ssh and its python runs")
    return int(got.output.strip())


def forward_argv(host: RankHost, local_port: int, remote_port: int) -> list[str]:
    """ssh forwarding 127.0.0.1:``local_port`` here to ``remote_port`` on the
    host's loopback, and nothing else (-N); it fails at once when the local
    port cannot be bound (ExitOnForwardFailure)."""
    options = (*shared.without_sharing(host.ssh_options), "-N", "-o", "ExitOnForwardFailure=yes",
               *KEEPALIVE, "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}")
    return openssh.ssh_argv(host.ssh_target, None, connect_timeout=SSH_CONNECT_TIMEOUT_S,
                            options=options)


@dataclass
class Tunnel:
    """An open way to rank 0's server: ``port`` on this machine's loopback."""

    port: int
    proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            interrupts.stop_process(self.proc, 15, STOP_GRACE_S, group=True)


def open_tunnel(host: RankHost, remote_port: int, env: dict[str, str] | None = None) -> Tunnel:
    """The way to ``remote_port`` on ``host``'s loopback from here."""
    if host.is_local:
        return Tunnel(remote_port)
    local_port = free_port_block(1)
    proc = subprocess.Popen(forward_argv(host, local_port, remote_port), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    return Tunnel(local_port, proc)


def listening(port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False
