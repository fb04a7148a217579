"""Runs mlx.launch with its output loops waiting for output instead of spinning.

mlx.launch (mlx 0.32) reads each rank's output in a thread that calls
``select(outputs, [the rank's stdin pipe], [], 1.0)``: a pipe nobody
writes to is always writable, so that select returns at once and the
thread loops without rest for the whole job; its main loop does the same on
its own stdin when that is /dev/null (always readable, at its end).
Measured here (bench/launcher_cpu.py, docs/performance-runs.md, "mlx.launch's
busy loop"): 0.84 of a core for the whole job; 2 ranks on this 2-core
machine took 186 ms a step beside it and 90 ms through this shim (the same
as ranks started by hand). The jobs layer uses it when every rank runs on
this machine (``process.launcher_argv``): with the ranks on other hosts
(the lab's 3) the steps were 8% slower without the loop, so there the
plain launcher runs.

mlxcluster gives the launcher no input for the ranks (its stdin is closed),
so nothing is ever written to a rank's stdin. This runs the same mlx.launch
(its ``main``, the same arguments) with ``select`` in its module replaced by
``patient_select``: writability is not asked for, and no wait is longer
than ``WAKE_S``, so a rank's end is still seen within that time (the
launcher's own wait was 1 s); its stdin becomes a pipe that never has
data. Where the installed mlx is not laid out as expected (another
version), the mlx.launch script runs unchanged.

Standard library only, and run as ``python -c SOURCE MLX_LAUNCH ARGS...``
with the python of the mlx.launch script (``command``): that python needs
nothing of mlxcluster.
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

WAKE_S = 0.05  # longest wait of a patched select: how late a rank's end may be seen
MODULE = "mlx._distributed_utils.launch"


def patient_select(rlist, wlist, xlist, timeout=None):
    """``select.select`` for mlx.launch's loops: waits for readable (and
    exceptional) fds only, at most ``WAKE_S``; never reports a writable one."""
    limit = WAKE_S if timeout is None else min(timeout, WAKE_S)
    readable, _, exceptional = select.select(rlist, [], xlist, limit)
    return readable, [], exceptional


def patchable(module) -> bool:
    """Whether ``module`` is the mlx.launch this was written for: its loops
    call the module's ``select``, which is ``select.select``."""
    return (getattr(module, "select", None) is select.select
            and callable(getattr(module, "_launch_with_io", None))
            and callable(getattr(module, "main", None)))


def stdin_without_data() -> None:
    """Make fd 0 a pipe whose writing end this process keeps open and never
    writes: a select on it waits instead of seeing the end of /dev/null."""
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)
    os.set_inheritable(write_end, False)  # the ranks' processes do not hold it


def main(argv: list[str]) -> int:
    """``argv``: the mlx.launch script, then its arguments."""
    script, args = argv[0], argv[1:]
    try:
        import importlib

        launch = importlib.import_module(MODULE)
    except ImportError:
        launch = None
    if launch is None or not patchable(launch):
        os.execv(script, [script, *args])
    launch.select = patient_select
    stdin_without_data()
    sys.argv = [script, *args]
    return launch.main()


def command(mlx_launch: str, args: list[str]) -> list[str]:
    """The argv that runs ``mlx_launch ARGS`` this way, with the python of
    its ``#!`` line; the plain script when that line names no python."""
    try:
        with open(mlx_launch, "rb") as f:
            first = f.readline(4096).decode(errors="replace").strip()
    except OSError:
        return [mlx_launch, *args]
    python = first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() else ""
    if not python or "python" not in Path(python).name or not os.access(python, os.X_OK):
        return [mlx_launch, *args]
    return [python, "-c", Path(__file__).read_text(), mlx_launch, *args]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
