"""Runs one rank of a job so that the launcher can ask it for its Python stacks.

Standard library only: every rank imports it from the same PYTHONPATH as
``reference_train`` (``mlxcluster train`` puts that on every rank), before
anything else of the program is imported::

    python -X mlxcluster_run=RUN_ID -m mlxcluster.rank_wrapper -m reference_train.train ARGS
    python -X mlxcluster_run=RUN_ID -m mlxcluster.rank_wrapper path/to/script.py ARGS

It writes two files into the rank's stacks directory on its host
(``$MLXCLUSTER_STACKS_DIR``, else ``/tmp/mlxcluster-stacks/RUN_ID``):

- ``rank<R>.pid``: ``<pid> <hostname>``, so that the launcher finds which
  process is which rank (every rank has the same command line);
- ``rank<R>.stacks``: appended to by ``faulthandler`` on SIGUSR1 with the
  stack of every thread (``kill -USR1 PID``, no sudo, Linux and macOS). The
  dump is written from the C signal handler, so it works while the main
  thread waits inside a collective in C code; a stopped process (SIGSTOP,
  state T) writes it only once continued.

Then it runs the program unchanged (``runpy``, as ``python -m`` / ``python
script.py`` would: ``__main__``, ``sys.argv``, ``sys.path[0]``). R is the
launcher's rank (MLX_RANK for mlx.launch, OMPI_COMM_WORLD_RANK / PMIX_RANK
for mpirun).
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import socket
import sys

RUN_MARK = "mlxcluster_run"  # as train_cleanup.RUN_MARK (kept import-free here)
STACKS_ROOT = "/tmp/mlxcluster-stacks"
RANK_VARS = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
USAGE = "usage: python -m mlxcluster.rank_wrapper (-m MODULE | SCRIPT) [ARGS...]"


def rank_of(environ) -> str:
    """This process's rank as the launcher set it, or 'pid<PID>' without one."""
    for var in RANK_VARS:
        value = environ.get(var, "")
        if value.isdigit():
            return value
    return f"pid{os.getpid()}"


def stacks_dir(environ, run_id: str | None) -> str:
    return environ.get("MLXCLUSTER_STACKS_DIR") or os.path.join(STACKS_ROOT, run_id or "no-run-id")


def install(directory: str, rank: str):
    """Write the pid file, register the SIGUSR1 dump; returns the open dump file
    (it must stay open for faulthandler)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank{rank}.pid"), "w") as f:
        f.write(f"{os.getpid()} {socket.gethostname()}\n")
    dump = open(os.path.join(directory, f"rank{rank}.stacks"), "a")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    return dump


def run_program(args: list[str]) -> None:
    """``python -m MODULE ARGS`` or ``python SCRIPT ARGS``, in this process."""
    if args[0] == "-m":
        if len(args) < 2:
            raise SystemExit(USAGE)
        module, rest = args[1], args[2:]
        sys.argv = [module, *rest]  # runpy sets argv[0] to the module's file
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, rest = args[0], args[1:]
    sys.argv = [script, *rest]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit(USAGE)
    run_id = getattr(sys, "_xoptions", {}).get(RUN_MARK)
    run_id = run_id if isinstance(run_id, str) else None
    try:
        install(stacks_dir(os.environ, run_id), rank_of(os.environ))
    except OSError as err:  # no stacks on demand, but the job itself still runs
        print(f"mlxcluster rank_wrapper: no stack dumps ({err})", file=sys.stderr, flush=True)
    run_program(args)


if __name__ == "__main__":
    main()
