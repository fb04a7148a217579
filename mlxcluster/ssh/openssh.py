"""Run commands with the OpenSSH client, the way mlx.launch and mpirun do.

``mlx.launch`` and Open MPI start remote processes with plain ``ssh host
cmd``; paramiko succeeding does not prove that path works (another key, an
agent only paramiko sees, a host key only in our known_hosts...). So doctor
also runs ``ssh -F CONFIG -o BatchMode=yes -o ConnectTimeout=N host cmd``:
BatchMode makes ssh fail instead of prompting for a password or a host key,
and StrictHostKeyChecking=yes makes an unknown or changed host key fail
whatever the user's config says.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from mlxcluster.ssh.results import CommandResult, SshError
from mlxcluster.ssh.runner import SSH_FAILED, Input, ProcessRunner

# Substrings of OpenSSH's stderr -> (kind, cause, fix).
# A changed key prints both the CHANGED banner and "Host key verification
# failed": the banner comes first here, so a changed key is never called unknown.
_STDERR_CAUSES: tuple[tuple[str, str, str, str], ...] = (
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "host-key-mismatch", "host key changed",
     "find out why first (reinstalled host? another machine on that address?), then "
     "ssh-keygen -R HOST and connect once to accept the new key"),
    ("Host key verification failed", "unknown-host-key", "host key unknown",
     "run 'ssh HOST' once interactively, check the fingerprint and accept the key"),
    ("Permission denied", "auth", "key authentication failed",
     "ssh-copy-id USER@HOST (BatchMode never falls back to a password)"),
    ("Connection refused", "refused", "connection refused (no sshd listening)",
     "enable Remote Login (System Settings > General > Sharing) or start sshd"),
    ("Connection timed out", "timeout", "connect timed out", "host down or a firewall drops the SSH port"),
    ("Operation timed out", "timeout", "connect timed out", "host down or a firewall drops the SSH port"),
    ("No route to host", "unreachable", "no route to host", "check the link and routes"),
    ("Could not resolve hostname", "dns", "name does not resolve", "fix the ssh target or HostName"),
)


def ssh_argv(target: str, command: str | None, **client) -> list[str]:
    """The argv of a non-interactive ssh call; ``command`` is already quoted
    (None: no command, for ``-N`` with a forward among the options;
    ``client``: ``ssh_client_argv``'s options)."""
    # Inventories and hostfiles forbid a leading '-' in a target; '--' makes
    # sure ssh never reads one as an option anyway.
    argv = [*ssh_client_argv(**client), "--", target]
    return argv if command is None else [*argv, command]


def ssh_client_argv(
    *,
    ssh_config: str | None = None,
    connect_timeout: float = 5.0,
    user: str | None = None,
    port: int | None = None,
    ssh: str = "ssh",
    options: Sequence[str] = (),
) -> list[str]:
    """ssh and its options, without a target: what ``ssh_argv`` runs, and
    what rsync's ``-e`` takes (rsync adds the target and its command).
    ``options`` are further ssh arguments (e.g. an inventory's ``-F``/``-p``)."""
    argv = [ssh]
    if ssh_config:
        argv += ["-F", os.path.expanduser(ssh_config)]
    # BatchMode: never prompt. StrictHostKeyChecking=yes: an unknown or changed
    # host key fails even where the user's config says 'no' or 'accept-new'
    # (options given here win over the config file), as it does for paramiko.
    argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"ConnectTimeout={max(1, int(round(connect_timeout)))}"]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    return argv + list(options)


def parse_ssh_g(text: str) -> dict[str, str]:
    """``ssh -G`` output (``keyword value`` lines, keywords lower-case) as a
    dict; a keyword given several times (identityfile) keeps its first value."""
    options: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), value.strip())
    return options


def explain_failure(target: str, status: int, stderr: str) -> SshError:
    """Turn ssh's exit 255 + stderr into an SshError naming the cause."""
    for needle, kind, cause, fix in _STDERR_CAUSES:
        if needle in stderr:
            return SshError(kind, f"ssh {target}: {cause}", fix.replace("HOST", target),
                            target=target if "HOST" in fix else None)
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {status}"
    return SshError("ssh", f"ssh {target}: {last}", f"run 'ssh -v {target} true' for details", target=target)


class OpenSshRunner:
    """Runs commands via the ``ssh`` binary with BatchMode (never prompts)."""

    def __init__(self, ssh_config: str | None = None, *, connect_timeout: float = 5.0,
                 command_timeout: float = 60.0, env: dict[str, str] | None = None, ssh: str = "ssh"):
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.env = env
        self.ssh = ssh

    def resolved_options(self, target: str, *, user: str | None = None,
                         port: int | None = None) -> dict[str, str]:
        """The options plain ``ssh HOST`` would use for ``target`` with this
        config (``ssh -G``: reads the config files, contacts nobody)."""
        argv = [self.ssh]
        if self.ssh_config:
            argv += ["-F", os.path.expanduser(self.ssh_config)]
        argv += ["-G"] + (["-l", user] if user else []) + (["-p", str(port)] if port else [])
        try:
            proc = subprocess.run([*argv, "--", target], stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=10, env=self.env)
        except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
            raise SshError("ssh", f"ssh -G {target}: {exc}", "check the OpenSSH client") from exc
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise SshError("ssh", f"ssh -G {target}: {last}", "check the ssh config file")
        return parse_ssh_g(proc.stdout)

    def run(self, target: str, command: str, *, user: str | None = None, port: int | None = None,
            timeout: float | None = None, stdin: Input | None = None) -> CommandResult:
        """Run ``command`` (already quoted); raise SshError when ssh itself failed (exit 255).
        A HostRunner (ssh/runner.py), through the one ``ProcessRunner``."""
        def argv(line: str) -> list[str]:
            return ssh_argv(target, line, ssh_config=self.ssh_config,
                            connect_timeout=self.connect_timeout, user=user, port=port, ssh=self.ssh)

        process = ProcessRunner(argv, env=self.env, command_timeout=self.command_timeout)
        try:
            result = process.run(target, command, timeout=timeout, stdin=stdin)
        except SshError as exc:
            if exc.kind == "command-timeout":
                limit = timeout or self.command_timeout
                raise SshError("command-timeout", f"ssh {target}: no answer within {limit:.0f} s",
                               "the host hangs after connecting; check it directly") from None
            raise SshError("ssh", f"the OpenSSH client '{self.ssh}' is not installed",
                           "install OpenSSH (mlx.launch and mpirun need it)") from None
        if result.exit_status == SSH_FAILED:
            raise explain_failure(target, result.exit_status, result.stderr)
        return result
