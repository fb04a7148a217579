"""How a transfer reaches a host: one shell command run there, with bytes
sent to its stdin or read from its stdout, every call bounded in time.

Two kinds of link, one interface (``run``):

- ``ProcessLink``: a program run here. For a remote host it is OpenSSH with
  ``BatchMode=yes`` (never a password or host-key prompt),
  ``StrictHostKeyChecking=yes`` (an unknown or changed host key fails) and a
  connect timeout (``ssh/openssh.py``), as mlx.launch reaches the ranks; for
  this machine, bash. rsync's ``-e`` is the same ssh with the same options
  (``ssh``). The jobs layer makes one per rank host (``jobs.hosts.host_link``)
  over the host's runner (``ssh/runner.py``): its plain commands go through
  the runner, the streamed ones through the runner's argv here, watched.
- ``RunnerLink``: the doctor's open connections (``ssh/remote.py``'s runner:
  keys only, host keys checked, every command with a timeout), so that the
  wheels a fix sends go the way its install command goes.

Commands are shell words already quoted (``shlex``) by the caller.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, TypeVar

from mlxcluster.errors import MlxclusterError
from mlxcluster.ssh.results import CommandResult, SshError
from mlxcluster.ssh.runner import SSH_FAILED, StreamingRunner

STALL_S = 60.0  # a transfer that moves no byte for this long is given up
CHUNK = 1 << 20

T = TypeVar("T")


class TransferError(MlxclusterError):
    """A host's copy could not be checked, sent or read."""


class HostUnreachable(TransferError):
    """ssh could not reach the host: exit 255, as the launchers' own ssh failure."""

    exit_code = SSH_FAILED


class NoAnswer(TransferError):
    """A command on the host did not end within its timeout."""


class Link(Protocol):
    """A host as a transfer reaches it."""

    name: str  # for messages
    python: str  # what runs the agent there

    def run(self, command: str, *, timeout: float, stdin: BinaryIO | None = None) -> CommandResult:
        """``command`` there, ``stdin`` (read to its end) on its input; raises
        NoAnswer when it does not end in time."""


@dataclass(frozen=True, eq=False)
class ProcessLink:
    """A host reached by a program run here (ssh, or bash for this machine):
    its runner runs the plain commands and gives the argv the streams run by."""

    name: str  # the host, as its runner names it
    python: str
    runner: StreamingRunner
    target: str = ""  # user@host, for rsync

    def argv(self, command: str) -> list[str]:
        """The argv that runs a shell command there, as a process here."""
        return self.runner.argv_for(self.name, command)

    @property
    def ssh(self) -> tuple[str, ...]:
        """ssh and its options, no target (rsync's -e); () for this machine."""
        return self.runner.rsh

    @property
    def env(self) -> dict[str, str] | None:
        return self.runner.env

    def run(self, command: str, *, timeout: float, stdin: BinaryIO | None = None) -> CommandResult:
        """Without ``stdin``: ends within ``timeout``, through the host's
        runner. With it (streamed here, watched): given up when the host takes
        no byte for ``STALL_S``, or does not end ``timeout`` after the last one."""
        if stdin is None:
            try:
                return self.runner.run(self.name, command, timeout=timeout)
            except SshError as exc:
                if exc.kind == "command-timeout":
                    raise NoAnswer(f"{self.name} did not answer within {timeout:.0f} s") from None
                raise TransferError(f"{self.name}: {exc}") from None
        started = time.monotonic()
        out, err, status = self._feed(command, stdin, timeout)
        return CommandResult(out.decode(errors="replace"), err.decode(errors="replace"), status,
                             time.monotonic() - started)

    def _feed(self, command: str, stdin: BinaryIO, timeout: float) -> tuple[bytes, bytes, int]:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = self._start(command, stdin=subprocess.PIPE, stdout=out, stderr=err)
            with Watchdog(proc, STALL_S, timeout) as watchdog:
                try:
                    for chunk in iter(lambda: stdin.read(CHUNK), b""):
                        proc.stdin.write(chunk)
                        watchdog.moved()
                    proc.stdin.close()
                except BrokenPipeError:
                    _close_quietly(proc.stdin)  # the host stopped reading: its own message says why
                watchdog.flowing = False
                proc.wait()  # the host verifies and renames: the watchdog bounds it
            out.seek(0)
            err.seek(0)
            return out.read(), (watchdog.why.encode() or err.read()), proc.returncode

    def _start(self, command: str, **streams) -> subprocess.Popen:
        try:
            return subprocess.Popen(self.argv(command), env=self.env, **streams)
        except OSError as exc:  # no ssh here
            raise TransferError(f"{self.name}: {exc}") from None

    def read(self, command: str, consume: Callable[[BinaryIO], T], *,
             timeout: float) -> tuple[CommandResult, T]:
        """``command`` there, its stdout handed to ``consume`` as it arrives
        (given up when no byte comes for ``timeout``); what ``consume`` returned.
        The result's stdout is empty: ``consume`` had it."""
        started = time.monotonic()
        with tempfile.TemporaryFile() as err:
            proc = self._start(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            with Watchdog(proc, timeout, 0.0) as watchdog:
                try:
                    value = consume(Watched(proc.stdout, watchdog.moved))
                finally:
                    proc.stdout.close()  # a host still writing stops (a broken pipe)
                watchdog.flowing = False
                proc.wait()
            err.seek(0)
            said = watchdog.why or err.read().decode(errors="replace")
        return CommandResult("", said, proc.returncode, time.monotonic() - started), value


@dataclass(frozen=True, eq=False)
class RunnerLink:
    """A host over the doctor's runner (``run(alias, command, user=, port=,
    timeout=, stdin=)``): its connection, its host-key policy, its timeouts."""

    name: str  # the runner's alias: the inventory's ssh target
    python: str
    runner: Any
    user: str | None = None
    port: int | None = None

    def run(self, command: str, *, timeout: float, stdin: BinaryIO | None = None) -> CommandResult:
        return self.runner.run(self.name, command, user=self.user, port=self.port,
                               timeout=timeout, stdin=stdin)


def _close_quietly(stream: BinaryIO) -> None:
    try:
        stream.close()
    except BrokenPipeError:
        pass  # what was still buffered has nowhere to go


class Watched:
    """A binary stream whose every read tells ``moved`` (the watchdog)."""

    def __init__(self, stream: BinaryIO, moved: Callable[[], None]):
        self.stream, self.moved = stream, moved

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.moved()
        return data

    def readline(self) -> bytes:
        line = self.stream.readline()
        self.moved()
        return line


class Watchdog:
    """Kills a transfer that moves no byte for ``idle_s`` while bytes flow
    (``flowing``), or that has not ended ``idle_s + end_s`` after the last one."""

    def __init__(self, proc: subprocess.Popen, idle_s: float, end_s: float, flowing: bool = True):
        self.proc, self.idle_s, self.end_s = proc, idle_s, end_s
        self.last, self.why, self.flowing = time.monotonic(), "", flowing
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def moved(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            idle = time.monotonic() - self.last
            if idle > self.idle_s + (0.0 if self.flowing else self.end_s):
                self.why = f"no progress for {idle:.0f} s: stopped"
                self.proc.kill()
                return

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
