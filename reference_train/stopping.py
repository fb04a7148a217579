"""Stopping when asked: every rank at the same step, after a last checkpoint.

A rank is asked to stop with SIGUSR2: by mlxcluster's lease watchdog when
the machine running mlxcluster has gone (closed lid, killed terminal, lost
network: mlxcluster.jobs.lease), or by `mlxcluster stop RUN_ID`. The
handler only notes it. Each rank may be asked at a slightly different
moment, and a checkpoint must be written by every rank at one step (the
sharded optimizer gathers its state collectively, and the hosts' copies must
agree), so the ranks exchange their notes at each logged step (one all_sum of
one number, beside the loss's) and, when any was asked, all checkpoint that
step and stop. Stopping at a logged step keeps a resumed run's logged losses
equal to an uninterrupted run's (the loss logged is the mean over the steps
since the last log).

On only when mlxcluster asks for it (``STOP_ENV``): under a plain
`mlx.launch` or `mpirun` SIGUSR2 keeps its default (the process ends).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

import mlx.core as mx

from .collectives import all_sum, barrier
from .metrics import STOP_ENV

STOP_SIGNAL = signal.SIGUSR2  # as mlxcluster.jobs.rank_wrapper.STOP_SIGNAL
STOPPED_EXIT = 143  # as a process ended by SIGTERM: asked to stop


class Stopped(Exception):
    """Every rank stopped at ``step`` when asked, after its checkpoint."""

    def __init__(self, step: int):
        super().__init__(f"stopped at step {step} when asked (SIGUSR2: mlxcluster's lease ran "
                         "out or `mlxcluster stop`); its checkpoint is written: go on with "
                         "--resume auto")
        self.step = step


LAST_WORDS_S = 5.0  # how long a stopped rank waits for room for its last lines


def last_words(lines: list[str], seconds: float = LAST_WORDS_S, fd: int = 1) -> bool:
    """Write ``lines`` to ``fd`` (stdout), waiting at most ``seconds`` in all for
    room; whether all of it went. A rank asked to stop because its controller
    is cut off writes into an ssh session that no longer delivers, and a
    blocked write would keep it from ending (seen on the lab: the rank wrote
    its checkpoint, then waited on its last line until the watchdog's
    SIGKILL); a write that found no room at once and gave up lost the line
    when the controller was there but slow to read (seen in CI at load: the
    run's "stopped at step" line missing). stdout is line-buffered
    (mlxcluster's rank wrapper; a terminal): nothing of it waits in Python."""
    data = "".join(f"{line}\n" for line in lines).encode()
    deadline = time.monotonic() + seconds
    try:
        os.set_blocking(fd, False)
    except OSError:
        return False
    if fd == 1:  # what Python still holds goes first (dropped, not waited for, if no room)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [fd], [], left)
        except OSError:
            return False
    return True


def part_together(group) -> None:
    """The ranks' last collective when they stop: no rank ends before every
    rank's checkpoint is written and rank 0's last lines are on their way. The
    first rank to end (143) makes mlx.launch end the others: it kills their
    ssh clients here, and whatever a rank had not yet sent is lost (seen in CI:
    labhost2 left without its checkpoint; at load, rank 0's "stopped at step"
    lines missing, when they were written after this point)."""
    if group.size() > 1:
        barrier(group)


class StopRequest:
    """SIGUSR2 noted, and the ranks' agreement on it."""

    def __init__(self, group, enabled: bool | None = None):
        self.group = group
        self.enabled = os.environ.get(STOP_ENV, "") == "1" if enabled is None else enabled
        self.asked = False
        if self.enabled:
            signal.signal(STOP_SIGNAL, self._note)

    def _note(self, signum, frame) -> None:
        self.asked = True

    def agreed(self) -> bool:
        """Whether any rank was asked to stop; collective when enabled (every
        rank calls it at the same steps)."""
        if not self.enabled:
            return False
        if self.group.size() == 1:
            stopping = self.asked
        else:
            asked = all_sum(mx.array(int(self.asked)), self.group)
            stopping = asked.item() > 0
        if stopping:
            outlive_the_launchers_term()
        return stopping


def outlive_the_launchers_term() -> None:
    """Ignore SIGTERM from here to the end: every rank now writes its last
    checkpoint and ends with STOPPED_EXIT, and the first to end makes the
    launcher (mlx.launch, mpirun) SIGTERM the others as it does a failed
    rank's peers. Seen on the lab, one run in several: rank 0, still writing
    its last line, was killed (its ssh ended 255) and "stopped at step" never
    arrived. What is left to do is short; `mlxcluster stop` and the lease's
    watchdog still end a rank that does not, with SIGKILL."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
