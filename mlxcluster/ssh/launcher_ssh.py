"""The ``ssh`` that mlx.launch and mpirun start remote ranks with.

Both run plain ``ssh`` from PATH, with the user's defaults: no keepalive, so
a host that dies or loses its link mid-run is never noticed and the job
waits forever; no BatchMode, so a host that wants a password can stall the
launch; and not the inventory's ``ssh_config``. For a job we put a small
``ssh`` script first on the launcher's PATH that runs the real ssh with:

- ``ServerAliveInterval=5``, ``ServerAliveCountMax=3``: a host that stops
  answering ends its ssh within ~15 s (exit 255), so the launcher sees that
  rank fail and stops the others;
- ``BatchMode=yes``: never prompt;
- ``StrictHostKeyChecking=yes``: an unknown or changed host key fails, even
  where the user's config says ``no`` or ``accept-new``;
- ``ConnectTimeout``: a dead host also fails the launcher's own stop calls;
- ``-F <inventory ssh_config>`` when the inventory names one;
- the inventory's ``port:`` of each host: neither launcher can say a port
  (an mlx.launch hostfile names ``[user@]host``, an Open MPI one the host),
  so the wrapper reads a config written for the job (``ports_config``):
  ``Host`` blocks with those ports first (ssh keeps the first value it
  reads), then ``Include`` of what ssh would have read without ``-F``.

Options given on the command line win over the config files, and the
launchers' own arguments follow ours.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlxcluster.errors import InputError

KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
CONNECT_TIMEOUT_S = 10
WRAPPER_MARK = "# mlxcluster launcher ssh"


def ssh_options(ssh_config: str | None) -> list[str]:
    """The options every launcher ssh call gets."""
    options = []
    if ssh_config:
        options += ["-F", os.path.expanduser(ssh_config)]
    options += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}",
                "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}"]
    return options


def real_ssh(path_env: str) -> str:
    """The ssh the launcher would have run (first on ``path_env``), skipping
    wrappers of ours so that they never call each other."""
    for directory in path_env.split(os.pathsep):
        candidate = Path(directory or ".") / "ssh"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        try:
            if WRAPPER_MARK in candidate.read_text(errors="replace")[:400]:
                continue
        except OSError:
            continue
        return str(candidate)
    found = shutil.which("ssh")
    if not found:
        raise InputError("no ssh client found on PATH", "install OpenSSH's client (ssh)")
    return found


USER_CONFIGS = ("~/.ssh/config", "/etc/ssh/ssh_config")  # what ssh reads without -F, in order


def ports_config(ports: Mapping[str, int], ssh_config: str | None) -> str:
    """An OpenSSH config giving each target in ``ports`` (the names and IPs
    the launchers ssh to) its port, then reading ``ssh_config`` (else the
    user's and the system's config) for everything else. ``Match all``
    closes the last ``Host`` block, so the ``Include`` applies to every host."""
    by_port: dict[int, list[str]] = {}
    for target, port in ports.items():
        by_port.setdefault(port, []).append(target)
    blocks = "".join(f"Host {' '.join(targets)}\n    Port {port}\n" for port, targets in by_port.items())
    includes = (os.path.abspath(os.path.expanduser(ssh_config)),) if ssh_config else USER_CONFIGS
    return ("# written by mlxcluster for one job: the inventory's ssh ports, then the config "
            "ssh reads otherwise\n" + blocks + "Match all\n"
            + "".join(f"Include {path}\n" for path in includes))


def write_wrapper(directory: Path, ssh_config: str | None, path_env: str,
                  shared: Sequence[str] = (), ports: Mapping[str, int] | None = None) -> Path:
    """Write ``directory/ssh`` (executable); returns the directory.
    ``shared``: the job's connection-sharing options (ssh.shared), so that
    the launcher's calls ride on the job's one connection per host;
    ``ports``: target -> the inventory's ssh port (``ports_config``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if ports:
        config = directory / "ssh_config"
        config.write_text(ports_config(ports, ssh_config))
        ssh_config = str(config)
    argv = [real_ssh(path_env), *ssh_options(ssh_config), *shared]
    script = f"#!/bin/sh\n{WRAPPER_MARK}\nexec {shlex.join(argv)} \"$@\"\n"
    wrapper = directory / "ssh"
    wrapper.write_text(script)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def launcher_environment(env: dict[str, str], directory: Path, ssh_config: str | None,
                         shared: Sequence[str] = (),
                         ports: Mapping[str, int] | None = None) -> dict[str, str]:
    """``env`` with a wrapper written to ``directory`` first on PATH."""
    path_env = env.get("PATH", os.defpath)
    write_wrapper(directory, ssh_config, path_env, shared, ports)
    return {**env, "PATH": f"{directory}{os.pathsep}{path_env}"}
