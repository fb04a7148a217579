"""Runs one rank of a job so that the launcher can ask it for its Python stacks.

Standard library only: every rank imports it from the same PYTHONPATH as
``reference_train`` (``mlxcluster train`` puts that on every rank), before
anything else of the program is imported::

    python -X mlxcluster_run=RUN_ID -m mlxcluster.jobs.rank_wrapper -m reference_train.train ARGS
    python -X mlxcluster_run=RUN_ID -m mlxcluster.jobs.rank_wrapper path/to/script.py ARGS

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

File descriptors 1 and 2 become pipes read by a forked helper process that
writes each complete line to the original descriptor (a partial line waits
for its newline, or the end), so that what the rank writes, from Python or
from C, leaves as whole lines. With ``MLXCLUSTER_TAG_OUTPUT=1`` (``mlxcluster
run`` sets it) each line starts with ``[R] ``. stdout is made line buffered,
so lines leave as they are printed, as on a terminal. At exit the rank
closes its ends and waits (up to ``DRAIN_WAIT_S``) for the helper to write
the last lines, so that the launcher sees them before the rank ends.

``MLXCLUSTER_RANK_ENV`` carries the inventory's per-host ``env:`` (one
mapping per rank, in rank order; base64 JSON, so that no launcher's quoting
touches it): mlx.launch's ``--env`` and mpirun's ``-x`` give every rank one
environment, so the rank sets its own host's variables before the program
starts (``apply_rank_env``). The dynamic loader's variables are read before
that and may not differ between hosts (``mlxcluster.jobs.job``).

A program that fails (an uncaught exception, or ``sys.exit`` with a non-zero
code) ends its process at once with that code (1 for an exception), after
its traceback and output are written: ``os._exit``, skipping interpreter
shutdown. Measured here with Open MPI 5: a rank that called ``sys.exit(3)``
after ``mx.distributed.init`` waited in MPI's finalize until every other rank
ended on its own (120 s), so mpirun could not stop the job; exiting at once
lets mpirun (and mlx.launch) see the failure and stop the others. Atexit
handlers of a failed program do not run.

With ``MLXCLUSTER_LEASE_S=S`` (``mlxcluster train`` and ``run`` set it unless
``--detach``) the rank is watched for its controller: a process forked before
anything else (``watch_lease``) looks at the lease file in the stacks
directory (``lease``), which the machine running mlxcluster touches over
ssh every few seconds (mlxcluster.jobs.lease). When it has not been touched
for S seconds (the controller was killed, its Mac slept, its network went)
the watchdog writes why on stderr, sends the rank SIGUSR2 (the reference
trainer then stops every rank at the next step, after a last checkpoint;
another program ends, USR2's default), and SIGKILL after
``MLXCLUSTER_LEASE_GRACE_S`` more seconds if it is still there. It then
removes the run's stacks directory on its host, as the controller's sweep
would have. The watchdog ends with the rank (a pipe from the rank closes).

With ``MLXCLUSTER_DETACH=1`` (``--detach``) the rank goes on without the
machine that started it: the process the launcher started forks the rank
into a session of its own (``detach``), whose stdout and stderr are the files
``rank<R>.out`` and ``rank<R>.err`` in the stacks directory, and stays behind
as a relay: it copies each complete line of those files to its own stdout
or stderr (the launcher's, while there is one to take them) and ends with
the rank's exit code. A launcher that stops it, a hung-up terminal or an ssh
session cut off end the relay, not the rank. The rank writes its exit code
to ``rank<R>.exit`` when it ends (none: a signal ended it), so that
`mlxcluster attach` can follow it and say how it ended (jobs.attach).

Before it ends that way it writes one line on stderr, ``@@mlxcluster-exit
RANK CODE TIME`` (``TIME``: seconds since the epoch), through a pipe of its
own to the helper, so that it is a whole line even when another thread had
written half of one (MLX's C++ writes "[ring] Socket " and the rest in
separate writes; seen in CI running on behind it). The launcher hides
and reads it: when one rank fails, the others fail too a moment later
(their peer is gone), and mpirun then names only the rank whose abort it saw
(measured on the lab: "prterun has exited due to process rank 0 ...
calling abort" when rank 1 had exited 3). The earliest of these lines names
the rank that failed first, and its own code.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import faulthandler
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
import traceback
from typing import NamedTuple

RUN_MARK = "mlxcluster_run"  # as mlxcluster.jobs.cleanup.RUN_MARK (kept import-free here)
EXIT_MARK = "@@mlxcluster-exit"  # a failing rank's last line: EXIT_MARK RANK CODE TIME
STACKS_ROOT = "/tmp/mlxcluster-stacks"
RANK_VARS = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
TAG_VAR = "MLXCLUSTER_TAG_OUTPUT"
DRAIN_WAIT_S = 5.0
DRAIN_POLL_S = 0.005  # the drain's look at the helper: a rank's end waits at most this more
MAX_PARTIAL = 65536  # a "line" this long without a newline is passed on as it is
LEASE_VAR = "MLXCLUSTER_LEASE_S"  # seconds without a renewal before the rank is stopped
LEASE_GRACE_VAR = "MLXCLUSTER_LEASE_GRACE_S"  # after SIGUSR2, seconds before SIGKILL
LEASE_FILE = "lease"
DEFAULT_LEASE_GRACE_S = 60.0
STOP_SIGNAL = signal.SIGUSR2  # "checkpoint and stop": the reference trainer's handler
DETACH_VAR = "MLXCLUSTER_DETACH"
RELAY_POLL_S = 0.05  # how soon the relay passes on a line the rank wrote
RANK_ENV_VAR = "MLXCLUSTER_RANK_ENV"
USAGE = "usage: python -m mlxcluster.jobs.rank_wrapper (-m MODULE | SCRIPT) [ARGS...]"


def rank_of(environ) -> str:
    """This process's rank as the launcher set it, or 'pid<PID>' without one."""
    for var in RANK_VARS:
        value = environ.get(var, "")
        if value.isdigit():
            return value
    return f"pid{os.getpid()}"


