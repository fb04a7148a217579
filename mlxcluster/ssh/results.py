"""What a remote call gives back, whichever client made it (paramiko in
ssh/remote.py, OpenSSH in ssh/openssh.py): a command's result, one host's
outcome in a parallel run, an SSH failure.

Apart from remote.py so that modules that only run OpenSSH (the jobs
layer, the ip plan) do not import paramiko, the largest import of a
`mlxcluster run` start-up (docs/performance-history.md, run over bare mlx.launch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from mlxcluster.errors import RemoteError

T = TypeVar("T")


class SshError(RemoteError):
    """An SSH connect or command failure; ``kind`` names the cause.

    kinds: unknown-host-key, host-key-mismatch, auth, refused, timeout,
    unreachable, dns, proxy, command-timeout, ssh, and known-hosts (a
    known_hosts file this client cannot read, e.g. an OpenSSH
    ``@cert-authority`` or ``@revoked`` line: no host is tried then).

    ``target`` is the host text written into ``hint`` (name, IP or ssh
    target), if any: doctor takes it out to give one fix for many hosts.
    """

    def __init__(self, kind: str, message: str, hint: str | None = None, target: str | None = None):
        super().__init__(message, hint)
        self.kind = kind
        self.target = target


@dataclass(frozen=True)
class CommandResult:
    """What one remote command produced."""

    stdout: str
    stderr: str
    exit_status: int
    seconds: float


@dataclass
class Outcome(Generic[T]):
    """One host's result in a parallel run: a value or an error."""

    host: str
    value: T | None = None
    error: Exception | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None
