"""Ctrl-C, SIGTERM and SIGHUP: stop the run everywhere, then exit.

Launchers (``mlx.launch``, ``mpirun``) and the commands ``demo`` runs are
started in their own session, so that a run can be stopped as one process
group; a terminal's Ctrl-C therefore reaches only mlxcluster, and stopping the
ranks on every host is our job. The CLI makes SIGTERM (``kill``, a CI job's
timeout) and SIGHUP (the terminal closed) raise the same exception as
Ctrl-C, a ``KeyboardInterrupt`` (``Stop``, which knows its signal). Library
code that starts processes catches it, stops and cleans up its run with
further signals ``deferred`` (a second Ctrl-C must not cut the cleanup
short), then raises ``errors.Interrupted``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stop(KeyboardInterrupt):
    """A handled signal arrived (raised in the main thread by the handler)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signum_of(exc: BaseException) -> int:
    """The signal behind an interrupt (a bare KeyboardInterrupt is Ctrl-C)."""
    return getattr(exc, "signum", signal.SIGINT)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _raise_stop(signum, _frame) -> None:
    raise Stop(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise ``Stop`` in the main thread.
    (Signal handlers can only be set there; elsewhere this does nothing.)"""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_stop) for s in HANDLED}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[list[int]]:
    """Within: the handled signals are recorded, not raised, so that cleanup
    runs to its end (it is bounded by its own timeouts); yields the list of
    signals that arrived meanwhile."""
    arrived: list[int] = []
    if not _in_main_thread():
        yield arrived
        return
    previous = {s: signal.signal(s, lambda signum, _f: arrived.append(signum)) for s in HANDLED}
    try:
        yield arrived
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def first_signal_calls(then: Callable[[int], None]) -> Iterator[Callable[[int], None]]:
    """Within: the first handled signal calls ``then(signum)`` (in the main
    thread: it must return soon) instead of raising; a later one raises
    ``Stop`` as usual (a second Ctrl-C stops at once). Yields ``stop_now``:
    from any thread, raise ``Stop(signum)`` in the main thread (by sending
    the signal again), while within. (Elsewhere than the main thread: as
    ``signals_raise``, and ``stop_now`` does nothing.)"""
    if not _in_main_thread():
        yield lambda signum: None
        return
    first, active = [True], [True]
    lock = threading.Lock()

    def handle(signum, _frame) -> None:
        if first[0]:
            first[0] = False
            then(signum)
            return
        raise Stop(signum)

    def stop_now(signum: int) -> None:
        with lock:
            if active[0]:
                os.kill(os.getpid(), signum)

    previous = {s: signal.signal(s, handle) for s in HANDLED}
    try:
        yield stop_now
    finally:
        with lock:
            active[0] = False
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_process(proc: subprocess.Popen, signum: int, grace_s: float, *, group: bool) -> None:
    """Ask ``proc`` to stop with ``signum`` (sent to its whole process group
    when ``group``, as a terminal does; else to it alone, so that it stops its
    own children its way), wait up to ``grace_s``, then SIGKILL its process
    group. A process that has just ended is no error."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
