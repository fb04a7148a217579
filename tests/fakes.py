"""The unit tests' stand-ins: ``Clock``, a clock a test moves by hand (at the end), and
``FakeSsh``, the one fake host runner (mlxcluster/ssh/runner.py's ``HostRunner``, as
paramiko's, OpenSSH's and a job's rank hosts' runners are), which records every command it
is asked to run and answers it one of two ways. ``run_hosts_by`` (the ``hosts_run_by``
fixture) puts it where every layer gets its runner.

- Scripted (``FakeSsh(replies, default=...)``): a reply per command, or per host and
  command, else ``default`` (exit 0, no output, unless told otherwise; None: no command
  is expected, and one fails the test).
- For real (``FakeSsh.local(root, inventory)``): each inventory host's commands run by
  ``sh`` on this machine with HOME = a folder of its own under ``root``, so a fix's shell
  steps change files a test can look at.
- Probed (``FakeSsh.probed(inventory, captures)``): each host answers doctor's probe
  (mlxcluster/facts/collect.py) with a capture: real outputs of real Macs
  (tests/fixtures/macos), as a `doctor --collect` folder holds them.

Replies are CommandResults (``result`` makes one); a reply may also be a function of the
host and the command, for an answer computed from what was asked.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from mlxcluster.facts.capture import HostCapture
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.ssh.results import CommandResult, SshError

Reply = CommandResult | Callable[[str, str], CommandResult]

LOCAL_TIMEOUT = 60.0  # a command run here without a timeout of its own


def result(stdout: str = "", stderr: str = "", exit_status: int = 0) -> CommandResult:
    """What a quick remote command gives back."""
    return CommandResult(stdout, stderr, exit_status, 0.01)


def unreachable(error: str) -> Reply:
    """A host that cannot be reached: the SshError paramiko's runner raises."""
    def refuse(host: str, command: str) -> CommandResult:
        raise SshError("refused", error)
    return refuse


OK = result()
# `sudo -n true` where sudo wants a password (what the fixes ask before any sudo -n change).
SUDO_WANTS_PASSWORD = result(stderr="sudo: a password is required\n", exit_status=1)


