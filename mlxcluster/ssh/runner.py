"""The one way to run a command on a host: ``HostRunner.run``.

Every layer that runs a command on a host asks a ``HostRunner``: doctor
and its fixes (``remote.ParamikoRunner``: paramiko, its connections kept
open), doctor's launcher-path check (``openssh.OpenSshRunner``), a job's
rank hosts (``ProcessRunner`` over ``jobs.hosts.host_argv``: OpenSSH as the
launchers reach the hosts, ``BatchMode``, the inventory's options and the
job's ``ControlMaster`` sharing; bash for a rank on this machine) and a
transfer's plain commands (``transfer.link``). The unit tests' one fake
(``tests/fakes.FakeSsh``) is a HostRunner too.

The contract:

- ``command`` is one shell command line, every argument already quoted
  (``shlex``); ``stdin`` is text, bytes or a binary file read to its end.
- The result is the command's stdout, stderr and exit status.
- A command that does not end within ``timeout`` raises ``SshError`` of
  kind ``command-timeout``; a client that cannot be started raises
  ``SshError`` of kind ``ssh``.
- A transfer streams its bytes through a process here (``transfer.link``):
  a runner that runs a program per command (``ProcessRunner``, and the
  tests' fake) is also a ``StreamingRunner``, giving that program's argv
  (``argv_for``) and the ssh words rsync's ``-e`` takes (``rsh``; () when
  rsync cannot go that way). Doctor's paramiko connections stream nothing.
- A host that cannot be reached: a runner that connects itself (paramiko)
  raises ``SshError`` naming the cause; one that runs the ``ssh`` program
  gives back ssh's own exit 255 (``SSH_FAILED``) with ssh's message on
  stderr, as the launchers see it (``OpenSshRunner`` turns that into the
  ``SshError``; ``unreachable`` tells the two apart for the callers that care).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import BinaryIO, Protocol, runtime_checkable

from mlxcluster.ssh.results import CommandResult, SshError

SSH_FAILED = 255  # ssh's own exit code: the connection failed or was lost

Input = str | bytes | BinaryIO


@runtime_checkable
class HostRunner(Protocol):
    """Runs one command on a host, bounded in time (the module's contract)."""

    def run(self, alias: str, command: str, *, user: str | None = None, port: int | None = None,
            timeout: float | None = None, stdin: Input | None = None) -> CommandResult:
        """``command`` on the host ``alias`` (as the runner names hosts)."""


@runtime_checkable
class StreamingRunner(HostRunner, Protocol):
    """A HostRunner whose commands run as a program here, which a transfer
    starts itself to stream bytes through (transfer/link.py ``ProcessLink``)."""

    rsh: tuple[str, ...]  # ssh and its options, no target (rsync's -e); (): no rsync
    env: dict[str, str] | None  # the environment its programs run in (None: this process's)

    def argv_for(self, alias: str, command: str) -> list[str]:
        """The argv that runs ``command`` on the host ``alias``, as a process here."""


def command_timeout(alias: str, limit: float) -> SshError:
    """What every runner raises for a command that did not end in time."""
    return SshError("command-timeout", f"{alias}: command did not finish within {limit:.0f} s",
                    "the host is overloaded or the command hangs")


def input_bytes(stdin: Input | None) -> bytes | None:
    """``stdin`` as bytes for a process run here (a file is read to its end)."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode("utf-8")
    return b"".join(iter(lambda: stdin.read(1 << 20), b""))


class ProcessRunner:
    """A host reached by a program run here: ``argv(command)`` is the argv
    that runs ``command`` there (ssh and its options with the host's target,
    or bash for this machine). ``alias`` only names the host in messages:
    the argv already knows where it goes. ``env``: the program's environment
    (None: this process's)."""

    def __init__(self, argv: Callable[[str], list[str]], *, env: dict[str, str] | None = None,
                 command_timeout: float = 60.0, rsh: tuple[str, ...] = ()):
        self.argv = argv
        self.env = env
        self.command_timeout = command_timeout
        self.rsh = rsh

    def argv_for(self, alias: str, command: str) -> list[str]:
        return self.argv(command)

    def run(self, alias: str, command: str, *, user: str | None = None, port: int | None = None,
            timeout: float | None = None, stdin: Input | None = None) -> CommandResult:
        limit = timeout or self.command_timeout
        data = input_bytes(stdin)
        started = time.monotonic()
        try:
            proc = subprocess.run(self.argv(command), input=data, capture_output=True, timeout=limit,
                                  env=self.env, stdin=subprocess.DEVNULL if data is None else None)
        except subprocess.TimeoutExpired:
            raise command_timeout(alias, limit) from None
        except OSError as err:  # no ssh (or bash) here
            raise SshError("ssh", str(err), "install OpenSSH (mlx.launch and mpirun need it)") from None
        return CommandResult(proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
                             proc.returncode, time.monotonic() - started)


def unreachable(result: CommandResult) -> bool:
    """Whether a result is ssh's own failure (exit 255: no connection, or it
    was lost), not the command's answer."""
    return result.exit_status == SSH_FAILED
