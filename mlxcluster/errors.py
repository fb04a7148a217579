"""The exception hierarchy. Library code raises these; the CLI converts them
once, at the boundary, into a message, a fix hint and an exit code.

Exit codes (documented in README.md):
  0  success
  1  a check or run failed (doctor found a failing check, a smoke rank failed)
  2  usage or input error (bad flags, inventory, hostfile; a program a flag
     needs is not installed here: topology --png without graphviz)
  3  backend unavailable on this cluster (jaccl without TB5/RDMA, nccl without CUDA)
  4  stalled: a job made no progress for its stall timeout (smoke: a rank within its
     phase's or soak iteration's deadline); it was diagnosed and stopped
  128 + signal  interrupted (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), after cleanup;
     143 also: `train`, `run` or `serve` whose ranks `mlxcluster stop` ended (the trainer
     after a last checkpoint): not launched again, whatever --max-restarts says
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_STALLED = 4
EXIT_STOPPED_WHEN_ASKED = 143  # as a process ended by SIGTERM (reference_train/stopping.py)


class MlxclusterError(Exception):
    """Base error: a message naming the problem and a hint naming the fix."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(MlxclusterError):
    """Bad user input: flags, inventory, hostfile, capture directory."""

    exit_code = EXIT_USAGE


class InventoryError(InputError):
    """An inventory failed to load; ``problems`` holds every problem found."""

    def __init__(self, path: str, problems: list[str], hint: str | None = None):
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"inventory {path} is invalid ({len(self.problems)} problem(s)):\n{lines}",
            hint or "fix the lines above; inventory/example.yaml documents every field",
        )


class HostfileError(InputError):
    """A hostfile is malformed or does not match the cluster."""


class ToolMissing(InputError):
    """A program an option needs is not installed on this machine (graphviz's
    ``dot`` for ``topology --png``): the user's choice, not the cluster's
    backend (exit 3), so exit 2 with what to install or use instead."""


class RemoteError(MlxclusterError):
    """A remote command could not run (connect, auth, timeout)."""


class BackendUnavailable(MlxclusterError):
    """The requested backend cannot run on this cluster (the reason says why)."""

    exit_code = EXIT_UNAVAILABLE


class Interrupted(KeyboardInterrupt):
    """The run was stopped by Ctrl-C, SIGTERM or SIGHUP, after it was cleaned up.

    A KeyboardInterrupt, not an MlxclusterError, so that no ``except
    MlxclusterError`` (a failed preflight, a host's error) can swallow it on
    its way to the CLI, which exits with 128 + the signal number (130 for
    Ctrl-C), as a shell reports a command killed by that signal.
    """

    def __init__(self, signum: int, message: str, hint: str | None = None):
        super().__init__(message)
        self.signum = signum
        self.partial = None  # what was done before the signal (a soak's summary), for the CLI
        self.message = message
        self.hint = hint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