class FakeSsh:
    """Runs nothing over SSH. ``calls``: each (host, command) asked, in order, the host
    by its inventory name where it is known (FakeSsh.local) and else as the runner was
    called with it; ``timeouts``: each call's timeout, in the same order.

    ``replies`` maps a command (any host) or a (host, command) pair to its reply; the
    pair wins. A command without one gets ``default``, or runs on its host's HOME
    (FakeSsh.local); with neither it fails the test (AssertionError)."""

    def __init__(self, replies: Mapping[str | tuple[str, str], Reply] | None = None, *,
                 default: Reply | None = OK):
        self.replies = dict(replies or {})
        self.default = default
        self.calls: list[tuple[str, str]] = []
        self.timeouts: list[float | None] = []
        self.homes: dict[str, Path] = {}  # host name -> its HOME (FakeSsh.local)
        self.names: dict[str, str] = {}  # ssh address -> host name (FakeSsh.local)
        self.stdin_cut_short = False

    @classmethod
    def local(cls, root: Path, inventory: Inventory, *, stdin_cut_short: bool = False) -> FakeSsh:
        """The inventory's hosts as folders root/<name>, each command run by ``sh`` here
        with HOME = its host's folder. ``stdin_cut_short``: whatever is sent on a
        command's stdin arrives empty (a send that broke off)."""
        fake = cls(default=None)
        for host in inventory.hosts:
            fake.names[host.ssh] = host.name
            fake.homes[host.name] = root / host.name
            fake.homes[host.name].mkdir(parents=True)
        fake.stdin_cut_short = stdin_cut_short
        return fake

    def run(self, alias: str, command: str, *, user: str | None = None, port: int | None = None,
            timeout: float | None = None, stdin: BinaryIO | None = None) -> CommandResult:
        host = self.names.get(alias, alias)
        self.calls.append((host, command))
        self.timeouts.append(timeout)
        reply = self.replies.get((host, command), self.replies.get(command))
        if reply is None and host in self.homes:
            return self._run_here(host, command, stdin, timeout)
        if reply is None:
            reply = self.default
        if reply is None:
            raise AssertionError(f"no command on a host was expected here; {host} was asked: {command}")
        return reply(host, command) if callable(reply) else reply

    # A StreamingRunner too (mlxcluster/ssh/runner.py): a transfer's stream runs on
    # the host's HOME (FakeSsh.local) as its plain commands do; no rsync (no ssh).
    rsh: tuple[str, ...] = ()
    env: dict[str, str] | None = None  # argv_for sets each host's HOME itself

    def argv_for(self, alias: str, command: str) -> list[str]:
        host = self.names.get(alias, alias)
        if host not in self.homes:
            raise AssertionError(f"no stream to a host was expected here; {host} was asked: {command}")
        return ["env", f"HOME={self.homes[host]}", f"PATH={os.environ['PATH']}", "sh", "-c", command]

    @classmethod
    def at(cls, homes: Mapping[str, Path]) -> FakeSsh:
        """Hosts by name, each a HOME of its own here (``homes``: made if missing),
        every command and stream run there, as FakeSsh.local without an inventory."""
        fake = cls(default=None)
        for name, home in homes.items():
            home.mkdir(parents=True, exist_ok=True)
            fake.homes[name] = home
        return fake

    @classmethod
    def probed(cls, inventory: Inventory, captures: Mapping[str, HostCapture], *,
               default: Reply | None = None) -> FakeSsh:
        """Each of the inventory's hosts answers doctor's probe with its capture
        (by host name): the probe's own output, a JSON line with the raw outputs in
        it, as ``capture_from_probe`` reads it back; a capture of an error is a host
        that cannot be reached: SshError ("refused") with that error, as paramiko's
        runner raises one. The job's python answers (``PY -S -c ''``, what a
        launch asks first: jobs/job_python.py). Any other command gets ``default``
        (None: it fails the test)."""
        from mlxcluster.facts.capture import PROBE
        from mlxcluster.facts.collect import probe_command

        fake = cls(default=default)
        for host in inventory.hosts:
            fake.names[host.ssh] = host.name
            capture = captures[host.name]
            if capture.error:
                answer = unreachable(capture.error)
            else:
                facts = json.loads(capture.files.get(PROBE, "{}"))
                raw = {k: v for k, v in capture.files.items() if k != PROBE}
                answer = result(json.dumps({**facts, "raw": raw}) + "\n")
            fake.replies[(host.name, probe_command(host.python, dict(host.env)))] = answer
            fake.replies[(host.name, f"{shlex.quote(host.python)} -S -c ''")] = \
                answer if capture.error else OK
        return fake

    def lookup(self, name: str, command: str) -> CommandResult:
        """doctor --fix's planning lookup (a read-only command on a host, by its name)."""
        return self.run(name, command)

    def snapshot(self) -> dict[str, bytes | None]:
        """Every path under every host's HOME: a file's bytes, None for a folder."""
        out: dict[str, bytes | None] = {}
        for home in self.homes.values():
            for path in sorted(home.rglob("*")):
                out[str(path)] = None if path.is_dir() else path.read_bytes()
        return out

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeSsh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run_here(self, host: str, command: str, stdin: BinaryIO | None,
                  timeout: float | None) -> CommandResult:
        data = b""
        if stdin is not None and not self.stdin_cut_short:
            data = b"".join(iter(lambda: stdin.read(1 << 20), b""))
        env = {"HOME": str(self.homes[host]), "PATH": os.environ["PATH"]}
        done = subprocess.run(command, shell=True, env=env, input=data, capture_output=True,
                              timeout=timeout or LOCAL_TIMEOUT)
        return CommandResult(done.stdout.decode(), done.stderr.decode(), done.returncode, 0.0)


def run_hosts_by(monkeypatch, fake: FakeSsh) -> FakeSsh:
    """Every command any layer runs on a host goes to ``fake``: the one runner
    interface (mlxcluster/ssh/runner.py) put where each layer gets its runner, a job's
    rank hosts (jobs, smoke, launch, serve: ``jobs.hosts.host_runner``) and doctor's
    and its fixes' connections (``ssh.remote.open_runner``)."""
    from mlxcluster.jobs import hosts
    from mlxcluster.ssh import remote

    monkeypatch.setattr(hosts, "host_runner", lambda host, env=None: fake)
    monkeypatch.setattr(remote, "open_runner", lambda *a, **k: fake)
    return fake


class Clock:
    """A clock a test moves by hand (``clock.now += 30``): what a watch, a
    stall check or a status page reads instead of ``time.monotonic``."""

    def __init__(self, start: float = 100.0):
        self.now = start

    def __call__(self) -> float:
        return self.now