def encode_rank_envs(envs: list[dict[str, str]]) -> str:
    """The value of RANK_ENV_VAR for ``envs`` (one mapping per rank, rank order)."""
    return base64.urlsafe_b64encode(json.dumps(envs).encode()).decode()


def apply_rank_env(environ, rank: str) -> dict[str, str]:
    """Set this rank's own variables from RANK_ENV_VAR (then removed, as a
    program's children need not see it); returns what was set."""
    raw = environ.pop(RANK_ENV_VAR, "")
    if not raw or not rank.isdigit():
        return {}
    envs = json.loads(base64.urlsafe_b64decode(raw.encode()))
    mine = envs[int(rank)] if int(rank) < len(envs) else {}
    environ.update(mine)
    return mine


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


class LineHelper(NamedTuple):
    """The forked helper that writes the rank's lines (``pass_lines``)."""

    pid: int
    exit_fd: int  # the exit line's own pipe: whole, whatever another thread left half-written


def pass_lines(prefix: bytes) -> LineHelper:
    """Make fds 1 and 2 pipes read by a forked helper that writes each
    complete line to the original descriptor, ``prefix`` before it (see the
    module docstring)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = [(fd, *os.pipe()) for fd in (1, 2, 2)]  # the last: the exit line's, onto stderr
    pid = os.fork()
    if pid == 0:  # the helper: no Python of the program runs here
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # drain what the rank writes as it stops
            signal.signal(STOP_SIGNAL, signal.SIG_IGN)
            for _, _, w in pipes:
                os.close(w)
            prefix_lines({r: fd for fd, r, _ in pipes}, prefix)
        except BaseException:  # noqa: BLE001 - nowhere left to report it
            code = 1
        finally:
            os._exit(code)
    for _, r, _ in pipes:
        os.close(r)
    (_, _, out_w), (_, _, err_w), (_, _, exit_w) = pipes
    for fd, w in ((1, out_w), (2, err_w)):
        os.dup2(w, fd)
        os.close(w)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    helper = LineHelper(pid, exit_w)
    atexit.register(drain, helper)
    return helper


def prefix_lines(sources: dict[int, int], prefix: bytes) -> None:
    """Copy each read fd to its write fd, ``prefix`` before every line, until
    every read fd is at its end."""
    partial = {r: b"" for r in sources}
    while partial:
        ready, _, _ = select.select(list(partial), [], [])
        for r in ready:
            data = os.read(r, 65536)
            out = sources[r]
            if not data:  # the end: the last partial line, then this source is done
                if partial[r]:
                    write_all(out, prefix + partial.pop(r) + b"\n")
                else:
                    partial.pop(r)
                os.close(r)
                continue
            *lines, rest = (partial[r] + data).split(b"\n")
            if len(rest) >= MAX_PARTIAL:
                lines.append(rest)
                rest = b""
            partial[r] = rest
            if lines:
                write_all(out, b"".join(prefix + line + b"\n" for line in lines))


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def drain(helper: LineHelper, wait_s: float = DRAIN_WAIT_S) -> None:
    """At exit: close this process's ends of the pipes and give the helper
    time to write the last lines (a child process still holding the pipes
    keeps it open: then stop waiting after ``wait_s``)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2, helper.exit_fd):  # dup2, not close: a second drain closes nothing else
        os.dup2(null, fd)
    os.close(null)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(helper.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(DRAIN_POLL_S)


def exit_code(done: SystemExit) -> int:
    """The process exit code ``sys.exit(value)`` asks for (a message: 1)."""
    if done.code is None:
        return 0
    if isinstance(done.code, int):
        return done.code
    return 1


def end_now(code: int, helper: LineHelper, rank: str, exit_file: str | None = None) -> None:
    """Flush, write the exit line (``EXIT_MARK``), let the helper write the
    last lines, and exit with ``code`` without interpreter shutdown (see the
    module docstring)."""
    status = code & 0xFF if code >= 0 else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        write_all(helper.exit_fd, f"{EXIT_MARK} {rank} {status} {time.time():.6f}\n".encode())
    except (OSError, ValueError):
        pass
    drain(helper)
    if exit_file:
        note_exit(exit_file, status)
    os._exit(status)


def lease_settings(environ) -> tuple[float, float] | None:
    """(lease seconds, grace seconds) when the rank is to watch its lease."""
    try:
        limit = float(environ.get(LEASE_VAR, "") or 0)
        grace = float(environ.get(LEASE_GRACE_VAR, "") or DEFAULT_LEASE_GRACE_S)
    except ValueError:
        return None
    return (limit, grace) if limit > 0 else None


def lease_expired(renewed: float | None, started: float, now: float, limit: float) -> bool:
    """Whether ``limit`` seconds went by since the lease was last renewed
    (its file's mtime), or since the watch started when it never was."""
    return now - max(renewed or 0.0, started) > limit


def watch_lease(rank_pid: int, lifeline: int, path: str, limit: float, grace: float,
                rank: str) -> None:
    """The watchdog's loop (in its own process): until the rank ends (EOF on
    ``lifeline``), stop it when the lease at ``path`` expires."""
    started = time.time()
    poll = min(1.0, max(limit / 10, 0.05))
    while True:
        ready, _, _ = select.select([lifeline], [], [], poll)
        if ready and not os.read(lifeline, 1):
            return  # the rank (and whatever it forked) ended: nothing to watch
        try:
            renewed: float | None = os.stat(path).st_mtime
        except OSError:
            renewed = None
        if lease_expired(renewed, started, time.time(), limit):
            break
    said = (f"mlxcluster: rank {rank} on {socket.gethostname()}: no word from the machine running "
            f"mlxcluster for {limit:.0f} s (its lease {path} was not renewed): it was killed, "
            f"slept or lost its network. Stopping this rank (a last checkpoint where the program "
            f"can, then SIGKILL after {grace:.0f} s)\n")
    try:
        os.write(2, said.encode())
    except OSError:
        pass
    try:
        os.kill(rank_pid, STOP_SIGNAL)
    except ProcessLookupError:
        return
    ready, _, _ = select.select([lifeline], [], [], grace)
    if not ready:
        try:
            os.kill(rank_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        select.select([lifeline], [], [], 5.0)
    remove_run_dir(os.path.dirname(path))


def remove_run_dir(directory: str) -> None:
    """The run's stacks directory on this host, as the controller's sweep
    removes it (nobody is left to sweep)."""
    try:
        for name in os.listdir(directory):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        os.rmdir(directory)
    except OSError:
        pass


def start_lease_watch(directory: str, rank: str, environ=os.environ) -> int | None:
    """Fork the lease watchdog (see the module docstring) when the launcher
    asked for one; its pid. Forked before the output tagging, so that it
    holds none of the tagging pipes."""
    settings = lease_settings(environ)
    if settings is None:
        return None
    limit, grace = settings
    os.makedirs(directory, exist_ok=True)
    rank_pid = os.getpid()
    lifeline_r, lifeline_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(lifeline_w)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the rank
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(STOP_SIGNAL, signal.SIG_IGN)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)  # only stderr, for the one line it may write
            watch_lease(rank_pid, lifeline_r, os.path.join(directory, LEASE_FILE), limit, grace, rank)
        except BaseException:  # noqa: BLE001 - nowhere left to report it
            code = 1
        finally:
            os._exit(code)
    os.close(lifeline_r)  # lifeline_w stays open as long as the rank lives (not inherited
    return pid            # by a program's subprocesses: os.pipe's fds are not inheritable)


def rank_files(directory: str, rank: str) -> tuple[str, str, str]:
    """A detached rank's stdout, stderr and exit-code files."""
    base = os.path.join(directory, f"rank{rank}")
    return f"{base}.out", f"{base}.err", f"{base}.exit"


def detach(directory: str, rank: str, program: list[str]) -> None:
    """Fork the rank into a session of its own, its output into its files;
    returns in the rank. This process becomes its relay (``relay``) and never
    returns. ``rank<R>.argv`` keeps ``program`` (JSON), for attach."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank{rank}.argv"), "w") as f:
        f.write(json.dumps(program) + "\n")
    out, err, done = rank_files(directory, rank)
    for path in (out, err):
        open(path, "wb").close()  # noqa: SIM115 - emptied: a relaunch starts them again
    with contextlib.suppress(FileNotFoundError):
        os.unlink(done)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # no terminal, no launcher's process group: nothing hangs it up
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, out), (2, err)):
            file_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.dup2(file_fd, fd)
            os.close(file_fd)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        atexit.register(note_exit, done, 0)
        return
    os._exit(relay(pid, out, err))


def note_exit(path: str, code: int) -> None:
    """The rank's exit code, for `mlxcluster attach` (written atomically)."""
    try:
        with open(f"{path}.tmp", "w") as f:
            f.write(f"{code}\n")
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass


def relay(rank_pid: int, out: str, err: str) -> int:
    """Copy the detached rank's complete lines to this process's stdout and
    stderr until it ends (a write that fails, the launcher gone, stops the
    copying, not the waiting); the rank's exit code, as a shell gives it."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sources = [(open(out, "rb"), 1, [b""]), (open(err, "rb"), 2, [b""])]  # noqa: SIM115
    writing = True
    status = None
    while True:
        if status is None:
            done, status_now = os.waitpid(rank_pid, os.WNOHANG)
            if done:
                status = status_now
        for f, fd, rest in sources:
            data = f.read()
            if not data:
                continue
            *lines, rest[0] = (rest[0] + data).split(b"\n")
            if lines and writing:
                try:
                    write_all(fd, b"".join(line + b"\n" for line in lines))
                except OSError:
                    writing = False
        if status is not None:
            break
        time.sleep(RELAY_POLL_S)
    for f, fd, rest in sources:
        if rest[0] and writing:
            with contextlib.suppress(OSError):
                write_all(fd, rest[0] + b"\n")
        f.close()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


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


def drop_blank_hostfile(environ=os.environ) -> None:
    """Unset ``MLX_HOSTFILE`` when the file it names is blank: mlx.launch's
    ring launch of ONE host writes a file holding only a newline (mlx 0.32.4,
    _distributed_utils/launch.py: ``json.dumps(ring_hosts) if len(ring_hosts)
    > 1 else ""``), which ``mx.distributed.init()`` then fails to parse
    ("[json.exception.parse_error.101] ... unexpected end of input"). Without
    it, init() gives the program its group of one. reference_train's
    init_group does the same for the trainer."""
    path = environ.get("MLX_HOSTFILE")
    try:
        blank = bool(path) and not open(path).read().strip()
    except OSError:
        return
    if blank:
        del environ["MLX_HOSTFILE"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit(USAGE)
    drop_blank_hostfile()
    run_id = getattr(sys, "_xoptions", {}).get(RUN_MARK)
    run_id = run_id if isinstance(run_id, str) else None
    rank = rank_of(os.environ)
    apply_rank_env(os.environ, rank)
    directory = stacks_dir(os.environ, run_id)
    exit_file = None
    if os.environ.get(DETACH_VAR) == "1":
        detach(directory, rank, args)  # from here on: the rank, in its own session
        exit_file = rank_files(directory, rank)[2]
    try:
        start_lease_watch(directory, rank)
    except OSError as err:  # the job runs unwatched, said
        print(f"mlxcluster rank_wrapper: no lease watch ({err})", file=sys.stderr, flush=True)
    helper = pass_lines(f"[{rank}] ".encode() if os.environ.get(TAG_VAR) == "1" else b"")
    try:
        install(directory, rank)
    except OSError as err:  # no stacks on demand, but the job itself still runs
        print(f"mlxcluster rank_wrapper: no stack dumps ({err})", file=sys.stderr, flush=True)
    try:
        run_program(args)
    except SystemExit as done:
        code = exit_code(done)
        if code == 0:
            raise
        if not isinstance(done.code, int) and done.code is not None:
            print(done.code, file=sys.stderr)  # as Python prints sys.exit("message")
        end_now(code, helper, rank, exit_file)
    except Exception:  # noqa: BLE001 - shown as Python shows it, then the rank ends at once
        traceback.print_exc()
        end_now(1, helper, rank, exit_file)


if __name__ == "__main__":
    main()
